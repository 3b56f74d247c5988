// The shared numerics core on hand-computed cases: bf16 rounding, the scalar functions against fp64,
// SwiGLU and its clamp, the two K-step models, the fma chain, the combines.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "core_test_support.h"
#include "mok/core/bf16.h"
#include "mok/core/combine.h"
#include "mok/core/fields.h"
#include "mok/core/fma_chain.h"
#include "mok/core/gradient_add.h"
#include "mok/core/kstep.h"
#include "mok/core/scalar.h"
#include "mok/core/swiglu.h"

namespace mok::test {
namespace {

// ---- bf16 ----

uint16_t bf16_bits_of(uint32_t float_bits) { return to_bf16(float_of(float_bits)).bits; }

TEST(Bf16, RoundsToNearestTiesToEven) {
  EXPECT_EQ(bf16_bits_of(0x3f800000u), 0x3f80);  // 1 is exact
  EXPECT_EQ(bf16_bits_of(0x3f807fffu), 0x3f80);  // just below the midpoint of 1 and 1 + 2^-7
  EXPECT_EQ(bf16_bits_of(0x3f808001u), 0x3f81);  // just above it
  EXPECT_EQ(bf16_bits_of(0x3f808000u), 0x3f80);  // 1 + 2^-8: the tie goes to the even 1
  EXPECT_EQ(bf16_bits_of(0x3f818000u), 0x3f82);  // 1 + 3 * 2^-8: the tie goes up to the even 1 + 2^-6
  EXPECT_EQ(bf16_bits_of(0xbf818000u), 0xbf82);  // symmetric for negatives
  EXPECT_EQ(bf16_bits_of(0x3fffffffu), 0x4000);  // carry into the exponent: just below 2 rounds to 2
}

TEST(Bf16, OverflowsToInfinity) {
  EXPECT_EQ(bf16_bits_of(0x7f7f7fffu), 0x7f7f);  // below the midpoint: the largest finite bf16
  EXPECT_EQ(bf16_bits_of(0x7f7f8000u), 0x7f80);  // the tie with 2^128 goes to the even "2^128": Inf
  EXPECT_EQ(bf16_bits_of(0x7f7fffffu), 0x7f80);  // FLT_MAX
  EXPECT_EQ(bf16_bits_of(0xff7fffffu), 0xff80);  // -FLT_MAX
  EXPECT_EQ(bf16_bits_of(0x7f800000u), 0x7f80);  // Inf stays Inf
  EXPECT_EQ(bf16_bits_of(0xff800000u), 0xff80);
}

TEST(Bf16, NanIsCanonicalQuietNan) {
  EXPECT_EQ(bf16_bits_of(0x7fc00000u), 0x7fc0);
  EXPECT_EQ(bf16_bits_of(0x7f800001u), 0x7fc0);  // a signalling NaN whose payload would truncate to Inf
  EXPECT_EQ(bf16_bits_of(0xffffffffu), 0x7fc0);  // negative NaN loses its sign
  EXPECT_FALSE(is_finite(bf16{0x7fc0}));
  EXPECT_FALSE(is_finite(bf16{0xff80}));
  EXPECT_TRUE(is_finite(bf16{0x7f7f}));
}

// is_finite(float), the device's expert_bias check and the reference's input validation: every NaN and
// both infinities are not finite; the extremes of the finite floats are.
TEST(Float, IsFiniteOnTheEdgesOfTheFloats) {
  for (uint32_t u : {0x7f800000u, 0xff800000u, 0x7f800001u, 0x7fc00000u, 0xffffffffu})
    EXPECT_FALSE(is_finite(float_of(u))) << std::hex << u;
  for (uint32_t u : {0x00000000u, 0x80000000u, 0x00000001u, 0x7f7fffffu, 0xff7fffffu, 0x3f800000u})
    EXPECT_TRUE(is_finite(float_of(u))) << std::hex << u;
}

TEST(Bf16, SubnormalsAndSignedZero) {
  EXPECT_EQ(bf16_bits_of(0x80000000u), 0x8000);  // -0 keeps its sign
  EXPECT_EQ(bf16_bits_of(0x00008000u), 0x0000);  // half the smallest bf16 subnormal: tie to even 0
  EXPECT_EQ(bf16_bits_of(0x00018000u), 0x0002);  // tie between subnormals 1 and 2: even 2
  EXPECT_EQ(bf16_bits_of(0x007fffffu), 0x0080);  // largest fp32 subnormal rounds up to FLT_MIN
}

TEST(Bf16, EveryNonNanValueRoundTripsExactly) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const bf16 v{uint16_t(b)};
    if ((b & 0x7fffu) > 0x7f80u) continue;  // NaN
    ASSERT_EQ(to_bf16(to_float(v)).bits, v.bits) << show_element(v);
  }
}

// The pair's host side: lo in the low half (the GPU side is mok-scalar-check's, on every float).
TEST(Bf16, PairPutsLoInTheLowHalf) {
  EXPECT_EQ(to_bf16x2(1.0f, -2.0f), 0xc0003f80u);
  // 1 + 1.5/128 ties to the even 1 + 2/128; a NaN is 0x7fc0
  EXPECT_EQ(to_bf16x2(0x1.03p0f, std::numeric_limits<float>::quiet_NaN()), 0x7fc03f82u);
}

// autograd's bf16 accumulation rounds twice: 2^-8 (1 + 2^-12) becomes 2^-8, and 1 + 2^-8 is a tie that
// goes to the even 1; held + gradient rounded once would go up to 1 + 2^-7.
TEST(GradientAdd, Bf16RoundsTheGradientFirst) {
  const float gradient = 0x1.001p-8f;
  EXPECT_EQ(add_bf16_gradient(bf16{0x3f80}, gradient).bits, 0x3f80);
  EXPECT_EQ(to_bf16(1.0f + gradient).bits, 0x3f81);
  EXPECT_EQ(add_bf16_gradient(bf16{0xbf80}, 1.0f).bits, 0x0000);      // -1 + 1 is +0
  EXPECT_EQ(add_bf16_gradient(bf16{0x0000}, -0.0f).bits, 0x0000);     // a zeroed accumulator keeps +0
  EXPECT_EQ(add_bf16_gradient(bf16{0x7f7f}, 0x1p127f).bits, 0x7f80);  // overflows to +Inf
}

// A NaN sum is the GPU's canonical NaN, whichever NaN (payload, sign) or Inf - Inf made it; x86's add
// keeps the first NaN's payload, and to_bf16 writes 0x7fc0.
TEST(GradientAdd, NanSumsAreTheGpusCanonicalNan) {
  const float payload = float_of(0xffc01234u), inf = std::numeric_limits<float>::infinity();
  for (const auto& [held, gradient] : {std::pair{payload, 1.0f}, {1.0f, payload}, {inf, -inf}}) {
    EXPECT_EQ(bits_of(add_f32_gradient(held, gradient)), 0x7fffffffu) << held << " + " << gradient;
    EXPECT_EQ(add_bf16_gradient(to_bf16(held), gradient).bits, 0x7fffu) << held << " + " << gradient;
  }
  EXPECT_EQ(bits_of(add_f32_gradient(0x1p-149f, -0x1p-148f)), 0x80000001u);  // a subnormal sum is kept
  EXPECT_EQ(add_bf16_gradient(bf16{0x0001}, 0x1p-133f).bits, 0x0002);        // in bf16 too
}

// ---- scalar functions against fp64 ----

// |got - want| in units of the float spacing at want (subnormal spacing below 2^-126).
double ulp_error(float got, double want) {
  int exponent;
  std::frexp(want, &exponent);
  const double ulp = std::ldexp(1.0, std::max(exponent - 1, -126) - 23);
  return std::abs(double(got) - want) / ulp;
}

// Counts the inputs of [first, last] (as float bit patterns, every stride-th) where exp_f32 is
// more than 2 ulp from exp, or not Inf where exp overflows; records the first such input.
struct ExpSweep {
  long checked = 0, failed = 0;
  float first_failure = 0.0f;

  void run(uint32_t first, uint32_t last, uint32_t stride) {
    for (uint64_t b = first; b <= last; b += stride) {
      const float x = float_of(uint32_t(b));
      const double want = std::exp(double(x));
      const float got = exp_f32(x);
      const bool ok = want >= 0x1p128 ? std::isinf(got) : ulp_error(got, want) <= 2.0;
      ++checked;
      if (!ok && failed++ == 0) first_failure = x;
    }
  }
};

constexpr uint32_t kNegativeZero = 0x80000000u;

TEST(ExpF32, Within2UlpOverADenseSweep) {
  ExpSweep sweep;
  sweep.run(0x00000000u, 0x42b20000u, 101);    // [0, 89]
  sweep.run(kNegativeZero, 0xc2d00000u, 101);  // [-104, -0]
  EXPECT_EQ(sweep.failed, 0) << "first failure at x = " << show_element(sweep.first_failure) << " of " << sweep.checked;
}

TEST(ExpF32, Within2UlpOnEverySubnormalResult) {
  ExpSweep sweep;
  sweep.run(0xc2aeac50u, 0xc2cff1b6u, 1);  // x in [-87.34, -103.98]: exp(x) below 2^-126, every float
  EXPECT_GT(sweep.checked, 2000000);
  EXPECT_EQ(sweep.failed, 0) << "first failure at x = " << show_element(sweep.first_failure);
}

TEST(ExpF32, OverflowEdge) {
  const float last_finite = 88.72283172607421875f;  // the largest float x whose exp rounds below 2^128
  ASSERT_LT(std::exp(double(last_finite)), 0x1p128);
  ASSERT_GE(std::exp(double(std::nextafter(last_finite, 100.0f))), 0x1p128 * (1 - 0x1p-25));
  ExpSweep sweep;
  sweep.run(bits_of(last_finite) - 4096, bits_of(last_finite) + 4096, 1);
  EXPECT_EQ(sweep.failed, 0) << "first failure at x = " << show_element(sweep.first_failure);
  EXPECT_TRUE(std::isfinite(exp_f32(last_finite)));
  EXPECT_TRUE(std::isinf(exp_f32(std::nextafter(last_finite, 100.0f))));
}

// exp_f32_moderate is exp_f32 bit for bit on |x| <= kModerateExp: every float within 4096 of its ends,
// every 17th below. And a sigmoid is 1 / (1 + exp_f32(-x)) whichever path sigmoids_f32 takes (on the
// GPU at every input: `mok-scalar-check 1`, "sigmoid_f32 as defined").
TEST(ExpF32, ModerateIsExpOnItsRange) {
  long checked = 0, failed = 0;
  const uint32_t top = bits_of(kModerateExp);
  for (const uint32_t sign : {0u, kNegativeZero})
    for (uint32_t b = 0; b <= top; b += (b + 4096 < top ? 17 : 1)) {
      const float x = float_of(sign | b);
      failed += bits_of(exp_f32_moderate(x)) != bits_of(exp_f32(x));
      failed += bits_of(sigmoid_f32(x)) != bits_of(1.0f / (1.0f + exp_f32(-x)));
      ++checked;
    }
  EXPECT_GT(checked, 100000000);
  EXPECT_EQ(failed, 0);
  // Past the range the moderate path's value differs from the definition (x = -88.5: its 2^n, n = 128, is
  // Inf, so it gives 0 for 2.6e-39), so these catch a batch that took it there.
  const float inf = std::numeric_limits<float>::infinity();
  for (const float x : {std::nextafter(-kModerateExp, -100.0f), -88.5f, -88.7f, -100.0f, -inf, 100.0f, inf}) {
    float batch[2] = {0.5f, x};
    sigmoids_f32(batch);
    EXPECT_EQ(bits_of(batch[1]), bits_of(1.0f / (1.0f + exp_f32(-x)))) << x;
    EXPECT_EQ(bits_of(batch[0]), bits_of(sigmoid_f32(0.5f))) << x;
  }
}

TEST(ExpF32, SpecialValues) {
  EXPECT_EQ(bits_of(exp_f32(0.0f)), bits_of(1.0f));
  EXPECT_EQ(bits_of(exp_f32(-0.0f)), bits_of(1.0f));
  EXPECT_EQ(bits_of(exp_f32(std::numeric_limits<float>::infinity())), 0x7f800000u);
  EXPECT_EQ(bits_of(exp_f32(-std::numeric_limits<float>::infinity())), 0u);
  EXPECT_TRUE(std::isnan(exp_f32(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(bits_of(exp_f32(-200.0f)), 0u);
}

double sigmoid64(double x) { return 1.0 / (1.0 + std::exp(-x)); }

TEST(Scalar, SigmoidSiluSiluGradHandCases) {
  EXPECT_EQ(sigmoid_f32(0.0f), 0.5f);
  EXPECT_EQ(silu_f32(0.0f), 0.0f);
  EXPECT_EQ(silu_grad_f32(0.0f), 0.5f);   // s (1 + 0) with s = 1/2
  EXPECT_EQ(sigmoid_f32(100.0f), 1.0f);   // 1 / (1 + e^-100) rounds to 1
  EXPECT_EQ(sigmoid_f32(-100.0f), 0.0f);  // e^100 overflows: 1 / Inf
  EXPECT_EQ(silu_f32(100.0f), 100.0f);
  EXPECT_EQ(silu_grad_f32(100.0f), 1.0f);
}

// Bounds from the operation count: exp within 2 ulp, then one add and one division (sigmoid), one
// more multiply (silu). silu' = s (1 + x (1 - s)) cancels near its zero at x = -1.278, so its error is
// bounded against the size of its parts: 1 - s loses s's error times |x|.
TEST(Scalar, SigmoidSiluSiluGradAgainstFp64) {
  int failures = 0;
  for (int i = -800000; i <= 800000 && failures < 5; ++i) {
    const float x = float(i) * 1e-4f;  // [-80, 80]
    const double s = sigmoid64(x);
    const double u = 0x1p-24;
    const bool ok_sigmoid = ulp_error(sigmoid_f32(x), s) <= 4.0;
    const bool ok_silu = ulp_error(silu_f32(x), double(x) * s) <= 5.0;
    const double grad = s * (1.0 + double(x) * (1.0 - s));
    const bool ok_grad = std::abs(double(silu_grad_f32(x)) - grad) <= 8 * u * s * (1.0 + std::abs(double(x)));
    if (!(ok_sigmoid && ok_silu && ok_grad)) {
      ++failures;
      ADD_FAILURE() << "x = " << show_element(x) << ": sigmoid " << ok_sigmoid << " silu " << ok_silu << " silu' "
                    << ok_grad;
    }
  }
}

// A batch is its values' sigmoids, value by value, whether or not one lies past kModerateExp (-100, -87.5;
// NaN), which sends the whole batch through the definition.
TEST(Scalar, SigmoidsOfABatchAreEachOnesSigmoid) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float batches[3][4] = {{0.5f, -3.0f, 20.0f, 1e-3f}, {0.5f, -100.0f, 20.0f, -87.5f}, {2.0f, nan, -1.0f, 7.0f}};
  for (const auto& batch : batches) {
    float s[4] = {batch[0], batch[1], batch[2], batch[3]};
    sigmoids_f32(s);
    for (int i = 0; i < 4; ++i)
      if (batch[i] == batch[i])
        EXPECT_EQ(bits_of(s[i]), bits_of(sigmoid_f32(batch[i]))) << batch[i];
      else
        EXPECT_TRUE(std::isnan(s[i]));
  }
  EXPECT_EQ(bits_of(swiglu_given_sigmoid(2.0f, -3.0f, 0.0f, sigmoid_f32(2.0f))), bits_of(swiglu(2.0f, -3.0f, 0.0f)));
  const SwigluGrad d = swiglu_grad_given_sigmoid(10.0f, 2.0f, 0.5f, 7.0f, sigmoid_f32(7.0f));
  EXPECT_EQ(bits_of(d.up), bits_of(swiglu_grad(10.0f, 2.0f, 0.5f, 7.0f).up));  // the clamped gate's sigmoid
}

// ---- SwiGLU ----

TEST(Swiglu, UnclampedIsSiluOfGateTimesUp) {
  EXPECT_EQ(swiglu(0.0f, 3.0f, 0.0f), 0.0f);
  EXPECT_EQ(swiglu(2.0f, -3.0f, 0.0f), silu_f32(2.0f) * -3.0f);
  const SwigluGrad d = swiglu_grad(2.0f, -3.0f, 0.5f, 0.0f);
  EXPECT_EQ(d.gate, (0.5f * -3.0f) * silu_grad_f32(2.0f));
  EXPECT_EQ(d.up, 0.5f * silu_f32(2.0f));
}

TEST(Swiglu, ClampLimitsGateAboveAndUpBothWays) {
  EXPECT_EQ(swiglu(10.0f, 2.0f, 7.0f), silu_f32(7.0f) * 2.0f);
  EXPECT_EQ(swiglu(-10.0f, 2.0f, 7.0f), silu_f32(-10.0f) * 2.0f);  // the gate is not clamped below
  EXPECT_EQ(swiglu(1.0f, 9.0f, 7.0f), silu_f32(1.0f) * 7.0f);
  EXPECT_EQ(swiglu(1.0f, -9.0f, 7.0f), silu_f32(1.0f) * -7.0f);
}

TEST(Swiglu, ClampedOperandPassesNoGradient) {
  const SwigluGrad gate_clamped = swiglu_grad(10.0f, 2.0f, 1.0f, 7.0f);
  EXPECT_EQ(gate_clamped.gate, 0.0f);
  EXPECT_EQ(gate_clamped.up, silu_f32(7.0f));
  const SwigluGrad up_clamped = swiglu_grad(1.0f, -9.0f, 1.0f, 7.0f);
  EXPECT_EQ(up_clamped.gate, -7.0f * silu_grad_f32(1.0f));
  EXPECT_EQ(up_clamped.up, 0.0f);
  const SwigluGrad at_limit = swiglu_grad(7.0f, 7.0f, 1.0f, 7.0f);  // equal to the limit: not clamped
  EXPECT_EQ(at_limit.gate, 7.0f * silu_grad_f32(7.0f));
  EXPECT_EQ(at_limit.up, silu_f32(7.0f));
}

// A NaN operand (an fp8 GEMM's promoted partials can overflow to Inf - Inf) is no clamped operand,
// clamp or no clamp: as it reaches a, it reaches the gradients that depend on it, and the up operand's
// gradient, silu(gate), stays (a clamped operand's would be a silent 0).
TEST(Swiglu, NanOperandIsNotClamped) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const float limit : {0.0f, 7.0f}) {
    EXPECT_TRUE(std::isnan(swiglu(nan, 2.0f, limit)));
    EXPECT_TRUE(std::isnan(swiglu_grad(nan, 2.0f, 1.0f, limit).gate)) << "limit " << limit;
    EXPECT_TRUE(std::isnan(swiglu_grad(1.0f, nan, 1.0f, limit).gate)) << "limit " << limit;
    EXPECT_EQ(swiglu_grad(1.0f, nan, 1.0f, limit).up, silu_f32(1.0f)) << "limit " << limit;
  }
}

// ---- K-steps ----

using Operands = std::array<bf16, kStepK>;

// Operands with the given leading values, zeros after.
Operands operands(std::initializer_list<float> values) {
  Operands out{};
  int i = 0;
  for (float v : values) out[i++] = to_bf16(v);
  return out;
}

float fp32_step(float c, const Operands& a, const Operands& b) { return Fp32FmaStep{}(c, a.data(), b.data()); }
float hopper_step(float c, const Operands& a, const Operands& b) { return HopperBf16Step{}(c, a.data(), b.data()); }

TEST(KStep, CancellationLeavesTheSmallTermExact) {
  // 1*1 + (-1)*1 + 2^-13 * 2^-12: both models give 2^-25 (the hopper model's window reaches it).
  const Operands a = operands({1.0f, -1.0f, 0x1p-13f}), b = operands({1.0f, 1.0f, 0x1p-12f});
  EXPECT_EQ(bits_of(fp32_step(0.0f, a, b)), bits_of(0x1p-25f));
  EXPECT_EQ(bits_of(hopper_step(0.0f, a, b)), bits_of(0x1p-25f));
}

TEST(KStep, OrderMattersOnlyToTheFmaChain) {
  // The small product first: the fma chain rounds 1 + 2^-25 to 1 and ends at 0; the hopper model
  // sums all terms exactly before its one rounding.
  const Operands a = operands({0x1p-13f, 1.0f, -1.0f}), b = operands({0x1p-12f, 1.0f, 1.0f});
  EXPECT_EQ(bits_of(fp32_step(0.0f, a, b)), bits_of(0.0f));
  EXPECT_EQ(bits_of(hopper_step(0.0f, a, b)), bits_of(0x1p-25f));
}

TEST(KStep, HopperDropsTermsBelowItsWindow) {
  // 2^-26 lies one bit below the 25 fraction bits under the largest term (2^0): truncated away.
  const Operands a = operands({1.0f, -1.0f, 0x1p-13f}), b = operands({1.0f, 1.0f, 0x1p-13f});
  EXPECT_EQ(bits_of(fp32_step(0.0f, a, b)), bits_of(0x1p-26f));
  EXPECT_EQ(bits_of(hopper_step(0.0f, a, b)), bits_of(0.0f));
}

TEST(KStep, HopperTruncatesWhereFp32RoundsToNearest) {
  // 1 + 3 * 2^-24 lies between 1 + 2^-23 and 1 + 2^-22; round-to-nearest ties to the even 1 + 2^-22,
  // truncation keeps 1 + 2^-23. The same toward zero for the negative sum.
  const Operands a = operands({0x3p-12f}), b = operands({0x1p-12f});
  EXPECT_EQ(bits_of(fp32_step(1.0f, a, b)), bits_of(1.0f + 0x1p-22f));
  EXPECT_EQ(bits_of(hopper_step(1.0f, a, b)), bits_of(1.0f + 0x1p-23f));
  const Operands neg = operands({-0x3p-12f});
  EXPECT_EQ(bits_of(fp32_step(-1.0f, neg, b)), bits_of(-1.0f - 0x1p-22f));
  EXPECT_EQ(bits_of(hopper_step(-1.0f, neg, b)), bits_of(-1.0f - 0x1p-23f));
}

TEST(KStep, HopperTruncatesSubnormalResults) {
  // 1.75 * 2^-75 * 2^-74 = 1.75 * 2^-149: nearest is 2^-148, truncation 2^-149.
  const Operands a = operands({0x1.cp-75f}), b = operands({0x1p-74f});
  EXPECT_EQ(bits_of(fp32_step(0.0f, a, b)), bits_of(0x1p-148f));
  EXPECT_EQ(bits_of(hopper_step(0.0f, a, b)), bits_of(0x1p-149f));
}

TEST(KStep, ExactProductsSumExactlyInBothModels) {
  Operands a{}, b{};
  for (int i = 0; i < kStepK; ++i) {
    a[i] = to_bf16(float(i + 1));
    b[i] = to_bf16(float(i + 2));
  }
  // sum_{n=1..16} n (n + 1) = 1496 + 136
  EXPECT_EQ(bits_of(fp32_step(0.5f, a, b)), bits_of(1632.5f));
  EXPECT_EQ(bits_of(hopper_step(0.5f, a, b)), bits_of(1632.5f));
}

TEST(KStep, HopperZeroSumSign) {
  Operands negative_zeros{}, zeros{};
  negative_zeros.fill(bf16{0x8000});
  EXPECT_EQ(bits_of(hopper_step(-0.0f, negative_zeros, zeros)), 0x80000000u);  // every term -0
  EXPECT_EQ(bits_of(hopper_step(0.0f, negative_zeros, zeros)), 0u);            // C = +0
  const Operands a = operands({1.0f, -1.0f}), b = operands({1.0f, 1.0f});
  EXPECT_EQ(bits_of(hopper_step(-0.0f, a, b)), 0u);  // an exact cancellation is +0
}

TEST(KStep, HopperSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const Operands one = operands({1.0f}), two = operands({2.0f});
  EXPECT_EQ(bits_of(hopper_step(0.0f, operands({inf}), two)), 0x7f800000u);
  EXPECT_EQ(bits_of(hopper_step(0.0f, operands({-inf}), two)), 0xff800000u);
  EXPECT_EQ(bits_of(hopper_step(0.0f, operands({inf}), operands({0.0f}))), 0x7fffffffu);  // Inf * 0
  EXPECT_EQ(bits_of(hopper_step(0.0f, operands({inf, -inf}), operands({1.0f, 1.0f}))), 0x7fffffffu);
  EXPECT_EQ(bits_of(hopper_step(-inf, operands({inf}), one)), 0x7fffffffu);  // C = -Inf plus +Inf
  EXPECT_EQ(bits_of(hopper_step(0.0f, operands({std::numeric_limits<float>::quiet_NaN()}), one)), 0x7fffffffu);
  EXPECT_EQ(bits_of(hopper_step(std::numeric_limits<float>::quiet_NaN(), one, one)), 0x7fffffffu);
  EXPECT_EQ(bits_of(hopper_step(inf, one, one)), 0x7f800000u);  // finite products keep C = Inf
}

TEST(KStep, ChainRunsStepsInOrderFromC) {
  // K = 32: the first step truncates 1 + 3 * 2^-24 to 1 + 2^-23, the second adds 2^-23 exactly.
  std::array<bf16, 2 * kStepK> a{}, b{};
  a[0] = to_bf16(0x3p-12f);
  b[0] = to_bf16(0x1p-12f);
  a[kStepK] = to_bf16(0x1p-11f);
  b[kStepK] = to_bf16(0x1p-12f);
  EXPECT_EQ(bits_of(kchain(a.data(), b.data(), 2 * kStepK, 1.0f, HopperBf16Step{})), bits_of(1.0f + 0x1p-22f));
  EXPECT_EQ(bits_of(kchain(a.data(), b.data(), 2 * kStepK, 1.0f, Fp32FmaStep{})), bits_of(1.0f + 0x3p-23f));
}

// ---- CUDA-core reductions ----

float chain(int n, const float* a, const float* b) {
  const auto term_a = [a](int i) { return a[i]; };
  const auto term_b = [b](int i) { return b[i]; };
  return fma_chain(n, term_a, term_b);
}

TEST(FmaChain, OneFmaPerTermInIndexOrderFromZero) {
  // 1, then two 2^-24 terms that each tie back to even 1: the sum stays 1. Any order that adds the
  // small terms first would reach 1 + 2^-23.
  const float big_first[3] = {1.0f, 0x1p-24f, 0x1p-24f}, ones[3] = {1.0f, 1.0f, 1.0f};
  EXPECT_EQ(chain(3, big_first, ones), 1.0f);
  // Each product is exact inside its fma: -1 + (1 + 2^-12)^2 = 2^-11 + 2^-24 exactly, where a rounded
  // product (1 + 2^-11, the tie to even) would leave 2^-11.
  const float c = 1.0f + 0x1p-12f, x[2] = {1.0f, c}, y[2] = {-1.0f, c};
  EXPECT_EQ(chain(2, x, y), 0x1p-11f + 0x1p-24f);
  EXPECT_EQ(bits_of(chain(0, x, y)), 0u);  // the chain starts from +0
}

TEST(FmaChain, PiecesContinueTheWholeChain) {
  // The GPU runs a long chain in 32-term pieces; each piece continues from the last one's acc.
  TestRng rng(11);
  std::vector<float> a(100), b(100);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = rng.symmetric(1.0f);
    b[i] = rng.symmetric(1.0f);
  }
  float pieces = 0.0f;
  for (int i0 = 0; i0 < 100; i0 += 32)
    pieces = fma_chain(
        std::min(32, 100 - i0), [&](int i) { return a[i0 + i]; }, [&](int i) { return b[i0 + i]; }, pieces);
  EXPECT_EQ(bits_of(pieces), bits_of(chain(100, a.data(), b.data())));
}

// A NaN result is the GPU's canonical NaN, whichever NaN operand (payload, sign) or Inf * 0 or Inf - Inf
// made it: x86's fma would keep the payload or write 0xffc00000.
TEST(FmaChain, ANanResultIsTheCanonicalNan) {
  const float inf = std::numeric_limits<float>::infinity(), payload = float_of(0xffc01234u);
  const float inf_terms[2] = {inf, inf}, signs[2] = {1.0f, -1.0f}, zero[2] = {0.0f, 0.0f};
  const float nan_first[2] = {payload, 1.0f}, ones[2] = {1.0f, 1.0f};
  EXPECT_EQ(bits_of(chain(2, inf_terms, signs)), kCanonicalNanF32);  // Inf - Inf
  EXPECT_EQ(bits_of(chain(1, inf_terms, zero)), kCanonicalNanF32);   // Inf * 0
  EXPECT_EQ(bits_of(chain(2, nan_first, ones)), kCanonicalNanF32);   // a NaN operand's payload
  EXPECT_EQ(bits_of(chain(2, inf_terms, ones)), bits_of(inf));       // an Inf stays
}

// ---- combines ----

TEST(Combine, YSumsSlotsInOrderFromTheSharedValue) {
  // shared = 1 + 2^-8, two slots of 2^-24: each fma ties back to even 1 + 2^-8, which bf16 rounds to
  // 1. Summing the slots first (2^-23) would land above the bf16 midpoint and round up to 1 + 2^-7.
  const float w[2] = {1.0f, 1.0f};
  const bf16 slots[2] = {to_bf16(0x1p-24f), to_bf16(0x1p-24f)};
  const bf16 y = combine_y(2, 1.0f + 0x1p-8f, w, [&](int j) { return slots[j]; });
  EXPECT_EQ(y.bits, to_bf16(1.0f).bits);
}

TEST(Combine, YWeightsEachSlot) {
  const float w[3] = {0.5f, 0.25f, 2.0f};
  const bf16 slots[3] = {to_bf16(3.0f), to_bf16(-4.0f), to_bf16(0.125f)};
  EXPECT_EQ(combine_y(3, 0.0f, w, [&](int j) { return slots[j]; }).bits, to_bf16(0.75f).bits);  // 1.5 - 1 + 0.25
}

TEST(Combine, DxAddsSharedThenSlotsThenRouter) {
  // shared = 1 + 2^-8; slots 2^-24 each tie back to it; the router's 2^-8 (fp32) then makes 1 + 2^-7.
  const bf16 slots[2] = {to_bf16(0x1p-24f), to_bf16(0x1p-24f)};
  const auto slot = [&](int j) { return slots[j]; };
  EXPECT_EQ(combine_dx(2, 1.0f + 0x1p-8f, slot, 0x1p-8f).bits, to_bf16(1.0f + 0x1p-7f).bits);
  EXPECT_EQ(combine_dx(2, 1.0f + 0x1p-8f, slot, 0.0f).bits, to_bf16(1.0f).bits);
  // The slots before the router: from shared 0 they sum to 2^-23 exactly, and 1 + 2^-8 + 2^-23 rounds
  // up to bf16 1 + 2^-7. The router first (1 + 2^-8) would swallow each 2^-24 (ties to even) and round
  // down to 1.
  EXPECT_EQ(combine_dx(2, 0.0f, slot, 1.0f + 0x1p-8f).bits, to_bf16(1.0f + 0x1p-7f).bits);
}

TEST(Combine, YFusesEachWeightWithItsSlot) {
  // One fma per slot: (1 + 2^-23)(1 + 2^-7) - (1 + 2^-7) = 2^-23 + 2^-30 exactly, bf16 0x3401. The
  // product rounded first (to 1 + 2^-7 + 2^-23) would leave 2^-23, bf16 0x3400.
  const float w[1] = {1.0f + 0x1p-23f};
  const bf16 slot = to_bf16(1.0f + 0x1p-7f);
  const bf16 y = combine_y(1, -(1.0f + 0x1p-7f), w, [&](int) { return slot; });
  EXPECT_EQ(y.bits, 0x3401u);
  EXPECT_EQ(y.bits, to_bf16(0x1p-23f + 0x1p-30f).bits);
}

TEST(Combine, ChainsRunSlotBySlotGiveTheWholeCombine) {
  // The GPU continues each column's sum one slot at a time (combine_*_chain with n = 1).
  TestRng rng(12);
  const int k = 11;
  std::vector<float> w(k);
  std::vector<bf16> slots(k);
  for (int j = 0; j < k; ++j) {
    w[j] = rng.symmetric(1.0f);
    slots[j] = to_bf16(rng.symmetric(4.0f));
  }
  const auto slot = [&](int j) { return slots[j]; };
  const float shared = rng.symmetric(2.0f), router = rng.symmetric(0.5f);
  float y = shared, dx = shared;
  for (int j = 0; j < k; ++j) {
    y = combine_y_chain(j, 1, w.data(), slot, y);
    dx = combine_dx_chain(j, 1, slot, dx);
  }
  EXPECT_EQ(to_bf16(y).bits, combine_y(k, shared, w.data(), slot).bits);
  EXPECT_EQ(combine_dx_round(dx, router).bits, combine_dx(k, shared, slot, router).bits);
}

TEST(Combine, WeightedDyIsTheFp32ProductRoundedToBf16) {
  // 3 * (1 + 2^-7) = 3 + 3 * 2^-7: bf16 spacing at 2 is 2^-6, so 3.0234375 rounds to 3.03125.
  EXPECT_EQ(weighted_dy(3.0f, to_bf16(1.0f + 0x1p-7f)).bits, to_bf16(3.03125f).bits);
  EXPECT_EQ(weighted_dy(0.5f, to_bf16(-3.0f)).bits, to_bf16(-1.5f).bits);
  // Two roundings, not the exact product's one: w dy = 0x1.12ffff3cp+0 exactly, 0x1.13p+0 in fp32, a tie in
  // bf16 that goes to even (0x3f8a), where the exact product rounds once to 0x3f89.
  EXPECT_EQ(weighted_dy(0x1.00ef2ep+0f, bf16{0x3f89}).bits, 0x3f8a);
}

}  // namespace
}  // namespace mok::test
