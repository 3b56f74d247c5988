// The GEMM phases' tile schedules: each lists one phase's output tiles, with their count and a lookup
// from a tile's number (gemm_tiles hands the numbers to the persistent blocks round-robin, or as they
// claim them: the weight gradients', ClaimedWalk).
#pragma once

#include "banded_tile.h"
#include "schedule.cuh"

namespace mok::gpu {

// One output tile of a ring phase: rank r's ring slot (its rows start at ring_row of the ring map)
// and the first output column n0.
struct RingItem {
  int r, ring_row, n0;
  ExpertTile t;
};

// The output tiles of one ring phase in this cycle: (executed rank, ring slot, column tile of
// `width` columns), the slots and column tiles of a rank banded (banded_tile).
struct RingTiles {
  const Params& p;
  int cycle, col_tiles, width;

  __device__ long count() const { return long(executed_ranks(p)) * ring_tiles(p) * col_tiles; }

  // Tile `item`, or false when its ring slot is empty.
  __device__ bool lookup(long item, RingItem& out) const {
    const int per_rank = ring_tiles(p) * col_tiles;
    const int r = p.rank_begin + int(item / per_rank);
    const GridTile at = banded_tile(int(item % per_rank), ring_tiles(p), col_tiles);
    const int tile = ring_tile(p, r, cycle, at.row);
    if (tile < 0) return false;
    out = RingItem{r, int(ring_base(p, r)) + at.row * kTileRows, at.col * width, expert_tile(p, tile)};
    return true;
  }
};

// The output tiles of one pass over every expert tile of this GPU's experts, whatever the ring holds
// (the backward's recompute of h, which reads xe per padded row, not the ring): (tile, column
// tile of `width` columns), banded (banded_tile). Its items have no ring row.
struct OwnTiles {
  const Params& p;
  int col_tiles, width;

  __device__ int first_tile() const { return own_tile_begin(p); }
  __device__ long count() const { return long(own_tile_end(p) - first_tile()) * col_tiles; }
  __device__ bool lookup(long item, RingItem& out) const {
    const GridTile at = banded_tile(int(item), own_tile_end(p) - first_tile(), col_tiles);
    const ExpertTile t = expert_tile(p, first_tile() + at.row);
    out = RingItem{p.c.expert_rank(t.expert), -1, at.col * width, t};
    return true;
  }
};

// The output tiles of a phase over the shared expert's tokens (its GEMMs): kTileRows tokens x `width`
// columns, column tile fastest.
struct TokenTiles {
  int tokens, col_tiles, width;

  __device__ long count() const { return long(ceil_div(tokens, kTileRows)) * col_tiles; }
  __device__ long first_token(long t) const { return t / col_tiles * kTileRows; }
  __device__ int n0(long t) const { return int(t % col_tiles) * width; }
};

// The weight gradients' output tiles, gradient after gradient in the block's order (weight_grads):
// first[i] is the i-th gradient's first tile, first[grads] the count.
struct WeightGradTiles {
  const int32_t* first;
  int grads;

  __device__ long count() const { return first[grads]; }
  // The place in the order of the gradient holding tile t.
  __device__ int place(long t) const { return last_at_or_below(first, grads, t); }
};

}  // namespace mok::gpu
