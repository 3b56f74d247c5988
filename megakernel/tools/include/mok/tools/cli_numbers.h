// The tools' command-line numbers, parsed whole: atoi would read "2x" as 2, "x" as 0 and 2^31 as -2^31.
#pragma once

#include <cstdlib>

namespace mok::tools {

// A whole decimal integer in [-10^9, 10^9] (no trailing text).
inline bool parse_int(const char* text, int& out) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end || v < -1000000000L || v > 1000000000L) return false;
  out = int(v);
  return true;
}

// A whole number strtod reads (no trailing text).
inline bool parse_double(const char* text, double& out) {
  char* end = nullptr;
  out = std::strtod(text, &end);
  return end != text && !*end;
}

}  // namespace mok::tools
