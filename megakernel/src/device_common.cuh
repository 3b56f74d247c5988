// Work distribution and dispatch-layout lookups shared by the forward and backward kernels.
#pragma once

#include "mok/core/dispatch_layout.h"
#include "params.cuh"
#include "warp_mma.cuh"

namespace mok::gpu {

inline constexpr int kThreads = 256;  // 8 warps per persistent block
inline constexpr int kTileRows = 16;  // rows of one mma tile = one K-chunk of a weight gradient

__device__ __forceinline__ long thread_id() { return long(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ long thread_count() { return long(gridDim.x) * blockDim.x; }
__device__ __forceinline__ long warp_id() { return thread_id() / 32; }
__device__ __forceinline__ long warp_count() { return thread_count() / 32; }
__device__ __forceinline__ int lane_id() { return threadIdx.x % 32; }

// A 16-row tile of one expert's layout rows: tiles are numbered expert by expert (tile_offsets).
struct ExpertTile {
  int expert;
  int first_row;  // layout row of the tile's row 0
  int rows;       // valid rows, 1..16
};

__device__ __forceinline__ ExpertTile expert_tile(const Params& p, int tile) {
  int e = 0;
  while (p.tile_offsets[e + 1] <= tile) ++e;
  const int first = p.offsets[e] + kTileRows * (tile - p.tile_offsets[e]);
  const int rows = min(kTileRows, p.offsets[e + 1] - first);
  return ExpertTile{e, first, rows};
}

// Tiles of rank r's experts: [rank_tile_begin, rank_tile_end).
__device__ __forceinline__ int rank_tile_begin(const Params& p, int r) {
  return p.tile_offsets[r * p.c.experts_per_rank()];
}
__device__ __forceinline__ int rank_tile_end(const Params& p, int r) {
  return p.tile_offsets[(r + 1) * p.c.experts_per_rank()];
}

__device__ __forceinline__ int ring_tiles(const Params& p) { return p.ring_rows / kTileRows; }

// Ring cycles needed by the busiest rank (the same value in every block).
__device__ __forceinline__ int ring_cycles(const Params& p) {
  int most = 0;
  for (int r = 0; r < p.c.ranks; ++r) most = max(most, rank_tile_end(p, r) - rank_tile_begin(p, r));
  return (most + ring_tiles(p) - 1) / ring_tiles(p);
}

// The tile held in ring slot `slot` of rank r during `cycle`, or -1.
__device__ __forceinline__ int ring_tile(const Params& p, int r, int cycle, int slot) {
  const int tile = rank_tile_begin(p, r) + cycle * ring_tiles(p) + slot;
  return tile < rank_tile_end(p, r) ? tile : -1;
}

// This cycle's ring work items, one warp each: (rank r, ring slot, first column n0 of a kTileCols
// block) over `columns` output columns, for the slots that hold a tile.
template <class Visit>
__device__ void for_each_ring_tile(const Params& p, int cycle, int columns, Visit visit) {
  const int blocks = columns / kTileCols, per_rank = ring_tiles(p) * blocks;
  for (long item = warp_id(); item < long(p.c.ranks) * per_rank; item += warp_count()) {
    const int r = int(item / per_rank), slot = int(item % per_rank) / blocks, n0 = int(item % blocks) * kTileCols;
    const int tile = ring_tile(p, r, cycle, slot);
    if (tile >= 0) visit(r, slot, n0, expert_tile(p, tile));
  }
}

// Work items over all tokens in global order, one warp each: (first token of a 16-token tile, first
// column n0 of a kTileCols block) over `columns` output columns (the shared expert's GEMMs).
template <class Visit>
__device__ void for_each_token_tile(const Params& p, int columns, Visit visit) {
  const int blocks = columns / kTileCols;
  const long items = long((p.c.tokens() + kTileRows - 1) / kTileRows) * blocks;
  for (long item = warp_id(); item < items; item += warp_count())
    visit(int(item / blocks) * kTileRows, int(item % blocks) * kTileCols);
}

// out[g, :] = bf16(a[g, :] b^T) for every token g: a [N, k], b [n, k], out [N, n].
__device__ inline void token_gemm_bf16(const Params& p, const bf16* a, int k, const bf16* b, int n, bf16* out) {
  const int N = p.c.tokens();
  for_each_token_tile(p, n, [&](int first, int n0) {
    ptx::FragC acc[kColBlocks] = {};
    mma_chain(
        acc, 0, k, [&](int m, int kk) { return first + m < N ? contiguous_pair(a + long(first + m) * k, kk) : 0u; },
        [&](int kk, int col) { return contiguous_pair(b + long(n0 + col) * k, kk); });
    store_tile(acc, [&](int row, int col, float v) {
      if (first + row < N) out[long(first + row) * n + n0 + col] = to_bf16(v);
    });
  });
}

// Source of a layout row: global token g and slot j.
struct SlotSource {
  int token, slot;
};
__device__ __forceinline__ SlotSource slot_source(const Params& p, int row) {
  const int s = p.row_source[row];
  return SlotSource{s / p.c.top_k, s % p.c.top_k};
}

// Rank-local coordinates of global token g.
__device__ __forceinline__ int token_rank(const Params& p, int g) { return g / p.c.tokens_per_rank; }
__device__ __forceinline__ int token_local(const Params& p, int g) { return g % p.c.tokens_per_rank; }

// Push: a 16 x kTileCols accumulator tile, each valid row rounded to bf16 into the (token, slot)
// buffer of its source rank (y_j in the forward, dx_j in the backward).
__device__ __forceinline__ void push_to_slots(const Params& p, const ExpertTile& t, int n0,
                                              const ptx::FragC (&acc)[kColBlocks]) {
  const int H = p.c.hidden;
  store_tile(acc, [&](int row, int col, float v) {
    if (row >= t.rows) return;
    const SlotSource s = slot_source(p, t.first_row + row);
    bf16* slots = p.rank[token_rank(p, s.token)].slots;
    slots[(long(token_local(p, s.token)) * p.c.top_k + s.slot) * H + n0 + col] = to_bf16(v);
  });
}

// Pull: warp-wide copy of one H-row (16-byte vectors; rows are 128-byte aligned as H % 64 == 0).
__device__ __forceinline__ void copy_row(bf16* dst, const bf16* src, int h) {
  const int4* s = reinterpret_cast<const int4*>(src);
  int4* d = reinterpret_cast<int4*>(dst);
  for (int i = lane_id(); i < h / 8; i += 32) d[i] = src ? s[i] : int4{0, 0, 0, 0};
}

// Fills each rank's ring with the rows of its tiles for this cycle, read from the source ranks'
// buffers (`source(rank)` gives the [T, H] buffer: x forward, dy backward). Padding rows are zero.
template <class Source>
__device__ void pull_into_rings(const Params& p, int cycle, Source source) {
  const int H = p.c.hidden;
  const long rows = long(p.c.ranks) * p.ring_rows;
  for (long item = warp_id(); item < rows; item += warp_count()) {
    const int r = int(item / p.ring_rows), q = int(item % p.ring_rows);
    const int tile = ring_tile(p, r, cycle, q / kTileRows);
    const bf16* src = nullptr;
    if (tile >= 0) {
      const ExpertTile t = expert_tile(p, tile);
      if (q % kTileRows < t.rows) {
        const int g = slot_source(p, t.first_row + q % kTileRows).token;
        src = source(token_rank(p, g)) + long(token_local(p, g)) * H;
      }
    }
    copy_row(p.rank[r].ring + long(q) * H, src, H);
  }
}

}  // namespace mok::gpu
