// The FP8 (E4M3) tensor-core step model (mok/core/fp8_dot.h): properties that hold for every candidate
// parameter set mok-tc-validate scores (exactness when every term fits, sign symmetry, order within a
// group, zeros, NaN and Inf), and known answers of hopper() that separate it from its variants.
// The H200 runs that picked hopper() are in docs/numerics.md; these tests pin the model's own claims.
#include "mok/core/fp8_dot.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "core_test_support.h"

namespace mok::test {
namespace {

using Operands = std::array<fp8_e4m3, kFp8StepK>;

fp8_e4m3 e4m3(float f) {
  const fp8_e4m3 v = to_e4m3(f);
  EXPECT_EQ(to_float(v), f) << "not an E4M3 value: " << f;
  return v;
}

// Any finite E4M3 code (subnormals and signed zeros included), never NaN.
fp8_e4m3 finite_code(TestRng& rng) {
  for (;;) {
    const fp8_e4m3 v{uint8_t(rng.next())};
    if (!is_nan(v)) return v;
  }
}

// A finite float with a random exponent field in [lo, hi] (0: subnormal or zero) and random sign.
float random_float(TestRng& rng, int lo, int hi) {
  const uint64_t r = rng.next();
  const uint32_t field = uint32_t(lo + rng.below(hi - lo + 1));
  return float_of(uint32_t(r >> 63) << 31 | field << 23 | uint32_t(r & 0x7fffffu));
}

// f truncated toward zero to `bits` fraction bits below its leading bit (below 2^-126 if subnormal).
float truncate_fraction(float f, int bits) {
  const uint32_t u = bits_of(f);
  const uint32_t field = (u >> 23) & 0xff;
  if (field == 0xff || bits >= 23) return f;
  const uint32_t kept = u & ~((1u << (23 - bits)) - 1u);  // the grid is the same for subnormals
  return (kept & 0x7fffffffu) == 0 ? 0.0f : float_of(kept);
}

// f cut toward -Inf to `bits` fraction bits below its leading bit (below 2^-126 if subnormal).
float floor_fraction(float f, int bits) {
  if (bits >= 23 || f == 0) return f;
  const int exp = std::max(std::ilogb(f), -126);
  const double grid = std::ldexp(1.0, exp - bits);
  return float(std::floor(double(f) / grid) * grid);  // exact: at most 24 bits, or -2^(exp+1)
}

float step(const Fp8StepModel& m, float c, const Operands& a, const Operands& b) { return m(c, a.data(), b.data()); }

std::string describe(float c, const Operands& a, const Operands& b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "c=%a", double(c));
  std::string s = buf;
  for (int k = 0; k < kFp8StepK; ++k) {
    std::snprintf(buf, sizeof buf, " %02x*%02x", a[k].bits, b[k].bits);
    s += buf;
  }
  return s;
}

class Fp8StepCandidate : public ::testing::TestWithParam<int> {
 protected:
  Fp8StepModel model() const { return Fp8StepModel::candidate(GetParam()); }
};

// Every product a multiple of 2^-3 below 2^3, C a multiple of 2^-3 below 2^6: every term sits on the
// alignment grid (e_max <= 5, align_frac >= 8) and the sum (< 2^9, 12 bits) fits out_frac >= 11 bits, so
// the step is the exact sum, whatever the group size, zero rule or truncation direction.
TEST_P(Fp8StepCandidate, ExactWhenEveryTermFitsTheGrid) {
  const Fp8StepModel m = model();
  ASSERT_GE(m.align_frac, 8);
  ASSERT_GE(m.out_frac, 11);
  TestRng rng(19);
  for (int trial = 0; trial < 20000; ++trial) {
    Operands a, b;
    double exact = 0;
    for (int k = 0; k < kFp8StepK; ++k) {
      const int units = 8 + rng.below(24);  // 1 .. 3.875 in eighths; E4M3 holds those below 2 and even ones above
      const float av = float(units < 16 ? units : units & ~1) / 8 * (rng.below(2) ? -1.0f : 1.0f);
      const float bv = float(1 << rng.below(2)) * (rng.below(2) ? -1.0f : 1.0f);
      a[k] = rng.below(8) == 0 ? fp8_e4m3{uint8_t(rng.below(2) << 7)} : e4m3(av);
      b[k] = e4m3(bv);
      exact += double(to_float(a[k])) * double(to_float(b[k]));
    }
    const float c = float(rng.below(1024) - 512) / 8;  // |C| < 2^6 in eighths
    exact += double(c);
    const float got = step(m, c, a, b);
    ASSERT_EQ(double(got), exact) << describe(c, a, b);
    if (exact == 0) {
      ASSERT_EQ(bits_of(got), 0u) << "an exact zero sum of nonzero terms is +0: " << describe(c, a, b);
    }
  }
}

// Negating C and every a negates every term: with terms cut toward zero the result is negated bit for
// bit (a zero stays a zero, NaN stays NaN). Cutting toward -Inf breaks this, and the test shows it.
TEST_P(Fp8StepCandidate, NegatingCAndASideNegatesTheResult) {
  const Fp8StepModel m = model();
  TestRng rng(20);
  int asymmetric = 0;
  for (int trial = 0; trial < 50000; ++trial) {
    Operands a, b, na;
    for (int k = 0; k < kFp8StepK; ++k) {
      a[k] = finite_code(rng), b[k] = finite_code(rng);
      if (trial % 2) a[k].bits &= 0x8fu | (rng.below(2) ? 0x70u : 0x00u);  // many subnormals and zeros
      na[k] = fp8_e4m3{uint8_t(a[k].bits ^ 0x80u)};
    }
    const float c = random_float(rng, trial % 3 == 0 ? 0 : 100, trial % 3 == 0 ? 10 : 150);
    const uint32_t got = bits_of(step(m, c, a, b)), negated = bits_of(step(m, -c, na, b));
    const bool zero = (got & 0x7fffffffu) == 0;
    const bool ok = zero ? (negated & 0x7fffffffu) == 0 : negated == (got ^ 0x80000000u);
    if (m.floor_terms) {
      asymmetric += !ok;
    } else {
      ASSERT_TRUE(ok) << std::hex << got << " vs " << negated << ": " << describe(c, a, b);
    }
  }
  if (m.floor_terms) {
    EXPECT_GT(asymmetric, 0) << "terms cut toward -Inf should break the symmetry";
  }
}

// Within one group the terms are aligned to their common maximum, cut one by one and summed exactly:
// any order of the products inside a group gives the same bits.
TEST_P(Fp8StepCandidate, OrderWithinAGroupDoesNotMatter) {
  const Fp8StepModel m = model();
  TestRng rng(21);
  for (int trial = 0; trial < 20000; ++trial) {
    Operands a, b;
    for (int k = 0; k < kFp8StepK; ++k) a[k] = finite_code(rng), b[k] = finite_code(rng);
    const float c = random_float(rng, 90, 150);
    Operands pa = a, pb = b;
    for (int first = 0; first < kFp8StepK; first += m.group) {
      for (int k = first + m.group - 1; k > first; --k) {  // Fisher-Yates inside the group
        const int j = first + rng.below(k - first + 1);
        std::swap(pa[k], pa[j]);
        std::swap(pb[k], pb[j]);
      }
    }
    ASSERT_EQ(bits_of(step(m, c, a, b)), bits_of(step(m, c, pa, pb))) << describe(c, a, b);
  }
}

// Which group a product is in matters when the groups are chained: two products of 2^-14 sum to 2^-13
// inside their group and survive beside 1; beside 1 in one fused sum each is cut away (13 bits).
TEST(Fp8StepModel, ChainedGroupsCutEachGroupSeparately) {
  Operands a, b;
  a.fill(fp8_e4m3{0}), b.fill(fp8_e4m3{0});
  const fp8_e4m3 small = e4m3(0x1p-7f);  // subnormal: 4 2^-9
  a[0] = small, b[0] = small, a[1] = small, b[1] = small;
  a[20] = e4m3(1.0f), b[20] = e4m3(1.0f);
  Fp8StepModel fused = Fp8StepModel::hopper(), chained = fused;
  chained.group = 16;
  EXPECT_EQ(step(fused, 0.0f, a, b), 1.0f);
  EXPECT_EQ(step(chained, 0.0f, a, b), 1.0f + 0x1p-13f);
  std::swap(a[1], a[21]), std::swap(b[1], b[21]);  // one small product into the group of the 1
  EXPECT_EQ(step(chained, 0.0f, a, b), 1.0f);
}

// All products zero (zeros of either sign times anything): the result is C cut to the narrower of the
// two widths (cut toward -Inf at the alignment first, where the model cuts terms so). C >= 2^3 lies above any zero
// product's exponent (zero_exp + 8 <= 2), so this holds for the zero-counting candidates too; those that ignore zeros
// are checked down to subnormal C.
TEST_P(Fp8StepCandidate, ZeroProductsReturnCTruncated) {
  const Fp8StepModel m = model();
  ASSERT_LE(m.zero_exp, -6);
  TestRng rng(22);
  const int bits = std::min(m.align_frac, m.out_frac);
  for (int trial = 0; trial < 20000; ++trial) {
    Operands a, b;
    for (int k = 0; k < kFp8StepK; ++k) {
      a[k] = fp8_e4m3{uint8_t(rng.below(2) << 7)};
      b[k] = finite_code(rng);
      if (rng.below(2)) std::swap(a[k], b[k]);
    }
    const bool any_c = m.zero_exp == Fp8StepModel::kZeroIgnored && trial % 2;
    const float c = any_c ? random_float(rng, 0, 254) : random_float(rng, 130, 254);
    const float expected =
        m.floor_terms ? truncate_fraction(floor_fraction(c, m.align_frac), m.out_frac) : truncate_fraction(c, bits);
    ASSERT_EQ(bits_of(step(m, c, a, b)), bits_of(expected)) << describe(c, a, b);
  }
}

TEST_P(Fp8StepCandidate, SignOfZero) {
  const Fp8StepModel m = model();
  const fp8_e4m3 pz{0x00}, nz{0x80}, one = e4m3(1.0f), minus_one = e4m3(-1.0f);
  Operands a, b;
  a.fill(pz), b.fill(pz);
  EXPECT_EQ(bits_of(step(m, 0.0f, a, b)), 0x00000000u);
  EXPECT_EQ(bits_of(step(m, -0.0f, a, b)), 0x00000000u);  // +0 products
  a.fill(nz);                                             // -0 * +0 = -0 everywhere
  EXPECT_EQ(bits_of(step(m, -0.0f, a, b)), m.signed_zero ? 0x80000000u : 0u);
  EXPECT_EQ(bits_of(step(m, 0.0f, a, b)), 0x00000000u);
  b[31] = nz;  // one product -0 * -0 = +0
  EXPECT_EQ(bits_of(step(m, -0.0f, a, b)), 0x00000000u);
  a.fill(pz), b.fill(pz);
  a[7] = one, b[7] = minus_one;  // C + (-1) cancels exactly: +0, whatever C's sign
  EXPECT_EQ(bits_of(step(m, 1.0f, a, b)), 0x00000000u);
  a[7] = minus_one, b[7] = minus_one;
  EXPECT_EQ(bits_of(step(m, -1.0f, a, b)), 0x00000000u);
}

// E4M3 has no infinities: S.1111.111 is NaN and gives the canonical NaN wherever it is; C = NaN too.
// C = +-Inf passes through finite products. The largest products stay finite and exact.
TEST_P(Fp8StepCandidate, NanAndInf) {
  const Fp8StepModel m = model();
  TestRng rng(23);
  for (int trial = 0; trial < 2000; ++trial) {
    Operands a, b;
    for (int k = 0; k < kFp8StepK; ++k) a[k] = finite_code(rng), b[k] = finite_code(rng);
    const float c = random_float(rng, 0, 254);
    const float inf = std::numeric_limits<float>::infinity();
    EXPECT_EQ(bits_of(step(m, float_of(0x7f800000u | uint32_t(1 + rng.below(1 << 22))), a, b)), 0x7fffffffu);
    EXPECT_EQ(bits_of(step(m, float_of(0xffc00000u), a, b)), 0x7fffffffu);
    EXPECT_EQ(step(m, inf, a, b), inf);
    EXPECT_EQ(step(m, -inf, a, b), -inf);
    Operands na = a, nb = b;
    const int k = rng.below(kFp8StepK);
    (trial % 2 ? na : nb)[k] = fp8_e4m3{uint8_t(trial % 4 < 2 ? 0x7f : 0xff)};
    EXPECT_EQ(bits_of(step(m, c, na, nb)), 0x7fffffffu) << describe(c, na, nb);
    EXPECT_EQ(bits_of(step(m, inf, na, nb)), 0x7fffffffu);
    nb[k] = fp8_e4m3{0x00};  // NaN * 0 is NaN
    na[k] = fp8_e4m3{0x7f};
    EXPECT_EQ(bits_of(step(m, c, na, nb)), 0x7fffffffu);
  }
  Operands a, b;
  a.fill(fp8_e4m3{kE4m3Max}), b.fill(fp8_e4m3{kE4m3Max});
  EXPECT_EQ(step(m, 0.0f, a, b), 32.0f * 448.0f * 448.0f);  // 49 2^17 2^5: exact
  a.fill(fp8_e4m3{0x78});                                   // 256: finite, not an Inf code
  EXPECT_EQ(step(m, 0.0f, a, b), 32.0f * 256.0f * 448.0f);
}

INSTANTIATE_TEST_SUITE_P(Candidates, Fp8StepCandidate, ::testing::Range(0, Fp8StepModel::kCandidates));

// Known answers of hopper() (13 fraction bits kept, result cut to 13) that its variants do not
// give: what the validator's variants are there to tell apart.
TEST(Fp8StepModel, HopperKeepsThirteenFractionBits) {
  const Fp8StepModel h = Fp8StepModel::hopper();
  Operands a, b;
  a.fill(fp8_e4m3{0}), b.fill(fp8_e4m3{0});
  a[3] = e4m3(0x1p-6f), b[3] = e4m3(0x1p-6f);  // 2^-12: on the 2^-13 grid below 1
  EXPECT_EQ(step(h, 1.0f, a, b), 1.0f + 0x1p-12f);
  a[3] = e4m3(0x1p-7f), b[3] = e4m3(0x1p-7f);  // 2^-14: below the grid, cut away
  EXPECT_EQ(step(h, 1.0f, a, b), 1.0f);
  EXPECT_EQ(step(Fp8StepModel::candidate(2), 1.0f, a, b), 1.0f + 0x1p-14f);  // 14 bits keep it
  EXPECT_EQ(step(Fp8StepModel::candidate(5), 1.0f, a, b), 1.0f + 0x1p-14f);  // bf16 widths too
  EXPECT_EQ(step(h, -1.0f, a, b), -1.0f);  // the term is cut, not the sum: -1 + 2^-14 gives -1
  b[3] = e4m3(-0x1p-7f);                   // -2^-14 beside +1
  EXPECT_EQ(step(h, 1.0f, a, b), 1.0f);    // toward zero
  Fp8StepModel floor = h;
  floor.floor_terms = true;
  EXPECT_EQ(step(floor, 1.0f, a, b), 1.0f - 0x1p-13f);  // toward -Inf: one 2^-13 unit off
  a.fill(fp8_e4m3{0}), b.fill(fp8_e4m3{0});
  // No products: C alone is cut to 13 fraction bits (the e8m13 result); fp32-result variants keep it.
  EXPECT_EQ(bits_of(step(h, float_of(0x3f800fffu), a, b)), 0x3f800c00u);
  EXPECT_EQ(bits_of(step(Fp8StepModel::candidate(5), float_of(0x3f800fffu), a, b)), 0x3f800fffu);
  EXPECT_EQ(bits_of(step(h, float_of(0x00000fffu), a, b)), 0x00000c00u);  // subnormal: 13 bits below 2^-126
  // A zero counted at exponent -6 (candidate 9) lifts e_max: 0 * 448 is at 2^2, so 2^-12 is cut away.
  a[0] = fp8_e4m3{0}, b[0] = fp8_e4m3{kE4m3Max};
  a[1] = e4m3(0x1p-6f), b[1] = e4m3(0x1p-6f);
  EXPECT_EQ(step(h, 0.0f, a, b), 0x1p-12f);
  EXPECT_EQ(step(Fp8StepModel::candidate(9), 0.0f, a, b), 0.0f);
  EXPECT_EQ(step(Fp8StepModel::candidate(9), 1.0f, a, b), 1.0f);  // 1 + 2^-12 on a 2^-11 grid
}

TEST(Fp8StepModel, CandidatesAreDistinct) {
  for (int i = 0; i < Fp8StepModel::kCandidates; ++i) {
    for (int j = i + 1; j < Fp8StepModel::kCandidates; ++j) {
      const Fp8StepModel x = Fp8StepModel::candidate(i), y = Fp8StepModel::candidate(j);
      EXPECT_FALSE(x.align_frac == y.align_frac && x.out_frac == y.out_frac && x.group == y.group &&
                   x.floor_terms == y.floor_terms && x.zero_exp == y.zero_exp && x.signed_zero == y.signed_zero)
          << i << " and " << j;
    }
  }
}

}  // namespace
}  // namespace mok::test
