// HopperBf16Step against outputs the H200's mma.sync m16n8k16 produced (mok-tc-validate, 2026-11-29,
// docs/results/): cases where the rules differ from simpler models. Operands as printed, in hex.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>

#include "core_test_support.h"
#include "mok/core/kstep.h"

namespace mok::test {
namespace {

struct HardwareCase {
  std::array<uint16_t, 16> a, b;
  uint32_t c, d;  // accumulator in, tensor-core result out (fp32 bits)
};

constexpr HardwareCase kCases[] = {
    // Negative sum of -0.38 subnormal ulps truncates to +0, not -0.
    {{0x8000, 0x956c, 0x953c, 0x9e01, 0x9578, 0x1400, 0x987f, 0x96e8, 0x1cf2, 0x9ba7, 0x99c4, 0x9833, 0x9429, 0x0000,
      0x0000, 0x16e4},
     {0x0000, 0x1c48, 0x9c21, 0x8000, 0x1959, 0x1799, 0x0000, 0x9882, 0x14ba, 0x0000, 0x1a07, 0x0000, 0x9cb5, 0x15f1,
      0x8000, 0x9886},
     0x00000000,
     0x00000000},
    // Products far below 2^-126: terms cut at 2^-158 (alignment exponent floored at -133), then the
    // sum truncated to the subnormal grid.
    {{0x1a17, 0x8000, 0x1b64, 0x9cac, 0x9708, 0x99a4, 0x8000, 0x8000, 0x8000, 0x8000, 0x0000, 0x9ced, 0x1468, 0x8000,
      0x1a19, 0x966e},
     {0x1481, 0x1c71, 0x9687, 0x1885, 0x16aa, 0x0000, 0x8000, 0x1576, 0x9b8c, 0x1aae, 0x8000, 0x9689, 0x1cd4, 0x1912,
      0x1a1c, 0x9ada},
     0x00000000,
     0x80000001},
    {{0x1a17, 0x8000, 0x1b64, 0x9cac, 0x9708, 0x99a4, 0x8000, 0x8000, 0x8000, 0x8000, 0x0000, 0x9ced, 0x1468, 0x8000,
      0x1a19, 0x966e},
     {0x960e, 0x97bc, 0x8000, 0x9e01, 0x15bd, 0x940b, 0x16bd, 0x97a3, 0x997b, 0x95bb, 0x9adf, 0x18f2, 0x199c, 0x8000,
      0x942f, 0x0000},
     0x00000000,
     0x000015a3},
    {{0x14bf, 0x9c4d, 0x95ff, 0x0000, 0x8000, 0x1cdc, 0x1dd9, 0x9bd4, 0x9b0e, 0x1df9, 0x9bd4, 0x17d3, 0x1c49, 0x8000,
      0x8000, 0x14ab},
     {0x99d6, 0x8000, 0x188b, 0x98c4, 0x14d1, 0x1559, 0x9b16, 0x9b44, 0x0000, 0x0000, 0x9411, 0x8000, 0x9461, 0x0000,
      0x1566, 0x0000},
     0x80000000,
     0x800001d3},
    {{0x1abe, 0x18b7, 0x982c, 0x9cb7, 0x19e2, 0x9456, 0x95c8, 0x9944, 0x9476, 0x8000, 0x15d5, 0x1448, 0x1421, 0x0000,
      0x1d97, 0x1572},
     {0x1d97, 0x1454, 0x1c05, 0x0000, 0x9735, 0x98cb, 0x9d4c, 0x1c01, 0x196f, 0x1c71, 0x9d3b, 0x9d4a, 0x9d34, 0x9c2a,
      0x9abf, 0x9735},
     0x00000000,
     0x80000004},
    {{0x9505, 0x9800, 0x1d26, 0x162f, 0x1d44, 0x169c, 0x9945, 0x8000, 0x9645, 0x8000, 0x186d, 0x988c, 0x9937, 0x16f3,
      0x0000, 0x9b43},
     {0x18e8, 0x0000, 0x1cfc, 0x9a69, 0x9982, 0x9e0e, 0x94ca, 0x9482, 0x8000, 0x1613, 0x8000, 0x15f6, 0x8000, 0x9b0e,
      0x0000, 0x1be3},
     0x00000000,
     0x000009f1},
    {{0x9bac, 0x8000, 0x9843, 0x1a6b, 0x1709, 0x0000, 0x164f, 0x18f9, 0x144a, 0x955e, 0x9937, 0x96f0, 0x1bf7, 0x96cf,
      0x9a94, 0x9ac6},
     {0x1882, 0x0000, 0x1458, 0x1db4, 0x19a4, 0x1bbc, 0x8000, 0x1a35, 0x1dc2, 0x1cd6, 0x957f, 0x9478, 0x9aa9, 0x8000,
      0x1a14, 0x15d2},
     0x00000000,
     0x0000008f},
    {{0x9d67, 0x8000, 0x17e9, 0x9d72, 0x9a0c, 0x8000, 0x0000, 0x0000, 0x976c, 0x149f, 0x1cc1, 0x9927, 0x9c03, 0x9913,
      0x95e8, 0x946a},
     {0x96a7, 0x17c7, 0x1704, 0x9729, 0x16a0, 0x18fa, 0x9db8, 0x9cd9, 0x1e3b, 0x9b3e, 0x95a5, 0x1d48, 0x1dab, 0x8000,
      0x0000, 0x1ccf},
     0x00000000,
     0x8000058b},
};

TEST(TensorCoreModel, ReproducesObservedHardwareOutputs) {
  for (const HardwareCase& hc : kCases) {
    bf16 a[16], b[16];
    for (int i = 0; i < 16; ++i) a[i] = bf16{hc.a[i]}, b[i] = bf16{hc.b[i]};
    EXPECT_EQ(bits_of(HopperBf16Step{}(float_of(hc.c), a, b)), hc.d) << std::hex << "expected 0x" << hc.d;
  }
}

// 1*1 + (-1)*1 + 2^-13 * 2^-12: the small product survives the cancellation exactly.
TEST(TensorCoreModel, SmallTermSurvivesCancellation) {
  bf16 a[16] = {}, b[16] = {};
  a[0] = to_bf16(1.0f), b[0] = to_bf16(1.0f);
  a[1] = to_bf16(-1.0f), b[1] = to_bf16(1.0f);
  a[2] = to_bf16(0x1p-13f), b[2] = to_bf16(0x1p-12f);
  EXPECT_EQ(HopperBf16Step{}(0.0f, a, b), 0x1p-25f);
}

// Terms 26 binades below the largest are truncated away before the exact sum: eight 2^-26 terms
// add nothing to 1, while a sequential fp32 chain that meets them first carries them to 1 + 2^-23.
TEST(TensorCoreModel, TruncatesTermsBelowTheKeptBits) {
  bf16 a[16] = {}, b[16] = {};
  for (int i = 0; i < 8; ++i) a[i] = to_bf16(0x1p-26f), b[i] = to_bf16(1.0f);
  a[8] = to_bf16(1.0f), b[8] = to_bf16(1.0f);
  EXPECT_EQ(HopperBf16Step{}(0.0f, a, b), 1.0f);
  EXPECT_EQ(Fp32FmaStep{}(0.0f, a, b), 1.0f + 0x1p-23f);
}

// Operands of one K-step: random bf16 bit patterns (NaN and Inf included), or values whose products
// land near the subnormal range, or exact cancellation pairs (sums that truncate to zero).
void random_operands(TestRng& rng, int kind, bf16 (&a)[16], bf16 (&b)[16]) {
  for (int i = 0; i < 16; ++i) {
    if (kind == 0) {
      a[i] = bf16{uint16_t(rng.next())}, b[i] = bf16{uint16_t(rng.next())};
    } else if (kind == 1) {
      a[i] = to_bf16(std::ldexp(rng.symmetric(1.0f), -60 - rng.below(30)));
      b[i] = to_bf16(std::ldexp(rng.symmetric(1.0f), -40 - rng.below(30)));
    } else {
      a[i] = to_bf16(rng.symmetric(4.0f)), b[i] = to_bf16(rng.symmetric(4.0f));
      if (i % 2) a[i] = bf16{uint16_t(a[i - 1].bits ^ 0x8000u)}, b[i] = b[i - 1];
    }
  }
}

// The megakernel runs weight-gradient chains in whole K-blocks of 64 rows, so a chain may take up to
// three more K-steps over zero padding rows than the reference (docs/numerics.md). Such a step must
// return its C bit for bit, and no chain from +0 may reach -0 (the one C a zero step would change).
TEST(TensorCoreModel, ZeroPaddingStepsChangeNoBit) {
  TestRng rng(20261129);
  bf16 zero_a[16], zero_b[16];
  for (int i = 0; i < 16; ++i)  // padding rows hold +0; their products with either sign are +-0
    zero_a[i] = bf16{uint16_t(i % 3 ? 0x0000 : 0x8000)}, zero_b[i] = bf16{uint16_t(i % 2 ? 0x8000 : 0x0000)};
  int changed = 0, negative_zero = 0;
  for (int trial = 0; trial < 30000; ++trial) {
    float c = 0.0f;
    const int steps = 1 + rng.below(4), kind = rng.below(3);
    for (int s = 0; s < steps; ++s) {
      bf16 a[16], b[16];
      random_operands(rng, kind, a, b);
      c = HopperBf16Step{}(c, a, b);
      negative_zero += bits_of(c) == 0x80000000u;
    }
    float padded = c;
    for (int extra = 0; extra < 3; ++extra) padded = HopperBf16Step{}(padded, zero_a, zero_b);
    changed += bits_of(padded) != bits_of(c);
  }
  EXPECT_EQ(changed, 0);
  EXPECT_EQ(negative_zero, 0);
}

}  // namespace
}  // namespace mok::test
