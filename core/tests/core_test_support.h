// Helpers for the tests of core, which need nothing above it: a seeded generator of test data, the
// message of a thrown mok::Error and the check that a call is refused by its rule. Tests of the modules
// above core use them too (their CMake adds this folder to the include path).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>

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

}  // namespace mok::test
