// E4M3 conversion (mok/core/fp8.h) against an oracle that knows nothing of its bit manipulation: the
// nearest of the 127 non-negative finite codes by exact distance (ties to the even code), then the
// sign, saturation past 448 and NaN; on every float of a stride through all 2^32, every midpoint
// between codes and its neighbours, and the special values.
#include "mok/core/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace mok {
namespace {

// The non-negative finite codes' values, increasing with the code.
// The value of each non-negative finite code from E4M3's definition, not from the code under test:
// exponent field e, mantissa m; subnormal m 2^-9 where e = 0, else (1 + m / 8) 2^(e - 7).
std::vector<double> code_values() {
  std::vector<double> v;
  for (int c = 0; c <= kE4m3Max; ++c) {
    const int e = c >> 3, m = c & 7;
    v.push_back(e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, e - 7));
  }
  return v;
}

uint8_t oracle(float f) {
  static const std::vector<double> values = code_values();
  if (std::isnan(f)) return kE4m3Nan;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const double a = std::fabs(double(f));
  if (a >= values.back()) return sign | kE4m3Max;
  int c = 0;
  while (values[c + 1] <= a) ++c;
  const double below = a - values[c], above = values[c + 1] - a;  // exact: doubles hold both
  const int nearest = below < above ? c : above < below ? c + 1 : (c % 2 == 0 ? c : c + 1);
  return uint8_t(sign | nearest);
}

void expect_converts(float f) {
  ASSERT_EQ(to_e4m3(f).bits, oracle(f)) << "float " << f << " (0x" << std::hex << bits_of(f) << ")";
}

TEST(E4m3, DecodesEveryCode) {
  EXPECT_EQ(to_float(fp8_e4m3{0x01}), 0x1p-9f);  // smallest subnormal
  EXPECT_EQ(to_float(fp8_e4m3{0x07}), 7 * 0x1p-9f);
  EXPECT_EQ(to_float(fp8_e4m3{0x08}), 0x1p-6f);  // smallest normal
  EXPECT_EQ(to_float(fp8_e4m3{0x38}), 1.0f);
  EXPECT_EQ(to_float(fp8_e4m3{0x7e}), 448.0f);
  EXPECT_EQ(to_float(fp8_e4m3{0xfe}), -448.0f);
  EXPECT_EQ(bits_of(to_float(fp8_e4m3{0x80})), 0x80000000u);  // -0
  EXPECT_TRUE(std::isnan(to_float(fp8_e4m3{0x7f})));
  EXPECT_TRUE(std::isnan(to_float(fp8_e4m3{0xff})));
  const std::vector<double> values = code_values();
  for (int c = 0; c <= kE4m3Max; ++c) {  // every finite code, either sign, is its defined value
    EXPECT_EQ(double(to_float(fp8_e4m3{uint8_t(c)})), values[size_t(c)]) << "code " << c;
    EXPECT_EQ(double(to_float(fp8_e4m3{uint8_t(0x80 | c)})), -values[size_t(c)]) << "code " << (0x80 | c);
  }
  for (int c = 0; c < 256; ++c) {  // every code but NaN comes back from its value
    const fp8_e4m3 v{uint8_t(c)};
    if (!is_nan(v)) {
      EXPECT_EQ(to_e4m3(to_float(v)).bits, c) << "code " << c;
    }
  }
}

TEST(E4m3, SpecialValues) {
  EXPECT_EQ(to_e4m3(std::numeric_limits<float>::infinity()).bits, 0x7e);
  EXPECT_EQ(to_e4m3(-std::numeric_limits<float>::infinity()).bits, 0xfe);
  EXPECT_EQ(to_e4m3(std::numeric_limits<float>::quiet_NaN()).bits, 0x7f);
  EXPECT_EQ(to_e4m3(-std::numeric_limits<float>::quiet_NaN()).bits, 0x7f);
  EXPECT_EQ(to_e4m3(464.0f).bits, 0x7e);  // past 448: saturated, not the NaN pattern 480 would take
  EXPECT_EQ(to_e4m3(1e30f).bits, 0x7e);
  EXPECT_EQ(to_e4m3(-0.0f).bits, 0x80);
  EXPECT_EQ(to_e4m3(0x1p-10f).bits, 0x00);                        // half the smallest subnormal: tie to even 0
  EXPECT_EQ(to_e4m3(std::nextafter(0x1p-10f, 1.0f)).bits, 0x01);  // just above: up
  EXPECT_EQ(to_e4m3(3 * 0x1p-10f).bits, 0x02);                    // between 1 and 2 units: tie to even 2
  EXPECT_EQ(to_e4m3(15 * 0x1p-10f).bits, 0x08);                   // 7.5 units: the smallest normal
  EXPECT_EQ(to_e4m3(std::numeric_limits<float>::denorm_min()).bits, 0x00);
}

TEST(E4m3, EveryMidpointAndItsNeighbours) {
  const std::vector<double> values = code_values();
  for (size_t c = 0; c + 1 < values.size(); ++c) {
    const float mid = float((values[c] + values[c + 1]) / 2);  // exact: one more bit than E4M3 has
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1000.0f)}) {
      expect_converts(f);
      expect_converts(-f);
    }
  }
}

TEST(E4m3, AStrideThroughEveryFloat) {
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 4099) expect_converts(float_of(uint32_t(u)));
}

TEST(E4m3, ScaleExponentIsTheSmallestThatFits) {
  EXPECT_EQ(e4m3_scale_exponent(448.0f), 0);
  EXPECT_EQ(e4m3_scale_exponent(std::nextafter(448.0f, 1e9f)), 1);
  EXPECT_EQ(e4m3_scale_exponent(1.0f), -8);  // 1 <= 1.75, and 1 > 448 / 512
  EXPECT_EQ(e4m3_scale_exponent(-1.0f), -8);
  EXPECT_EQ(e4m3_scale_exponent(0.0f), 0);
  EXPECT_EQ(e4m3_scale_exponent(std::numeric_limits<float>::denorm_min()), -126);
  for (uint64_t u = 0x00800000u; u < 0x7f800000u; u += 7919) {  // every stride of positive normal floats
    const float amax = float_of(uint32_t(u));
    const int e = e4m3_scale_exponent(amax);
    ASSERT_LE(double(amax) * std::ldexp(1.0, -e), 448.0) << amax;
    if (e > -126) {
      ASSERT_GT(double(amax) * std::ldexp(1.0, 1 - e), 448.0) << amax;
    }
    ASSERT_EQ(to_e4m3_scaled(amax, e).bits, to_e4m3(float(double(amax) * std::ldexp(1.0, -e))).bits) << amax;
  }
}

}  // namespace
}  // namespace mok
