// The tools' command-line numbers, parsed whole: atoi would read "2x" as 2, "x" as 0 and 2^31 as -2^31.
#pragma once

#include <cctype>
#include <cerrno>
#include <cstdint>
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

// A whole number strtod reads (no trailing text), within the range of a double: 1e-400 underflowed to 0
// (mok-bench's --capacity-factor 0: the most rows, the largest plan), 1e999 overflowed to inf.
inline bool parse_double(const char* text, double& out) {
  char* end = nullptr;
  errno = 0;
  out = std::strtod(text, &end);
  return end != text && !*end && errno != ERANGE;
}

// A whole unsigned 64-bit integer as strtoull's base 0 reads it: decimal, 0x hexadecimal or 0 octal (no
// sign: it read "-1" as 2^64 - 1; no trailing text; in range).
inline bool parse_uint64(const char* text, uint64_t& out) {
  if (!std::isdigit(static_cast<unsigned char>(text[0]))) return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 0);
  if (*end || errno == ERANGE) return false;
  out = v;
  return true;
}

}  // namespace mok::tools
