// HopperBf16Step against outputs the H200's mma.sync m16n8k16 produced (mok-tc-validate, 2026-11-29,
// docs/results/): cases where the rules differ from simpler models. Operands as printed, in hex.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>

#include "mok/core/kstep.h"

namespace mok {
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
    // Products far below 2^-126 with zero terms present: no -126 exponent floor for zeros.
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

}  // namespace
}  // namespace mok
