// The tools' command-line options and numbers; numbers parsed whole and strictly (mok::parse_whole_number: decimal, no
// sign on unsigned types, no '+', no spaces, no trailing text, in range): atoi read "2x" as 2, "x" as 0 and 2^31 as
// -2^31; strtol took " +5" as 5, strtod "0x10" as 16, strtoull "010" as 8.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>

#include "mok/core/config.h"

namespace mok::tools {

// A whole decimal integer in [-10^9, 10^9].
inline bool parse_int(const char* text, int& out) {
  int v = 0;
  if (!parse_whole_number(text, v) || v < -1000000000 || v > 1000000000) return false;
  out = v;
  return true;
}

// A decimal number (or inf or nan, which the tools' own checks name), in a double's range and not
// subnormal: 1e-400 underflowed to 0 (mok-bench's --capacity-factor 0: the most rows, the largest plan),
// 1e999 overflowed to inf.
inline bool parse_double(const char* text, double& out) {
  double v = 0.0;
  if (!parse_whole_number(text, v) || (std::isfinite(v) && v != 0.0 && !std::isnormal(v))) return false;
  out = v;
  return true;
}

// A whole unsigned 64-bit decimal integer.
inline bool parse_uint64(const char* text, uint64_t& out) { return parse_whole_number(text, out); }

// One command line's options as a tool reads them: each at most once (a second value silently won), and
// the reason an option is refused said on stderr, naming it, before the caller's usage line.
class OptionReader {
 public:
  explicit OptionReader(const char* tool) : tool_(tool) {}
  // False, saying so, when `option` was given before.
  bool first(const std::string& option) {
    if (seen_.insert(option).second) return true;
    return refuse(option + " is given twice");
  }
  // False, saying why: an unknown option, one without its value, or a value it cannot take.
  bool unknown(const std::string& option) { return refuse("unknown option " + quote_input(option)); }
  bool missing_value(const std::string& option) {
    return refuse("no value follows " + quote_input(option) + " (or it is no option of " + tool_ + ")");
  }
  bool bad_value(const std::string& option, const char* value) {
    return refuse(option + " cannot take " + quote_input(value) + " (a decimal number within range)");
  }
  bool given(const std::string& option) const { return seen_.count(option) > 0; }
  // False, saying why on stderr.
  bool refuse(const std::string& why) const {
    std::fprintf(stderr, "%s: %s\n", tool_, why.c_str());
    return false;
  }

 private:
  const char* tool_;
  std::set<std::string> seen_;
};

}  // namespace mok::tools
