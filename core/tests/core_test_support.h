// Helpers for the tests of core, which need nothing above it: a seeded generator of test data, the
// message of a thrown mok::Error and the check that a call is refused by its rule. Tests of the modules
// above core use them too (their CMake adds this folder to the include path).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "mok/core/bf16.h"
#include "mok/core/config.h"

namespace mok::test {

// Test data from a seed. std::mt19937_64's output is fixed by the standard (its distributions are
// not), so the values below are computed here and a seed means the same data with every library.
class TestRng {
 public:
  explicit TestRng(uint64_t seed) : engine_(seed) {}
  uint64_t next() { return engine_(); }
  int below(int n) { return int(unit() * n); }                          // [0, n)
  float symmetric(float a) { return float((2.0 * unit() - 1.0) * a); }  // [-a, a)

 private:
  double unit() { return double(engine_() >> 11) * 0x1.0p-53; }  // [0, 1), the 53 bits a double holds
  std::mt19937_64 engine_;
};

// The message of the mok::Error that `call` throws ("" if none).
template <class Call>
std::string error_of(Call call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A mok::Error from `call` whose message holds `names`: the rule it is about, not just any error
// (another rule refusing the same call would pass an EXPECT_THROW).
template <class Call>
void expect_error(Call call, const std::string& names) {
  const std::string message = error_of(call);
  if (message.empty())
    ADD_FAILURE() << "no mok::Error; expected one naming \"" << names << "\"";
  else
    EXPECT_NE(message.find(names), std::string::npos) << "message: " << message;
}

// v with each element made the largest finite bf16 of its sign (0x7f7f or 0xff7f, about 3.39e38): a dy
// whose products overflow, so that chains downstream add +Inf and -Inf.
inline std::vector<bf16> saturated(std::vector<bf16> v) {
  for (bf16& e : v) e.bits = uint16_t((e.bits & 0x8000u) | 0x7f7fu);
  return v;
}

// How many elements of v are NaN; each must be the canonical one (host_device.h), whichever side wrote it.
inline size_t canonical_nans(const char* name, const std::vector<float>& v) {
  size_t nans = 0, others = 0, first_other = 0;
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != v[i] && ++nans && bits_of(v[i]) != kCanonicalNanF32 && others++ == 0) first_other = i;
  EXPECT_EQ(others, 0u) << "of " << nans << " NaNs in " << name << ", the first another NaN: [" << first_other
                        << "] = 0x" << std::hex << bits_of(v[first_other]);
  return nans;
}

}  // namespace mok::test
