// GEMM1 + SwiGLU of the routed experts (h = bf16(xe W1^T), a = bf16(swiglu(h)) per padded row) and its
// epilogue, shared by the forward (this cycle's tiles) and, in recompute mode, the backward (every
// tile of this GPU's experts, before its ring cycles): one code, so the recomputed h and a are the
// forward's bits.
#pragma once

#include "bf16_words.cuh"
#include "epilogue_store.cuh"
#include "gemm_phases.cuh"
#include "schedule.cuh"
#include "swiglu_words.cuh"
#include "tile_gemm.cuh"
#include "tile_schedules.cuh"

namespace mok::gpu {

// Gate columns per GEMM1 tile (the up columns fill the tile's other half).
inline constexpr int kGateCols = kTileN / 2;
static_assert(kGateCols == kFp8Block, "a GEMM1 tile's a columns are one fp8 block of each row");

// The GEMM1 epilogue, deferred (gemm_tiles): the stashed tile's columns 0-127 are gate columns n0..,
// 128-255 the matching up columns (those at or past inter - n0 are another matrix's: not written); a
// slice takes h = bf16(gate | up) of 8 rows from the staging rows, computes a = bf16(swiglu(h)) and, in
// the fp8 mode (kFp8), a quantized for GEMM2 (aq: each row's 128 a values are one block, held by the
// row's 16 lanes), and stores rows < valid of h, a (and aq) from rows first.. on, 16 bytes a lane.
template <bool kFp8>
struct SwigluSlices {
  using Lane = SliceLane<kGateCols / kLaneChunk>;
  static_assert(Lane::kRowsPerPass == kSliceRows, "one pass a slice");
  Pipeline& pipe;
  float limit;
  int inter;
  bf16 *h, *a;
  Fp8Matrix aq;
  long first = 0;  // the stashed tile's rows, columns and valid rows
  int n0 = 0, valid = 0;

  __device__ void stash_tile(Warpgroup consumer, const float (&acc)[kAccumulators], long first_row, int col, int rows) {
    first = first_row;
    n0 = col;
    valid = rows;
    stash_bf16(pipe, consumer, acc, [] {});
  }
  __device__ void stash(const RingItem& it, Warpgroup consumer, const float (&acc)[kAccumulators]) {
    stash_tile(consumer, acc, it.t.pad_row, it.n0, kTileRows);
  }

  __device__ void slice(Warpgroup consumer, int s) const {
    const int c = consumer_index(consumer);
    const Lane lane(s);
    const int row = kWgmmaM * c + lane.row(0), col = n0 + lane.col;  // in the tile; of h's gate half and a
    const uint4 gate = *reinterpret_cast<const uint4*>(&pipe.smem->staged[c][lane.row(0)][lane.col]);
    const uint4 up = *reinterpret_cast<const uint4*>(&pipe.smem->staged[c][lane.row(0)][kGateCols + lane.col]);
    const uint32_t gw[4] = {gate.x, gate.y, gate.z, gate.w}, uw[4] = {up.x, up.y, up.z, up.w};
    uint32_t aw[4];
    swiglu_words<4>(gw, uw, limit, aw);
    if constexpr (kFp8) quantize_slice_row(aw, row, col);
    if (row >= valid || col >= inter) return;
    bf16* hr = h + (first + row) * 2 * inter;
    *reinterpret_cast<uint4*>(hr + col) = gate;
    *reinterpret_cast<uint4*>(hr + inter + col) = up;
    *reinterpret_cast<uint4*>(a + (first + row) * inter + col) = uint4{aw[0], aw[1], aw[2], aw[3]};
  }

  // The row's block of a (this lane's 8 values, the row's 16 lanes' all 128; the core's quantize_block):
  // its scale exponent from the largest magnitude (a zero exponent past the valid rows, which GEMM2's
  // token tiles read), and the codes of rows < valid.
  __device__ void quantize_slice_row(const uint32_t (&aw)[4], int row, int col) const {
    uint32_t amax =
        max(max(magnitude_bits(aw[0]), magnitude_bits(aw[1])), max(magnitude_bits(aw[2]), magnitude_bits(aw[3])));
#pragma unroll
    for (int lanes = 1; lanes < kGateCols / kLaneChunk; lanes *= 2) amax = max(amax, __shfl_xor_sync(~0u, amax, lanes));
    const int e = block_scale_exponent(amax);
    const Fp8Matrix dst = aq.row(first + row, inter);
    if (row < valid)
      *reinterpret_cast<uint2*>(dst.values + col) =
          uint2{e4m3x2_of(aw[0], e) | e4m3x2_of(aw[1], e) << 16, e4m3x2_of(aw[2], e) | e4m3x2_of(aw[3], e) << 16};
    if (col == n0) dst.exps[n0 / kFp8Block] = row < valid ? e : 0;
  }
};

// GEMM1 + SwiGLU on the rows of xe (in the fp8 mode, kFp8: of xq) of the expert tiles of `tiles`
// (RingTiles or OwnTiles, 128 columns of I per tile) into p.h and p.a (and p.aq). Padding rows (zero in xe) are
// written too: their a is zero, as the weight gradients expect.
template <bool kFp8, class Tiles>
__device__ void expert_up_tiles(Pipeline& pipe, const Params& p, const Tiles& tiles) {
  const int I = p.c.intermediate, H = p.c.hidden;
  expert_gemm<kNT, kFp8>(
      pipe, p, tiles, kExpertUp,
      [&](const RingItem& it) {
        const int w = own_expert(p, it.t.expert) * 2 * I + it.n0;
        if constexpr (kFp8) return k_major(p.maps.xq, p.maps.w1q, it.t.pad_row, w, w + I, H, {p.xq.exps, p.w1_exp});
        return k_major(p.maps.xe, p.maps.w1, it.t.pad_row, w, w + I, H);
      },
      SwigluSlices<kFp8>{pipe, p.c.swiglu_limit, I, p.h, p.a, p.aq});
}

// The forward's GEMM1 + SwiGLU on this cycle's tiles: (rank, ring slot, column tile).
template <bool kFp8>
__device__ inline void expert_up(Pipeline& pipe, const Params& p, int cycle) {
  expert_up_tiles<kFp8>(pipe, p, RingTiles{p, cycle, ceil_div(p.c.intermediate, kGateCols), kGateCols});
}

// The backward's recompute (Params::recompute): h and a of every tile of this GPU's experts in one pass
// (in the fp8 mode from xq, which quantize_own_xe fills first; its aq, the forward's GEMM2 operand, is
// written too and not read).
template <bool kFp8>
__device__ inline void recompute_up(Pipeline& pipe, const Params& p) {
  expert_up_tiles<kFp8>(pipe, p, OwnTiles{p, ceil_div(p.c.intermediate, kGateCols), kGateCols});
}

}  // namespace mok::gpu
