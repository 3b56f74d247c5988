// The reference's tests compare tensors bit for bit with same_bits, which names the first mismatch
// (bits and values as mok/core/fields.h shows them).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

#include "core_test_support.h"
#include "mok/core/bf16.h"
#include "mok/core/config.h"
#include "mok/core/fields.h"

namespace mok::ref::test {

using mok::test::expect_error;

// c with DeepSeek-V3's routing: sigmoid scores, 4 expert groups of which 2 are kept, weights scaled by
// 2.5 (E must be a multiple of 4).
inline LayerConfig with_grouped_sigmoid(LayerConfig c) {
  c.score_mode = ScoreMode::sigmoid;
  c.n_group = 4;
  c.topk_group = 2;
  c.routed_scale = 2.5f;
  return c;
}

inline bool is_zero(float v) { return v == 0.0f; }
inline bool is_zero(bf16 v) { return (v.bits & 0x7fffu) == 0; }
inline bool is_zero(int32_t v) { return v == 0; }

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
      return ::testing::AssertionFailure()
             << "first mismatch at element " << i << " of " << a.size() << ": " << a_name << " = " << show_element(a[i])
             << ", " << b_name << " = " << show_element(b[i]);
    any_nonzero = any_nonzero || !is_zero(a[i]);
  }
  if (!any_nonzero) return ::testing::AssertionFailure() << a_name << " is empty or all zeros: nothing was compared";
  return ::testing::AssertionSuccess();
}

// Every gradient of two backwards bit for bit (fields.h's list; same_bits, so each must hold a non-zero).
// Without a router (a given routing) there are no d_logits and d_router; without a shared expert no
// d_shared_w1 and d_shared_w2: `router` and `shared` say which the problem has.
inline void expect_same_gradients(const Gradients& got, const Gradients& want, bool router = true, bool shared = true) {
  for_each_field(got, want, [&](std::string_view name, const auto& a, const auto& b) {
    if (!router && (name == "d_logits" || name == "d_router")) return;
    if (!shared && name.starts_with("d_shared_")) return;
    EXPECT_PRED_FORMAT2(same_bits, a, b) << name;
  });
}

}  // namespace mok::ref::test
