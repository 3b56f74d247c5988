// TMA descriptors for the megakernel's row-major bf16 matrices.
#pragma once

#include <cuda.h>

namespace mok::gpu {

// The descriptor of a row-major [rows, cols] bf16 matrix read in 64 x 64 boxes with the 128-byte
// swizzle (the layout the wgmma descriptors of tile_gemm.cuh expect); all zeros for an empty matrix.
// Throws mok::Error if the driver rejects it.
CUtensorMap tensor_map(const void* base, long rows, long cols);

}  // namespace mok::gpu
