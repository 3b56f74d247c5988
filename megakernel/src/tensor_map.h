// TMA descriptors for the megakernel's row-major bf16 matrices.
#pragma once

#include <cuda.h>

#include <array>

namespace mok::gpu {

// A matrix's elements: bf16, or the fp8 mode's E4M3 (one byte), both read as GEMM operands; or fp32 or
// bf16 (bf16_out), an output the epilogue copies out (the weight gradients').
enum class MapElement { bf16, e4m3, f32, bf16_out };

// Writes the descriptor of a row-major [rows, cols] matrix into `out`; all zeros for an empty matrix.
// An operand (bf16, E4M3) is read in boxes of 64 rows x 128 bytes (64 bf16 or 128 E4M3) with the
// 128-byte swizzle (the layout the wgmma descriptors of tile_gemm.cuh expect); an output is written in
// boxes of 64 rows x 64 bytes (16 fp32 or 32 bf16) with the 64-byte swizzle (the epilogue's chunks,
// store_rows_by_tma); box_rows other than 64 gives an operand map of smaller boxes (mok-gather-probe's
// rows one at a time). Throws mok::Error if the driver rejects it. `out` is written in place, never
// returned by value: nvcc's host pass does not give stack temporaries CUtensorMap's 128-byte
// alignment, which g++ code writing them may assume.
void encode_tensor_map(CUtensorMap& out, const void* base, long rows, long cols, MapElement element = MapElement::bf16,
                       int box_rows = 64);

// One layer's descriptors, re-encoded only when a matrix's base or shape changes: a training loop
// passes the same weights and, from a caching allocator, mostly the same buffers call after call, and
// each encode is a driver call on the host path. Matrix `slot` keeps its last descriptor.
class TensorMapCache {
 public:
  void encode(int slot, CUtensorMap& out, const void* base, long rows, long cols,
              MapElement element = MapElement::bf16);

 private:
  struct Entry {
    CUtensorMap map{};
    const void* base = nullptr;
    long rows = -1, cols = -1;
    MapElement element = MapElement::bf16;
  };
  std::array<Entry, 40> entries_{};  // TensorMaps' 37
};

}  // namespace mok::gpu
