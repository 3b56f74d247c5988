// The FP8 mode's GEMM (mok/core/fp8_gemm.h): the scale product rounded once, the block quantizer's scale
// and values for 1 x 128 and 128 x 128 blocks (and W^T's blocks the same as W's), and the GEMM rule
// against direct evaluations on hand-made cases: the scales, the promotion at each 128-wide K block,
// the tensor core's truncation within a block, overflow and underflow of the total.
#include "mok/core/fp8_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core_test_support.h"

namespace mok::test {
namespace {

fp8_e4m3 e4m3(float f) {
  const fp8_e4m3 v = to_e4m3(f);
  EXPECT_EQ(to_float(v), f) << "not an E4M3 value: " << f;
  return v;
}

// x 2^s evaluated directly: exact in double, then one float rounding (to nearest even).
float scaled_directly(float x, int s) { return float(std::ldexp(double(x), s)); }

TEST(ScaleByExp2, IsTheExactProductRoundedOnce) {
  TestRng rng(19);
  for (int i = 0; i < 200000; ++i) {
    const float x = float_of(uint32_t(rng.next()) & 0xff7fffffu);  // finite: exponent field below 255
    const int s = -252 + rng.below(252 + 254 + 1);
    ASSERT_EQ(bits_of(scale_by_exp2(x, s)), bits_of(scaled_directly(x, s))) << x << " 2^" << s;
  }
  // The ends: a result that rounds to the smallest subnormal, one past the range, a signed zero.
  EXPECT_EQ(scale_by_exp2(0x1.8p-130f, -20), 0x1p-149f);  // 0.75 of the smallest subnormal rounds up to it
  EXPECT_EQ(scale_by_exp2(1.0f, -150), 0.0f);             // exactly half the smallest subnormal: even is 0
  EXPECT_EQ(scale_by_exp2(0x1.fffffep+127f, 1), std::numeric_limits<float>::infinity());
  EXPECT_EQ(bits_of(scale_by_exp2(-1.0f, -252)), 0x80000000u);
  EXPECT_EQ(scale_by_exp2(0x1.8p-125f, 242), 0x1.8p+117f);  // past 2^127 in two exact steps
}

TEST(QuantizeBlock, OneByOneTwentyEightScalesByTheBlocksLargestMagnitude) {
  std::vector<bf16> v(kFp8Block);
  TestRng rng(7);
  for (bf16& x : v) x = to_bf16(rng.symmetric(1.0f));
  v[77] = to_bf16(-3.0f);  // amax 3 = 1.5 2^1: the scale 2^-7 takes it to 384 <= 448 (2^-8: 768, too large)
  std::vector<fp8_e4m3> q(kFp8Block);
  const int e = quantize_block(v.data(), 1, kFp8Block, kFp8Block, q.data(), kFp8Block);
  EXPECT_EQ(e, -7);
  EXPECT_EQ(to_float(q[77]), -384.0f);
  for (int i = 0; i < kFp8Block; ++i) EXPECT_EQ(q[i].bits, to_e4m3(to_float(v[i]) * 128.0f).bits) << i;
}

TEST(QuantizeBlock, TheLargestLandsInTheTopBinadeAndNeverSaturates) {
  for (const float amax : {448.0f, 480.0f, 1.75f, 1.8125f, 0x1p-110f, 3e38f}) {
    std::vector<bf16> v(kFp8Block, to_bf16(0.5f * amax));
    v[5] = to_bf16(amax);
    std::vector<fp8_e4m3> q(kFp8Block);
    const int e = quantize_block(v.data(), 1, kFp8Block, kFp8Block, q.data(), kFp8Block);
    const float top = to_float(q[5]);
    EXPECT_TRUE(top >= 224.0f && top <= 448.0f) << amax << ": " << top;
    const double back = std::ldexp(double(top), e), want = to_float(v[5]);
    EXPECT_LE(std::fabs(back - want), 0x1p-4 * want) << amax << ": one E4M3 rounding";
  }
  std::vector<bf16> zeros(kFp8Block, bf16{0x8000});  // -0
  std::vector<fp8_e4m3> q(kFp8Block);
  EXPECT_EQ(quantize_block(zeros.data(), 1, kFp8Block, kFp8Block, q.data(), kFp8Block), 0);
  EXPECT_EQ(q[0].bits, 0x80) << "a signed zero stays signed";
}

// A 128 x 128 block inside a larger matrix: one scale from the whole square, strides respected, and
// the block of W^T (the backward's operand) is the same square transposed, with the same scale.
TEST(QuantizeBlock, SquareBlocksOfWAndWTransposedAgree) {
  constexpr int rows = 256, cols = 384;
  TestRng rng(11);
  std::vector<bf16> w(rows * cols), wt(cols * rows);
  for (bf16& x : w) x = to_bf16(rng.symmetric(0.05f));
  w[200 * cols + 300] = to_bf16(0.75f);  // block (1, 2)'s largest
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) wt[c * rows + r] = w[r * cols + c];
  std::vector<fp8_e4m3> q(rows * cols), qt(cols * rows);
  for (int br = 0; br < rows / kFp8Block; ++br)
    for (int bc = 0; bc < cols / kFp8Block; ++bc) {
      const int first = br * kFp8Block * cols + bc * kFp8Block, first_t = bc * kFp8Block * rows + br * kFp8Block;
      const int e = quantize_block(w.data() + first, kFp8Block, kFp8Block, cols, q.data() + first, cols);
      const int et = quantize_block(wt.data() + first_t, kFp8Block, kFp8Block, rows, qt.data() + first_t, rows);
      EXPECT_EQ(e, et) << br << ", " << bc;
      if (br == 1 && bc == 2) {
        EXPECT_EQ(e, e4m3_scale_exponent(to_float(to_bf16(0.75f))));
      }
    }
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) ASSERT_EQ(q[r * cols + c].bits, qt[c * rows + r].bits) << r << ", " << c;
}

// k values of one code each, as a GEMM row.
std::vector<fp8_e4m3> filled(int k, float value) { return std::vector<fp8_e4m3>(k, e4m3(value)); }

TEST(Fp8GemmElement, ScalesEachBlocksPartialByBothExponents) {
  const std::vector<fp8_e4m3> a = filled(256, 1.0f), b = filled(256, 2.0f);
  const int a_exp[] = {0, 3}, b_exp[] = {-1, 2};
  // Block 0: 128 products of 2, partial 256, times 2^-1; block 1: 256 times 2^5.
  EXPECT_EQ(fp8_gemm_element(a.data(), a_exp, b.data(), b_exp, 256), 128.0f + 8192.0f);
}

// Each 128-wide block is promoted to fp32: a small block after a large one survives, where one
// tensor-core chain over both blocks (13 fraction bits) would cut it off.
TEST(Fp8GemmElement, PromotesToFp32AtEveryBlockBoundary) {
  std::vector<fp8_e4m3> a = filled(256, 128.0f), b = filled(256, 1.0f);
  for (int i = kFp8Block; i < 256; ++i) a[i] = e4m3(i == kFp8Block ? 1.0f : 0.0f);
  const int zero[] = {0, 0};
  EXPECT_EQ(fp8_gemm_element(a.data(), zero, b.data(), zero, 256), 16385.0f);  // 2^14 + 1 in fp32
  float unpromoted = 0.0f;
  for (int s = 0; s < 256; s += kFp8StepK) unpromoted = Fp8StepModel::hopper()(unpromoted, a.data() + s, b.data() + s);
  EXPECT_EQ(unpromoted, 16384.0f) << "the 1 is below the chain's 13 bits: the promotion is what keeps it";
}

// Within a block the accumulation is the tensor core's: the same 1 in the block's second k32 step
// after 2^14 in its first is cut, and the element is the step model's partial.
TEST(Fp8GemmElement, WithinABlockTheTensorCoreTruncates) {
  std::vector<fp8_e4m3> a = filled(kFp8Block, 0.0f), b = filled(kFp8Block, 1.0f);
  for (int i = 0; i < kFp8StepK; ++i) a[i] = e4m3(16.0f);  // 32 x 16 = 2^9 in step 0
  a[kFp8StepK] = e4m3(0.03125f);                           // 2^-5 in step 1: 14 bits below 2^9
  const int zero[] = {0};
  EXPECT_EQ(fp8_gemm_element(a.data(), zero, b.data(), zero, kFp8Block), 512.0f);
}

TEST(Fp8GemmElement, OverflowAndUnderflowOfTheTotal) {
  const std::vector<fp8_e4m3> a = filled(256, 448.0f), b = filled(256, 448.0f);
  const int big_a[] = {121, 121}, big_b[] = {10, 10};
  EXPECT_EQ(fp8_gemm_element(a.data(), big_a, b.data(), big_b, 256), std::numeric_limits<float>::infinity());
  const std::vector<fp8_e4m3> one = filled(kFp8Block, 1.0f);
  const int tiny[] = {-126};
  // 128 2^-252 = 2^-245: below half the smallest subnormal, +0.
  EXPECT_EQ(bits_of(fp8_gemm_element(one.data(), tiny, one.data(), tiny, kFp8Block)), 0u);
  const int small_a[] = {-100}, small_b[] = {-50};
  EXPECT_EQ(fp8_gemm_element(one.data(), small_a, one.data(), small_b, kFp8Block), 0x1p-143f);  // subnormal, exact
  const std::vector<fp8_e4m3> neg = filled(kFp8Block, -0.0f);
  EXPECT_EQ(bits_of(fp8_gemm_element(neg.data(), tiny, one.data(), tiny, kFp8Block)), 0u) << "a zero sum is +0";
}

// Random operands: the rule written out directly (the step model per k32, the scale in double).
TEST(Fp8GemmElement, MatchesADirectEvaluation) {
  TestRng rng(23);
  constexpr int k = 512;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<fp8_e4m3> a(k), b(k);
    for (int i = 0; i < k; ++i) {
      a[i] = to_e4m3(rng.symmetric(448.0f));
      b[i] = to_e4m3(rng.symmetric(448.0f));
    }
    int a_exp[k / kFp8Block], b_exp[k / kFp8Block];
    for (int blk = 0; blk < k / kFp8Block; ++blk) {
      a_exp[blk] = -126 + rng.below(248);
      b_exp[blk] = -20 + rng.below(21);
    }
    float total = 0.0f;
    for (int blk = 0; blk < k / kFp8Block; ++blk) {
      float partial = 0.0f;
      for (int s = 0; s < kFp8Block; s += kFp8StepK)
        partial = Fp8StepModel::hopper()(partial, &a[blk * kFp8Block + s], &b[blk * kFp8Block + s]);
      total += scaled_directly(partial, a_exp[blk] + b_exp[blk]);
    }
    ASSERT_EQ(bits_of(fp8_gemm_element(a.data(), a_exp, b.data(), b_exp, k)), bits_of(total)) << trial;
  }
}

// Quantized bf16 data through the rule lands within E4M3's rounding of the exact dot product: each
// operand is off by at most 2^-4 of itself, and same-signed products cannot cancel.
TEST(Fp8GemmElement, QuantizedDotIsCloseToTheExactOne) {
  TestRng rng(29);
  constexpr int k = 384;
  std::vector<bf16> x(k), w(k);
  for (int i = 0; i < k; ++i) {
    x[i] = to_bf16(0.01f + std::fabs(rng.symmetric(2.0f)));
    w[i] = to_bf16(0.001f + std::fabs(rng.symmetric(0.1f)));
  }
  std::vector<fp8_e4m3> qx(k), qw(k);
  int ex[k / kFp8Block], ew[k / kFp8Block];
  double exact = 0;
  for (int blk = 0; blk < k / kFp8Block; ++blk) {
    const int first = blk * kFp8Block;
    ex[blk] = quantize_block(x.data() + first, 1, kFp8Block, kFp8Block, qx.data() + first, kFp8Block);
    ew[blk] = quantize_block(w.data() + first, 1, kFp8Block, kFp8Block, qw.data() + first, kFp8Block);
  }
  for (int i = 0; i < k; ++i) exact += double(to_float(x[i])) * to_float(w[i]);
  const double got = fp8_gemm_element(qx.data(), ex, qw.data(), ew, k);
  EXPECT_LT(std::fabs(got - exact), (2 * 0x1p-4 + 0x1p-4 * 0x1p-4 + 0x1p-11) * exact) << got << " vs " << exact;
  EXPECT_GT(std::fabs(got - exact), 0.0) << "E4M3 rounding shows";
}

}  // namespace
}  // namespace mok::test
