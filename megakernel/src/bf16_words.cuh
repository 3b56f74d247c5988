// bf16 values two to a 32-bit word, as the kernels move them (the lower address in the low half):
// register pairs unpacked and packed with shifts, never as separate 16-bit registers (which ptxas
// spills, 16 bits at a time, in the fp8 kernels).
#pragma once

#include "mok/core/bf16.h"

namespace mok::gpu {

// Two floats rounded to bf16, packed as one 32-bit word (v0 in the low half: the lower address).
__device__ __forceinline__ uint32_t pack_bf16(float v0, float v1) {
  return uint32_t(to_bf16(v0).bits) | (uint32_t(to_bf16(v1).bits) << 16);
}
__device__ __forceinline__ float low_float(uint32_t w) { return to_float(bf16{uint16_t(w & 0xffffu)}); }
__device__ __forceinline__ float high_float(uint32_t w) { return to_float(bf16{uint16_t(w >> 16)}); }

}  // namespace mok::gpu
