// The fp8 weight gradients' operands (LaunchConfig::fp8_weight_gradients; the reference's
// Options::fp8_weight_gradients): dh, xe, dye and a of this GPU's padded rows, each transposed and
// quantized per column in 1 x 128 blocks along its rows (Fp8Columns). A tile's 128 rows are one
// expert's, so a block is the reference's block of that expert's rows, padding rows (zeros) included.
// A block of the grid takes one (tile, operand) at a time and walks its columns 128 at a time: 256
// threads each read an 8 x 8 square of bf16 values, the column maxima meet in
// shared memory, each column's e = block_scale_exponent(its largest magnitude) (quantize_block's), and each thread
// converts its square column by column (to_e4m3x2_scaled, two rows of a column at a time: the core's codes) into a
// shared 128 x 128 tile of codes, transposed; the block then writes the tile's 128-byte rows. The tile is XOR-swizzled
// in 8-byte chunks (chunk ^ row / 8), so the squares' column writes spread over the banks.
#pragma once

#include "mok/core/fp8_gemm.h"
#include "mok/megakernel/ptx/wgmma.cuh"
#include "schedule.cuh"
#include "tile_gemm.cuh"

namespace mok::gpu {

inline constexpr int kSquare = 8;                           // a thread's 8 x 8 values
inline constexpr int kSquares = kFp8Block / kSquare;        // 16 along a block's side
inline constexpr int kSquareThreads = kSquares * kSquares;  // 256 of the block's threads
static_assert(kSquareThreads <= kThreads && kSquare * sizeof(bf16) == sizeof(uint4), "a square's row is one vector");
static_assert(kTileRows == kFp8Block, "a tile's rows are one block of each column");

struct ColumnBlockSmem {
  uint32_t amax[kSquareThreads / 32][kFp8Block];  // each warp's column maxima (its two row groups')
  int e[kFp8Block];                               // each column's scale exponent
  int2 range[kFp8Block / 32];                     // each column warp's smallest and largest e
  uint2 codes[kFp8Block][kSquares];               // [column][row group ^ column / 8]: 8 codes each
};

// The i-th operand: its [P, cols] rows, its quantized copy and the copy's tensor map (a member of
// p.maps), and its role: A (dh, dye: the copy holds exponents, which the stage carries per row of A) or
// B (xe, a: scales and each tile's exponent range). Operands 2 g and 2 g + 1 are the A and B of dW1
// (g = 0) and dW2 (g = 1).
struct GradOperand {
  using MapMember = CUtensorMap TensorMaps::*;
  const bf16* rows;
  int cols;
  Fp8Columns q;
  MapMember map;
  bool b;
};
inline constexpr int kGradOperandCount = 4;
__device__ inline GradOperand grad_operand(const Params& p, int i) {
  const int H = p.c.hidden, I = p.c.intermediate;
  switch (i) {
    case 0:
      return {p.dh, 2 * I, p.dhtq, &TensorMaps::dhtq, false};
    case 1:
      return {p.xe, H, p.xetq, &TensorMaps::xetq, true};
    case 2:
      return {p.dye, H, p.dyetq, &TensorMaps::dyetq, false};
    default:
      return {p.a, I, p.atq, &TensorMaps::atq, true};
  }
}

// This thread's square (< kSquareThreads) of columns [col0, col0 + 128) of tile `block`'s rows.
__device__ __forceinline__ void load_square(const GradOperand& o, int block, int col0, uint4 (&v)[kSquare]) {
  const int t = threadIdx.x, sc = t % kSquares, sr = t / kSquares;
  if (t >= kSquareThreads) return;
  const long row0 = long(block) * kTileRows + kSquare * sr;
#pragma unroll
  for (int r = 0; r < kSquare; ++r)
    v[r] = *reinterpret_cast<const uint4*>(o.rows + (row0 + r) * o.cols + col0 + kSquare * sc);
}

// Columns [col0, col0 + 128) of padded rows [pad0, pad0 + 128) (tile `block` of this GPU's) of one
// operand; e_low, e_high: this thread's (< 128: column col0 + thread) smallest and largest e so far.
__device__ inline void quantize_column_block(ColumnBlockSmem& s, const GradOperand& o, long P, int block, int col0,
                                             int& e_low, int& e_high) {
  const int t = threadIdx.x, sc = t % kSquares, sr = t / kSquares, warp = t / 32;
  const long pad0 = long(block) * kTileRows;
  uint4 v[kSquare] = {};
  load_square(o, block, col0, v);
  if (t < kSquareThreads) {
    uint32_t m[kSquare] = {};
#pragma unroll
    for (int r = 0; r < kSquare; ++r) {
      const uint32_t w[4] = {v[r].x, v[r].y, v[r].z, v[r].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        m[2 * j] = max(m[2 * j], w[j] & 0x7fffu);
        m[2 * j + 1] = max(m[2 * j + 1], (w[j] >> 16) & 0x7fffu);
      }
    }
#pragma unroll
    for (int j = 0; j < kSquare; ++j) m[j] = max(m[j], __shfl_xor_sync(~0u, m[j], 16));  // the warp's two row groups
    if (t % 32 < kSquares)
#pragma unroll
      for (int j = 0; j < kSquare; ++j) s.amax[warp][kSquare * sc + j] = m[j];
  }
  __syncthreads();
  if (t < kFp8Block) {
    uint32_t amax = 0;
#pragma unroll
    for (int w = 0; w < kSquareThreads / 32; ++w) amax = max(amax, s.amax[w][t]);
    const int e = block_scale_exponent(amax);
    s.e[t] = e;
    const long at = long(block) * column_scale_stride(o.cols) + col0 + t;
    if (o.b)
      o.q.scales[at] = exp2_of(e);
    else
      o.q.exps[at] = int8_t(e);
    e_low = min(e_low, e), e_high = max(e_high, e);
  }
  __syncthreads();
  if (t < kSquareThreads)
#pragma unroll
    for (int j = 0; j < kSquare; ++j) {  // column kSquare sc + j of the square, its 8 rows in order
      const int e = s.e[kSquare * sc + j];
      const auto value = [&](int r) {
        const uint32_t w[4] = {v[r].x, v[r].y, v[r].z, v[r].w};
        return to_float(bf16{uint16_t(w[j / 2] >> 16 * (j % 2))});
      };
      uint32_t codes[2];
#pragma unroll
      for (int r = 0; r < kSquare; r += 4)
        codes[r / 4] = uint32_t(to_e4m3x2_scaled(value(r), value(r + 1), e)) |
                       uint32_t(to_e4m3x2_scaled(value(r + 2), value(r + 3), e)) << 16;
      s.codes[kSquare * sc + j][sr ^ sc] = uint2{codes[0], codes[1]};
    }
  __syncthreads();
  // The tile's rows (the operand's columns), 16 bytes (two chunks) per thread at a time.
  for (int i = t; i < kFp8Block * kSquares / 2; i += blockDim.x) {
    const int row = i / (kSquares / 2), chunk = 2 * (i % (kSquares / 2)), swizzle = row / kSquare;
    const uint2 lo = s.codes[row][chunk ^ swizzle], hi = s.codes[row][(chunk + 1) ^ swizzle];
    *reinterpret_cast<uint4*>(o.q.values + long(col0 + row) * P + pad0 + kSquare * chunk) =
        uint4{lo.x, lo.y, hi.x, hi.y};
  }
  __syncthreads();  // the next column block reuses the tile
}

// Every (tile, operand) of this GPU's: the codes, A's exponents, B's scales (a row's padding past the
// operand's columns: 1, read by a tile's half past them and never stored) and each tile's exponent
// range of B. The block's shared memory is the GEMM stages', idle here.
__device__ inline void quantize_grad_operands(const Pipeline& pipe, const Params& p) {
  static_assert(sizeof(ColumnBlockSmem) <= sizeof(pipe.smem->stage), "the tile fits the stages");
  ColumnBlockSmem& s = *reinterpret_cast<ColumnBlockSmem*>(&pipe.smem->stage[0][0]);
  const int tiles = own_tile_end(p) - own_tile_begin(p), t = threadIdx.x;
  for (long unit = blockIdx.x; unit < long(tiles) * kGradOperandCount; unit += gridDim.x) {
    const int block = int(unit / kGradOperandCount);
    const GradOperand o = grad_operand(p, int(unit % kGradOperandCount));
    int e_low = 1 << 30, e_high = -(1 << 30);
    for (int col0 = 0; col0 < o.cols; col0 += kFp8Block)
      quantize_column_block(s, o, p.padded_rows, block, col0, e_low, e_high);
    if (!o.b) continue;  // the block's choice: o is the same in every thread
    const int stride = column_scale_stride(o.cols);
    for (int c = o.cols + t; c < stride; c += blockDim.x) o.q.scales[long(block) * stride + c] = 1.0f;
    if (t < kFp8Block) {
      e_low = __reduce_min_sync(~0u, e_low), e_high = __reduce_max_sync(~0u, e_high);
      if (t % 32 == 0) s.range[t / 32] = int2{e_low, e_high};
    }
    __syncthreads();
    if (t == 0) {
      int2 r = s.range[0];
      for (int w = 1; w < kFp8Block / 32; ++w) r = int2{min(r.x, s.range[w].x), max(r.y, s.range[w].y)};
      o.q.exp_range[block] = int4{r.x, r.y, 0, 0};
    }
    __syncthreads();
  }
  ptx::fence_async_shared();  // these generic writes come before the next GEMM's TMA writes to the stages
}

}  // namespace mok::gpu
