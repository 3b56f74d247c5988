// The FP8 mode's GEMM (issue 19; docs/numerics.md, "The FP8 layer mode"), DeepSeek-V3's recipe on
// Hopper's FP8 tensor cores. One implementation for the CPU reference and the GPU:
//
//   quantize_block(src, rows, cols, ...)   a block of bf16 values to E4M3 with one power-of-two scale
//                                          2^e from the block's largest magnitude (1 x 128 for the A
//                                          operand, 128 x 128 for the weights);
//   fp8_gemm_element(a, a_exp, b, b_exp, k) one output element: per 128-wide K block in K order, four
//                                          k32 tensor-core steps from +0 (Fp8StepModel::hopper()),
//                                          then promoted to the fp32 total as total + partial 2^(ea + eb).
//
// The weights' blocks are squares of W's rows and columns: W^T's blocks are the same squares, with the
// same largest magnitude and so the same scale and the same E4M3 values, transposed. So one scale per
// 128 x 128 block serves the forward (B = W) and the input gradients (B = W^T).
#pragma once

#include "mok/core/bf16.h"
#include "mok/core/config.h"
#include "mok/core/fp8_dot.h"

namespace mok {

inline constexpr int kFp8StepsPerBlock = kFp8Block / kFp8StepK;

// x 2^s for a finite x, rounded once to nearest even (a result below the normal range rounds once to a
// subnormal or zero, one past it is +-Inf), for s in [-252, 254] (two scale exponents summed). Within
// the normal range the product is exact. Where 2^s is no normal float, a first exact product brings x
// next to the range: x 2^(s + 126) is exact unless it is below 2^-126, and then the result is below
// 2^-252, zero whatever that product rounded to; x 2^127 is exact unless it overflows, and then so does
// the result.
MOK_HD float scale_by_exp2(float x, int s) {
  if (s > 127) return (x * exp2_of(127)) * exp2_of(s - 127);
  if (s < -126) return (x * exp2_of(s + 126)) * exp2_of(-126);
  return x * exp2_of(s);
}

// The scale exponent of a block whose largest magnitude, as bf16 bits (v.bits & 0x7fff: finite
// magnitudes order as their bits), is `amax_bits`: every quantizer's, on the CPU and the GPU alike.
MOK_HD int block_scale_exponent(uint32_t amax_bits) { return e4m3_scale_exponent(to_float(bf16{uint16_t(amax_bits)})); }

// Quantizes a block of finite bf16 values (rows x cols, rows `stride` apart) into dst (rows
// `dst_stride` apart) as E4M3 values v 2^-e, e = e4m3_scale_exponent(the block's largest |v|); returns
// e. The scaling is exact (a value it would take below 2^-126 rounds to a signed zero in E4M3 either
// way), so each element is rounded once, to nearest even; the largest lands in [224, 448] unless the
// block is zero or its largest magnitude is below 2^-118 (e stops at -126). Offsets in 64 bits: 127
// rows of a K past 2^24 pass int.
MOK_HD int quantize_block(const bf16* src, int rows, int cols, int stride, fp8_e4m3* dst, int dst_stride) {
  uint32_t amax = 0;  // the largest magnitude's bits: finite magnitudes order as their bits
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const uint32_t magnitude = src[int64_t(r) * stride + c].bits & 0x7fffu;
      amax = magnitude > amax ? magnitude : amax;
    }
  const int e = block_scale_exponent(amax);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      dst[int64_t(r) * dst_stride + c] = to_e4m3_scaled(to_float(src[int64_t(r) * stride + c]), e);
  return e;
}

// One output element of an FP8 GEMM: a and b hold k E4M3 values (k a multiple of 128), a_exp and b_exp
// the scale exponents of their k / 128 blocks. Per block: partial = four Fp8StepModel::hopper() steps
// from +0 (the tensor core's accumulator, 13 fraction bits), then total = total + partial 2^(ea + eb),
// the product rounded once (scale_by_exp2) and the sum an fp32 add (round to nearest even), total
// starting from +0: the GPU's promotion from the tensor core to CUDA-core registers every 128 of K. A NaN
// total (blocks that overflowed to +Inf and -Inf) is the canonical one, as the GPU's add writes it.
MOK_HD float fp8_gemm_element(const fp8_e4m3* a, const int* a_exp, const fp8_e4m3* b, const int* b_exp, int k) {
  constexpr Fp8StepModel step = Fp8StepModel::hopper();
  float total = 0.0f;
  for (int block = 0; block < k / kFp8Block; ++block) {
    float partial = 0.0f;
    for (int s = 0; s < kFp8StepsPerBlock; ++s) {
      const int first = block * kFp8Block + s * kFp8StepK;
      partial = step(partial, a + first, b + first);
    }
    total = total + scale_by_exp2(partial, a_exp[block] + b_exp[block]);
  }
  return canonical_nan(total);
}

}  // namespace mok
