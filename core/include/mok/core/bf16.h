// bf16 storage type and its one rounding routine (round to nearest, ties to even).
#pragma once

#include "mok/core/host_device.h"

namespace mok {

struct bf16 {
  uint16_t bits;
};

MOK_HD float to_float(bf16 v) { return float_of(uint32_t(v.bits) << 16); }

MOK_HD bool is_finite(bf16 v) { return (v.bits & 0x7f80u) != 0x7f80u; }

// NaN maps to the canonical quiet NaN 0x7fc0 (sign dropped); finite values overflow to +-Inf.
MOK_HD bf16 to_bf16(float f) {
  const uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{0x7fc0};
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(rounded >> 16)};
}

// to_bf16 of lo (low half) and of hi (high half) as one word. On the device it is the hardware
// conversion, cvt.rn.bf16x2.f32 (one F2FP for two values, in place of some 5 integer instructions for
// each; its first source goes to the upper half), with its NaN (0x7fff) made to_bf16's 0x7fc0;
// elsewhere it is to_bf16 twice. mok-scalar-check (megakernel/tools/scalar_check.cu) checks on the GPU
// that the two are equal on every one of the 2^32 floats in either half.
MOK_HD uint32_t to_bf16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  uint32_t w;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
  if (lo != lo) w = (w & 0xffff0000u) | 0x7fc0u;
  if (hi != hi) w = (w & 0x0000ffffu) | 0x7fc00000u;
  return w;
#else
  return uint32_t(to_bf16(lo).bits) | uint32_t(to_bf16(hi).bits) << 16;
#endif
}

// A word's two bf16 values (the low half at the lower address) as floats.
MOK_HD float low_float(uint32_t w) { return to_float(bf16{uint16_t(w & 0xffffu)}); }
MOK_HD float high_float(uint32_t w) { return to_float(bf16{uint16_t(w >> 16)}); }

}  // namespace mok
