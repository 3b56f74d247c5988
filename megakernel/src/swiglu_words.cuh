// SwiGLU on bf16 words (two values each, bf16_words.cuh), the sigmoids of a batch of words taken at once
// (sigmoids_f32: one stretch of straight-line code, which the compiler interleaves).
#pragma once

#include "bf16_words.cuh"
#include "mok/core/swiglu.h"

namespace mok::gpu {

// s[2 j], s[2 j + 1]: sigmoid_f32(clamp_gate(.)) of gate word j's low and high values.
template <int kWords>
__device__ __forceinline__ void gate_sigmoids(const uint32_t* gate, float limit, float (&s)[2 * kWords]) {
#pragma unroll
  for (int j = 0; j < kWords; ++j) {
    s[2 * j] = clamp_gate(low_float(gate[j]), limit);
    s[2 * j + 1] = clamp_gate(high_float(gate[j]), limit);
  }
  sigmoids_f32(s);
}

// a[j] = bf16(swiglu(gate[j], up[j])) of kWords words, value by value, from their gate_sigmoids s.
template <int kWords>
__device__ __forceinline__ void swiglu_words_given_sigmoids(const uint32_t* gate, const uint32_t* up, float limit,
                                                            const float (&s)[2 * kWords], uint32_t* a) {
#pragma unroll
  for (int j = 0; j < kWords; ++j)
    a[j] = pack_bf16(swiglu_given_sigmoid(low_float(gate[j]), low_float(up[j]), limit, s[2 * j]),
                     swiglu_given_sigmoid(high_float(gate[j]), high_float(up[j]), limit, s[2 * j + 1]));
}

// a[j] = bf16(swiglu(gate[j], up[j])) of kWords words, value by value.
template <int kWords>
__device__ __forceinline__ void swiglu_words(const uint32_t* gate, const uint32_t* up, float limit, uint32_t* a) {
  float s[2 * kWords];
  gate_sigmoids<kWords>(gate, limit, s);
  swiglu_words_given_sigmoids<kWords>(gate, up, limit, s, a);
}

}  // namespace mok::gpu
