// TMA descriptors for the megakernel's row-major bf16 matrices.
#pragma once

#include <cuda.h>

#include <array>

namespace mok::gpu {

// Writes the descriptor of a row-major [rows, cols] bf16 matrix read in 64 x 64 boxes with the
// 128-byte swizzle (the layout the wgmma descriptors of tile_gemm.cuh expect) into `out`; all zeros
// for an empty matrix. Throws mok::Error if the driver rejects it. `out` is written in place, never
// returned by value: nvcc's host pass does not give stack temporaries CUtensorMap's 128-byte
// alignment, which g++ code writing them may assume.
void encode_tensor_map(CUtensorMap& out, const void* base, long rows, long cols);

// One layer's descriptors, re-encoded only when a matrix's base or shape changes: a training loop
// passes the same weights and, from a caching allocator, mostly the same buffers call after call, and
// each encode is a driver call on the host path. Matrix `slot` keeps its last descriptor.
class TensorMapCache {
 public:
  void encode(int slot, CUtensorMap& out, const void* base, long rows, long cols);

 private:
  struct Entry {
    CUtensorMap map{};
    const void* base = nullptr;
    long rows = -1, cols = -1;
  };
  std::array<Entry, 16> entries_{};
};

}  // namespace mok::gpu
