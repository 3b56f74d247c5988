// Thin wrappers of the tensor-core instruction the megakernel uses (one place for inline PTX).
//   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: D = A(16x16) B(16x8) + C, one K-step of
//   mok/core/kstep.h per output element (HopperBf16Step models its arithmetic bit for bit).
// Fragment layout (PTX ISA "mma.m16n8k16"), lane = 4 * group + quad:
//   A regs: {A[group][2q..2q+1]}, {A[group+8][2q..]}, {A[group][2q+8..]}, {A[group+8][2q+8..]}
//   B regs: {B[2q..2q+1][group]}, {B[2q+8..2q+9][group]}       (low half = lower k)
//   C/D:    D[group][2q], D[group][2q+1], D[group+8][2q], D[group+8][2q+1]
#pragma once

#include <cstdint>

namespace mok::gpu::ptx {

struct FragA {
  uint32_t r[4];
};
struct FragB {
  uint32_t r[2];
};
struct FragC {
  float v[4];
};

// D = A B + D, one m16n8k16 K-step (the fragments above).
__device__ __forceinline__ void mma_bf16_16816(FragC& d, const FragA& a, const FragB& b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d.v[0]), "+f"(d.v[1]), "+f"(d.v[2]), "+f"(d.v[3])
      : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
}

// Two bf16 bit patterns as one fragment register (lo: the lower index).
__device__ __forceinline__ uint32_t pack_bf16(uint16_t lo, uint16_t hi) { return uint32_t(lo) | (uint32_t(hi) << 16); }

}  // namespace mok::gpu::ptx
