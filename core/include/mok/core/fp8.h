// FP8 E4M3, the element type of Hopper's FP8 tensor cores (issue 19's numerics; docs/numerics.md):
// 1 sign, 4 exponent (bias 7) and 3 fraction bits, no infinities; S.1111.111 is NaN; the largest
// finite value is 448 (0x7e), the smallest subnormal 2^-9. One implementation for CPU and GPU.
//
//   to_e4m3(f)            round to nearest, ties to even, saturating (the rule of PTX's
//                         cvt.rn.satfinite.e4m3x2.f32): a value past 448 and +-Inf give +-448, NaN
//                         the NaN 0x7f, -0 gives -0 (0x80);
//   to_float(v)           exact;
//   e4m3_scale_exponent   a block's power-of-two scale 2^e from its largest magnitude: the smallest e
//                         with amax 2^-e <= 448. Power-of-two scales make the scaling and the
//                         fp32 promotion exact, so the rounding points of the FP8 mode are the E4M3
//                         rounding and the tensor core's accumulation alone;
//   to_e4m3_scaled(f, e)  to_e4m3(f 2^-e), the scaling exact;
//   to_e4m3x2(lo, hi)     two conversions, lo's code in the low byte: on the GPU one instruction
//                         (to_e4m3x2_scaled: the scaled pair).
#pragma once

#include "mok/core/host_device.h"

namespace mok {

struct fp8_e4m3 {
  uint8_t bits;
};

inline constexpr uint8_t kE4m3Max = 0x7e;  // 448
inline constexpr uint8_t kE4m3Nan = 0x7f;

MOK_HD bool is_nan(fp8_e4m3 v) { return (v.bits & 0x7fu) == kE4m3Nan; }

MOK_HD float to_float(fp8_e4m3 v) {
  const uint32_t sign = uint32_t(v.bits & 0x80u) << 24, exponent = (v.bits >> 3) & 0xfu, fraction = v.bits & 0x7u;
  if (is_nan(v)) return float_of(sign | 0x7fc00000u);
  if (exponent == 0) return float_of(sign | bits_of(float(fraction) * 0x1p-9f));  // subnormal: exact
  return float_of(sign | (exponent - 7 + 127) << 23 | fraction << 20);
}

// v >> shift rounded to nearest, ties to even (shift >= 1).
MOK_HD uint32_t shift_right_rne(uint32_t v, int shift) {
  if (shift >= 32) return 0;  // v < 2^32 <= half a unit of the result: rounds to 0
  const uint32_t kept = v >> shift, dropped = v & ((1u << shift) - 1u), half = 1u << (shift - 1);
  return kept + (dropped > half || (dropped == half && (kept & 1u)));
}

MOK_HD fp8_e4m3 to_e4m3(float f) {
  const uint32_t u = bits_of(f), sign = (u >> 24) & 0x80u, magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return fp8_e4m3{kE4m3Nan};
  if (magnitude >= 0x43e00000u) return fp8_e4m3{uint8_t(sign | kE4m3Max)};  // >= 448, Inf included
  const int exponent = int(magnitude >> 23) - 127;
  if (exponent >= -6) {  // an E4M3 normal: rebias the exponent, round the fraction from 23 to 3 bits
    const uint32_t rebiased = uint32_t(exponent + 7) << 23 | (magnitude & 0x7fffffu);
    return fp8_e4m3{uint8_t(sign | shift_right_rne(rebiased, 20))};  // a carry moves up the exponent
  }
  // Below 2^-6: a count of 2^-9 units (8 of them: the smallest normal, 0x08). Float subnormals are far
  // below half a unit.
  if (exponent == -127) return fp8_e4m3{uint8_t(sign)};
  const uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;  // f = significand 2^(exponent - 23)
  return fp8_e4m3{uint8_t(sign | shift_right_rne(significand, 14 - exponent))};
}

// The smallest e >= -126 with amax 2^-e <= 448 = 1.75 2^8, for a finite amax (amax = 1.f 2^E: e = E - 8,
// or E - 7 where 1.f > 1.75); an all-zero block gives 0. (-126 keeps 2^-e a float; a block whose
// largest magnitude is below 2^-118 is scaled by 2^126 and lands well inside E4M3's range.)
MOK_HD int e4m3_scale_exponent(float amax) {
  const uint32_t u = bits_of(amax) & 0x7fffffffu;
  if (u == 0) return 0;
  const int e = int(u >> 23) - 127 - 8 + ((u & 0x7fffffu) > 0x600000u);
  return e < -126 ? -126 : e;
}

// 2^e as a float, e in [-126, 127].
MOK_HD float exp2_of(int e) { return float_of(uint32_t(e + 127) << 23); }

// f 2^-e to E4M3, for the exponents a scale takes ([-126, 120]).
MOK_HD fp8_e4m3 to_e4m3_scaled(float f, int e) { return to_e4m3(f * exp2_of(-e)); }

// to_e4m3 of lo (low byte) and of hi (high byte). The GPU's quantizers convert with this, for speed:
// on the device it is the hardware conversion, cvt.rn.satfinite.e4m3x2.f32 (one F2FP for two values, in
// place of some 25 integer instructions for each), whose first source goes to the upper byte; elsewhere
// it is to_e4m3 twice. mok-scalar-check (megakernel/tools/scalar_check.cu) checks on the GPU that the two
// are equal on every one of the 2^32 floats in either half.
MOK_HD uint16_t to_e4m3x2(float lo, float hi) {
#if defined(__CUDA_ARCH__)
#if __CUDA_ARCH__ < 890
#error "to_e4m3x2: cvt.rn.satfinite.e4m3x2.f32 needs sm_89 or later (mok compiles for sm_90a)"
#endif
  uint16_t codes;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(codes) : "f"(hi), "f"(lo));
  return codes;
#else
  return uint16_t(to_e4m3(lo).bits | to_e4m3(hi).bits << 8);
#endif
}

// to_e4m3_scaled of lo and of hi with the same e: to_e4m3x2(lo 2^-e, hi 2^-e).
MOK_HD uint16_t to_e4m3x2_scaled(float lo, float hi, int e) {
  const float scale = exp2_of(-e);
  return to_e4m3x2(lo * scale, hi * scale);
}

}  // namespace mok
