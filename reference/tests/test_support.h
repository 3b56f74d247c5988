// Helpers shared by the reference's tests: bitwise comparison that names the first mismatch, and
// the small problem shapes the tests run.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "mok/core/bf16.h"
#include "mok/core/config.h"

namespace mok::ref::test {

inline uint32_t raw_bits(float v) { return bits_of(v); }
inline uint32_t raw_bits(bf16 v) { return v.bits; }
inline uint32_t raw_bits(int32_t v) { return uint32_t(v); }

inline bool is_zero(float v) { return v == 0.0f; }
inline bool is_zero(bf16 v) { return (v.bits & 0x7fffu) == 0; }
inline bool is_zero(int32_t v) { return v == 0; }

// "0x3f800000 (0x1p+0)": the bits and the value as a hex float.
inline std::string describe(float v) {
  char s[64];
  std::snprintf(s, sizeof s, "0x%08x (%a)", raw_bits(v), double(v));
  return s;
}
inline std::string describe(bf16 v) {
  char s[64];
  std::snprintf(s, sizeof s, "0x%04x (%a)", v.bits, double(to_float(v)));
  return s;
}
inline std::string describe(int32_t v) { return std::to_string(v); }

// Use as EXPECT_PRED_FORMAT2(same_bits, a, b). Fails on the first element whose bits differ, and
// on an empty or all-zero tensor (agreement on zeros proves nothing).
template <class T>
::testing::AssertionResult same_bits(const char* a_name, const char* b_name, const std::vector<T>& a,
                                     const std::vector<T>& b) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << a_name << " has " << a.size() << " elements, " << b_name << " has "
                                         << b.size();
  bool any_nonzero = false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (raw_bits(a[i]) != raw_bits(b[i]))
      return ::testing::AssertionFailure() << "first mismatch at element " << i << " of " << a.size() << ": " << a_name
                                           << " = " << describe(a[i]) << ", " << b_name << " = " << describe(b[i]);
    any_nonzero = any_nonzero || !is_zero(a[i]);
  }
  if (!any_nonzero) return ::testing::AssertionFailure() << a_name << " is empty or all zeros: nothing was compared";
  return ::testing::AssertionSuccess();
}

}  // namespace mok::ref::test
