// Row-major products in the shared K-step order: C[m, n] = chain_k A[m, k] * B[n, k].
#pragma once

#include <vector>

#include "mok/core/config.h"
#include "mok/core/kstep.h"

namespace mok::ref {

// K a multiple of 16. accumulate: each chain starts from C's value instead of +0 (weight gradients
// continued across ring minibatches).
void matmul(StepModel step, const bf16* a, int m, const bf16* b, int n, int k, float* c, bool accumulate = false);

// The product of the forward's and the input gradients' GEMMs in the layer's precision: bf16, the
// K-step chain of `step`; fp8, A quantized in 1 x 128 blocks along K, B in 128 x 128 blocks
// (mok/core/fp8_gemm.h: E4M3, power-of-two scales) and multiplied by the FP8 rule whatever `step` is.
// In fp8, K is a multiple of 128.
void matmul(StepModel step, Precision precision, const bf16* a, int m, const bf16* b, int n, int k, float* c);

// C = A B^T on E4M3 operands (mok/core/fp8_gemm.h): A quantized in 1 x 128 blocks along K, B in
// b_block_rows x 128 blocks (128: a weight; 1: an activation, as both operands of a weight gradient).
// K a multiple of 128.
void matmul_fp8(const bf16* a, int m, const bf16* b, int n, int k, int b_block_rows, float* c);

// [rows, cols] -> [cols, rows rounded up to `multiple`], zero-padded.
std::vector<bf16> transpose_padded(const bf16* src, int rows, int cols, int multiple = kStepK);

inline int round_up16(int v) { return (v + kStepK - 1) / kStepK * kStepK; }

}  // namespace mok::ref
