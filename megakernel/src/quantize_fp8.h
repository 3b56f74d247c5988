// The FP8 mode's weight quantization on the GPU (docs/numerics.md, "The FP8 layer mode"): bf16 master
// weights to E4M3 in 128 x 128 blocks with one power-of-two scale 2^e per block, bit for bit the core's
// quantize_block (mok/core/fp8_gemm.h) on each block, and the same blocks transposed (W^T's blocks are
// the same squares: the same scale and the same E4M3 codes) for the input gradients' K-major B operand.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "mok/core/bf16.h"
#include "mok/core/fp8.h"

namespace mok::gpu {

// w: `matrices` row-major bf16 matrices [rows, cols] back to back (rows, cols positive multiples of 128).
// q: the same shape in E4M3; q_t (may be null): each matrix transposed, [cols, rows], E4M3 — the same
// block squares, so the same scales and values, transposed; exps: [matrices, rows/128, cols/128] int32,
// the scale exponent of each block (quantize_block's return value); exps_t (may be null): the same
// exponents as W^T's table, [matrices, cols/128, rows/128] (the FP8 GEMM reads a B operand's table
// by B's block rows, so W^T as B needs it in this order). w, q and q_t 16-byte aligned.
// Stream-ordered and asynchronous, no allocation; bad arguments throw mok::Error before anything runs,
// a failed launch throws mok::Error too.
void quantize_weights_fp8(cudaStream_t stream, const bf16* w, int matrices, int rows, int cols, fp8_e4m3* q,
                          fp8_e4m3* q_t, int32_t* exps, int32_t* exps_t = nullptr);
// Its kernel (to load it before the first call: Layer's construction).
const void* quantize_kernel();

}  // namespace mok::gpu
