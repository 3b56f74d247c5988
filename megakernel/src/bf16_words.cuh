// bf16 values two to a 32-bit word, as the kernels move them (the lower address in the low half):
// register pairs packed here and unpacked with core's low_float / high_float (shifts), never as
// separate 16-bit registers (which ptxas spills, 16 bits at a time, in the fp8 kernels).
#pragma once

#include "mok/core/bf16.h"
#include "mok/core/fp8.h"

namespace mok::gpu {

// Two floats rounded to bf16, packed as one 32-bit word (v0 in the low half: the lower address).
__device__ __forceinline__ uint32_t pack_bf16(float v0, float v1) { return to_bf16x2(v0, v1); }

// The larger bf16 magnitude of a word's two, as bits (finite magnitudes order as their bits): a term of
// a block's amax (the core's quantize_block).
__device__ __forceinline__ uint32_t magnitude_bits(uint32_t w) { return max(w & 0x7fffu, (w >> 16) & 0x7fffu); }
// A word's two values scaled by 2^-e and rounded to E4M3 (to_e4m3x2_scaled), the low value's code in the
// low byte.
__device__ __forceinline__ uint32_t e4m3x2_of(uint32_t w, int e) {
  return to_e4m3x2_scaled(low_float(w), high_float(w), e);
}

}  // namespace mok::gpu
