// The schedule: how the persistent blocks share out the work, and the lookups between the layer's
// index spaces. The index spaces, from a token to the ring (what it indexes; where it is computed):
//   token g      the layer's tokens in global order, g = r T + t: x, y, dx      loops over N, own_token_*
//                (the caller's y, dx, logits hold this GPU's tokens: own_token_row)
//   rank r, t    the rank holding token g, and g's row in that rank's buffers    token_rank, token_local
//   slot j       g's j-th expert; t k + j indexes rank r's slots and topk_w      slot_source, source_slot
//   layout row   one (token, slot), by expert, then by token: row_source         layout_place (place_token),
//                                                                                row_expert
//   expert tile  kTileRows layout rows of one expert, numbered expert by expert  layout_scan, expert_tile
//   padded row   kTileRows tile + row in the tile: per-row h, a, dh, dye, xe     expert_tile, ring_row,
//                                                                                slot_tile_row, pad_row
//   ring row     row q of rank r's ring; ring slot q / kTileRows holds a tile    ring_tile, ring_row,
//                (the cycle's dy and g)                                          ring_item
// Padding rows (past an expert's last layout row, up to its tiles' end) hold zeros, so a tile's rows
// are contiguous and a weight gradient's last K-block reads zeros past the expert's rows.
#pragma once

#include "mok/core/dispatch_layout.h"
#include "mok/core/saved_layout.h"
#include "params.cuh"

namespace mok::gpu {

__device__ __forceinline__ long thread_id() { return long(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ long thread_count() { return long(gridDim.x) * blockDim.x; }
__device__ __forceinline__ long warp_id() { return thread_id() / 32; }
__device__ __forceinline__ long warp_count() { return thread_count() / 32; }
__device__ __forceinline__ int lane_id() { return threadIdx.x % 32; }

__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The ranks this GPU executes, and their tokens [own_token_begin, own_token_end).
__device__ __forceinline__ int executed_ranks(const Params& p) { return p.rank_end - p.rank_begin; }
__device__ __forceinline__ bool executes(const Params& p, int r) { return r >= p.rank_begin && r < p.rank_end; }
__device__ __forceinline__ long own_token_begin(const Params& p) { return long(p.rank_begin) * p.c.tokens_per_rank; }
__device__ __forceinline__ long own_token_end(const Params& p) { return long(p.rank_end) * p.c.tokens_per_rank; }

// Own token g's row in the caller's per-token tensors (y, dx, logits), which hold this GPU's tokens
// only (one GPU: all of them, so the row is g).
__device__ __forceinline__ long own_token_row(const Params& p, long g) { return g - own_token_begin(p); }

// The experts of this GPU's ranks: [own_expert_begin, own_expert_end).
__device__ __forceinline__ int own_expert_begin(const Params& p) { return p.rank_begin * p.c.experts_per_rank(); }
__device__ __forceinline__ int own_expert_end(const Params& p) { return p.rank_end * p.c.experts_per_rank(); }

// Own expert e's index in the caller's expert tensors (w1, w2, d_w1, d_w2), which hold this GPU's
// experts only (one GPU: all of them, so the index is e).
__device__ __forceinline__ int own_expert(const Params& p, int e) { return e - own_expert_begin(p); }

// Rank-local coordinates of global token g.
__device__ __forceinline__ int token_rank(const Params& p, int g) { return g / p.c.tokens_per_rank; }
__device__ __forceinline__ int token_local(const Params& p, int g) { return g % p.c.tokens_per_rank; }

// Global token g's row of one of its rank's [T, H] inputs (RankBuffers::x or ::dy).
__device__ __forceinline__ const bf16* token_row(const Params& p, int g, const bf16* RankBuffers::*input) {
  return p.rank[token_rank(p, g)].*input + long(token_local(p, g)) * p.c.hidden;
}

// Source of a layout row: global token g and slot j.
struct SlotSource {
  int token, slot;
};
__device__ __forceinline__ SlotSource slot_source(const Params& p, int row) {
  const int s = p.row_source[row];
  return SlotSource{s / p.c.top_k, s % p.c.top_k};
}

// The expert of (token, slot) s = g k + j, from g's rank's topk_idx (across GPUs a peer's window).
__device__ __forceinline__ int32_t slot_expert(const Params& p, long s) {
  const int k = p.c.top_k, g = int(s / k);
  return p.rank[token_rank(p, g)].topk_idx[long(token_local(p, g)) * k + s % k];
}

// The (token, slot) layout row `row` came from: its source rank's buffers (src) and the slot's index
// in them.
__device__ inline long source_slot(const Params& p, int row, const RankBuffers*& src) {
  const SlotSource s = slot_source(p, row);
  src = &p.rank[token_rank(p, s.token)];
  return long(token_local(p, s.token)) * p.c.top_k + s.slot;
}

// A tile of one expert's layout rows: tiles are numbered expert by expert (tile_offsets).
struct ExpertTile {
  int expert;
  int first_row;  // layout row of the tile's row 0
  int rows;       // valid rows, 1..kTileRows
  int pad_row;    // padded row of the tile's row 0 in this GPU's per-row buffers
};

// The tiles of this GPU's experts, [own_tile_begin, own_tile_end): its per-row buffers hold them from
// the first on.
__device__ __forceinline__ int own_tile_begin(const Params& p) { return p.tile_offsets[own_expert_begin(p)]; }
__device__ __forceinline__ int own_tile_end(const Params& p) { return p.tile_offsets[own_expert_end(p)]; }
// The per-row buffers' rows those tiles fill (their padding rows included).
__device__ __forceinline__ long own_tile_rows(const Params& p) {
  return long(own_tile_end(p) - own_tile_begin(p)) * kTileRows;
}

// The first GPU whose experts' tiles the per-row buffers (padded_rows, the same on every GPU) cannot
// hold, or -1: the forward's capacity check, and the backward's of the layout it reads.
__device__ __forceinline__ int gpu_over_capacity(const Params& p, int& tiles) {
  const int per_gpu = p.c.experts / p.gpus;
  for (int g = 0; g < p.gpus; ++g) {
    tiles = p.tile_offsets[(g + 1) * per_gpu] - p.tile_offsets[g * per_gpu];
    if (long(tiles) * kTileRows > p.padded_rows) return g;
  }
  return -1;
}

// Every expert tile's expert, into tile_expert: the last e with tile_offsets[e] <= tile (an expert
// without tiles shares its offset with the next one, so the last is the one with tiles). Once per
// launch, so that a tile's lookup is one load instead of a binary search over E (a chain of dependent
// loads in every GEMM tile's job and every ring row's mapping).
__device__ inline void index_tiles(const Params& p) {
  const int E = p.c.experts;
  for (long tile = thread_id(); tile < p.tile_offsets[E]; tile += thread_count())
    p.tile_expert[tile] = last_at_or_below(p.tile_offsets, E, tile);
}

// Expert tile `tile` (tile_expert filled by index_tiles).
__device__ __forceinline__ ExpertTile expert_tile(const Params& p, int tile) {
  const int e = p.tile_expert[tile];
  const int first = p.offsets[e] + kTileRows * (tile - p.tile_offsets[e]);
  return ExpertTile{e, first, min(kTileRows, p.offsets[e + 1] - first), kTileRows * (tile - own_tile_begin(p))};
}

// Tiles of rank r's experts: [rank_tile_begin, rank_tile_end).
__device__ __forceinline__ int rank_tile_begin(const Params& p, int r) {
  return p.tile_offsets[r * p.c.experts_per_rank()];
}
__device__ __forceinline__ int rank_tile_end(const Params& p, int r) {
  return p.tile_offsets[(r + 1) * p.c.experts_per_rank()];
}

// Tiles per ring (rings are whole tiles).
__device__ __forceinline__ int ring_tiles(const Params& p) { return p.ring_rows / kTileRows; }

// The first row of executed rank r's ring: a GPU holds the rings of its own ranks only.
__device__ __forceinline__ long ring_base(const Params& p, int r) { return long(r - p.rank_begin) * p.ring_rows; }

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

// Ring row `item` of this cycle (over all ranks' rings): its rank, its tile (none: an empty slot) and
// its padded row; `valid` false for a tile's padding rows.
struct RingRow {
  int r, q;
  bool in_tile, valid;
  ExpertTile t;
  long pad;
};
__device__ inline RingRow ring_row(const Params& p, int cycle, long item) {
  RingRow row{p.rank_begin + int(item / p.ring_rows), int(item % p.ring_rows), false, false, {}, 0};
  const int tile = ring_tile(p, row.r, cycle, row.q / kTileRows);
  if (tile < 0) return row;
  row.in_tile = true;
  row.t = expert_tile(p, tile);
  row.valid = row.q % kTileRows < row.t.rows;
  row.pad = row.t.pad_row + row.q % kTileRows;
  return row;
}

// Row i of expert e's tile `tile` (numbered as tile_offsets numbers them), one of this GPU's.
struct ExpertTileRow {
  int e, tile, i;
};

// The row of (token, slot) s = g k + j in this GPU's tiles, if its expert is this GPU's. From the saved
// layout alone (slot_row, offsets): across GPUs the backward's topk_idx holds only this GPU's tokens of
// its batch (the rest of its window is whatever the last forward gathered).
__device__ inline bool slot_tile_row(const Params& p, long s, ExpertTileRow& out) {
  const int32_t row = p.slot_row[s];
  const int e = row_expert(p.offsets, own_expert_begin(p), own_expert_end(p), row);
  if (e < 0) return false;
  const int i = row - p.offsets[e];
  out = {e, p.tile_offsets[e] + i / kTileRows, i % kTileRows};
  return true;
}

// A tile row's padded row.
__device__ __forceinline__ long pad_row(const Params& p, ExpertTileRow row) {
  return long(kTileRows) * (row.tile - own_tile_begin(p)) + row.i;
}

// A tile row's index in the executed ranks' rings in `cycle` (ring_base + its ring row), or -1 where the
// cycle's ring does not hold its tile.
__device__ inline long ring_item(const Params& p, int cycle, ExpertTileRow row) {
  const int r = p.c.expert_rank(row.e), slot = row.tile - rank_tile_begin(p, r) - cycle * ring_tiles(p);
  return slot >= 0 && slot < ring_tiles(p) ? ring_base(p, r) + kTileRows * slot + row.i : -1;
}

// A warp's share of this GPU's padding rows (each expert's last tile's rows past its last layout row,
// which hold zeros), one per call of row(ExpertTileRow).
template <class Row>
__device__ __forceinline__ void for_each_padding_row(const Params& p, Row row) {
  const int first = own_expert_begin(p);
  for (long item = warp_id(); item < long(own_expert_end(p) - first) * kTileRows; item += warp_count()) {
    const int e = first + int(item / kTileRows), i = int(item % kTileRows);
    const int tiles = p.tile_offsets[e + 1] - p.tile_offsets[e], rows = p.offsets[e + 1] - p.offsets[e];
    if (tiles > 0 && i >= rows - kTileRows * (tiles - 1)) row(ExpertTileRow{e, p.tile_offsets[e + 1] - 1, i});
  }
}

// A warp per global token with a slot on this GPU, its slots 32 at a time: lane l holds slot j0 + l's
// destination row dst(row) for its tile row (slot_tile_row; -1, or a slot of another GPU's expert:
// none); visit(g, j0, lanes, destination) with `lanes` the lanes that hold one (the same in every lane).
template <class Dst, class Visit>
__device__ __forceinline__ void for_each_token_slots(const Params& p, Dst dst, Visit visit) {
  const int k = p.c.top_k;
  for (long g = warp_id(); g < p.c.tokens(); g += warp_count())
    for (int j0 = 0; j0 < k; j0 += 32) {
      const int j = j0 + lane_id();
      ExpertTileRow row;
      const long to = j < k && slot_tile_row(p, g * k + j, row) ? dst(row) : -1;
      const uint32_t lanes = __ballot_sync(~0u, to >= 0);
      if (lanes) visit(int(g), j0, lanes, to);
    }
}

// source_slot of a valid ring row.
__device__ inline long source_slot(const Params& p, const RingRow& row, const RankBuffers*& src) {
  return source_slot(p, row.t.first_row + row.q % kTileRows, src);
}

// Ring rows of this cycle over the executed ranks (a multiple of 32: rings are whole tiles).
__device__ __forceinline__ long cycle_ring_rows(const Params& p) { return long(executed_ranks(p)) * p.ring_rows; }

}  // namespace mok::gpu
