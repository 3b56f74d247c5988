// TMA descriptors for the megakernel's row-major bf16 matrices.
#pragma once

#include <cuda.h>

namespace mok::gpu {

// Writes the descriptor of a row-major [rows, cols] bf16 matrix read in 64 x 64 boxes with the
// 128-byte swizzle (the layout the wgmma descriptors of tile_gemm.cuh expect) into `out`; all zeros
// for an empty matrix. Throws mok::Error if the driver rejects it. `out` is written in place, never
// returned by value: nvcc's host pass does not give stack temporaries CUtensorMap's 128-byte
// alignment, which g++ code writing them may assume.
void encode_tensor_map(CUtensorMap& out, const void* base, long rows, long cols);

}  // namespace mok::gpu
