// One source of truth for numerics shared by the CPU reference and the CUDA megakernel.
// In a plain C++ build the annotations expand to nothing, so reference/ stays free of CUDA.
#pragma once

#if defined(__CUDACC__)
#define MOK_HD __host__ __device__ __forceinline__
#else
#define MOK_HD inline
#endif
#if defined(__CUDA_ARCH__)
#define MOK_UNROLL _Pragma("unroll")  // a loop over a register array: fully unrolled, or the array spills
#else
#define MOK_UNROLL
#endif

#include <cstdint>
#include <cstring>

namespace mok {

MOK_HD uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

MOK_HD float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// Position of the highest set bit of a nonzero value.
MOK_HD int leading_bit(uint64_t v) {
#if defined(__CUDA_ARCH__)
  return 63 - __clzll(static_cast<long long>(v));
#else
  return 63 - __builtin_clzll(v);
#endif
}

MOK_HD int popcount32(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return __popc(v);
#else
  return __builtin_popcount(v);
#endif
}

// fma is exact-then-round-once on both sides (IEEE fusedMultiplyAdd); every other float step is a
// separate, uncontracted operation (host: -ffp-contract=off, device: --fmad=false).
MOK_HD float fma32(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}

// The NaN that the GPU's fp32 arithmetic writes, whichever NaN or invalid operation (Inf * 0, Inf - Inf)
// made it; x86 keeps an operand's payload, or writes 0xffc00000. An fp32 result that leaves a CUDA-core
// step (fma_chain, router_backward, add_f32_gradient) is made this NaN on both sides, so that its bits
// do not depend on which side computed it.
inline constexpr uint32_t kCanonicalNanF32 = 0x7fffffffu;

// Neither NaN nor Inf (x - x is 0 only for finite x; no libm call, the same test on both sides).
MOK_HD bool is_finite(float f) { return f - f == 0.0f; }

MOK_HD float canonical_nan(float v) { return v != v ? float_of(kCanonicalNanF32) : v; }

}  // namespace mok
