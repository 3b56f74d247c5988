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

// A bf16 gradient accumulator's step as autograd takes it for bf16 parameters: the gradient rounded to
// bf16 (the op's output), then added to what is held in fp32 and rounded again (torch's bf16 add).
MOK_HD bf16 add_bf16_gradient(bf16 held, float gradient) {
  return to_bf16(to_float(held) + to_float(to_bf16(gradient)));
}

}  // namespace mok
