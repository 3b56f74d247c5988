// Work distribution and dispatch-layout lookups shared by the forward and backward kernels.
// Each expert's layout rows are cut into tiles of kTileRows; per-row scratch (h, a, g, dh, dye, xe)
// is stored by padded row = kTileRows * (tiles before the expert) + row within the expert, and
// padding rows hold zeros, so a tile's rows are contiguous and a weight gradient's last K-step
// reads zeros past the expert's rows.
#pragma once

#include "mok/core/dispatch_layout.h"
#include "params.cuh"
#include "tile_gemm.cuh"

namespace mok::gpu {

inline constexpr int kTileRows = kTileM;

__device__ __forceinline__ long thread_id() { return long(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ long thread_count() { return long(gridDim.x) * blockDim.x; }
__device__ __forceinline__ long warp_id() { return thread_id() / 32; }
__device__ __forceinline__ long warp_count() { return thread_count() / 32; }
__device__ __forceinline__ int lane_id() { return threadIdx.x % 32; }

// Two floats rounded to bf16, packed as one 32-bit word (v0 in the low half: the lower address).
__device__ __forceinline__ uint32_t pack_bf16(float v0, float v1) {
  return uint32_t(to_bf16(v0).bits) | (uint32_t(to_bf16(v1).bits) << 16);
}
__device__ __forceinline__ float low_float(uint32_t w) { return to_float(bf16{uint16_t(w & 0xffffu)}); }
__device__ __forceinline__ float high_float(uint32_t w) { return to_float(bf16{uint16_t(w >> 16)}); }

__device__ __forceinline__ void store_pair(bf16* dst, float v0, float v1) {
  *reinterpret_cast<uint32_t*>(dst) = pack_bf16(v0, v1);
}

// A tile of one expert's layout rows: tiles are numbered expert by expert (tile_offsets).
struct ExpertTile {
  int expert;
  int first_row;  // layout row of the tile's row 0
  int rows;       // valid rows, 1..kTileRows
  int pad_row;    // padded row of the tile's row 0
};

// The expert owning a tile: the last e with tile_offsets[e] <= tile (an expert without tiles shares its
// offset with the next one, so the last is the one with tiles), by binary search.
__device__ __forceinline__ ExpertTile expert_tile(const Params& p, int tile) {
  int e = 0, last = p.c.experts - 1;
  while (e < last) {
    const int mid = (e + last + 1) / 2;
    if (p.tile_offsets[mid] <= tile)
      e = mid;
    else
      last = mid - 1;
  }
  const int first = p.offsets[e] + kTileRows * (tile - p.tile_offsets[e]);
  return ExpertTile{e, first, min(kTileRows, p.offsets[e + 1] - first), kTileRows * tile};
}

// Tiles of rank r's experts: [rank_tile_begin, rank_tile_end).
__device__ __forceinline__ int rank_tile_begin(const Params& p, int r) {
  return p.tile_offsets[r * p.c.experts_per_rank()];
}
__device__ __forceinline__ int rank_tile_end(const Params& p, int r) {
  return p.tile_offsets[(r + 1) * p.c.experts_per_rank()];
}

// The ranks this GPU executes, and their tokens [own_token_begin, own_token_end).
__device__ __forceinline__ int executed_ranks(const Params& p) { return p.rank_end - p.rank_begin; }
__device__ __forceinline__ bool executes(const Params& p, int r) { return r >= p.rank_begin && r < p.rank_end; }
__device__ __forceinline__ long own_token_begin(const Params& p) { return long(p.rank_begin) * p.c.tokens_per_rank; }
__device__ __forceinline__ long own_token_end(const Params& p) { return long(p.rank_end) * p.c.tokens_per_rank; }

__device__ __forceinline__ int ring_tiles(const Params& p) { return p.ring_rows / kTileRows; }

// Row q of rank r's ring.
__device__ __forceinline__ bf16* ring_row_data(const Params& p, int r, int q) {
  return p.ring + (long(r) * p.ring_rows + q) * p.c.hidden;
}

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

// One output tile of a ring phase: rank r's ring slot (its rows start at ring_row of the ring map)
// and the first output column n0.
struct RingItem {
  int r, ring_row, n0;
  ExpertTile t;
};

// Output tile `item` of this cycle's ring phase over `col_tiles` tiles of `width` columns, or false
// when that ring slot is empty.
__device__ __forceinline__ bool ring_item(const Params& p, int cycle, int col_tiles, int width, long item,
                                          RingItem& out) {
  const int per_rank = ring_tiles(p) * col_tiles;
  const int r = p.rank_begin + int(item / per_rank), slot = int(item % per_rank) / col_tiles;
  const int tile = ring_tile(p, r, cycle, slot);
  if (tile < 0) return false;
  out = RingItem{r, r * p.ring_rows + slot * kTileRows, int(item % col_tiles) * width, expert_tile(p, tile)};
  return true;
}

__device__ __forceinline__ long ring_items(const Params& p, int col_tiles) {
  return long(executed_ranks(p)) * ring_tiles(p) * col_tiles;
}

__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

// A GEMM phase over this cycle's ring slots: tiles (rank, ring slot, `width` of `columns` output
// columns); load(it) gives a tile's operands, epilogue(it, half, acc) consumes a finished half tile.
template <class Load, class Epilogue>
__device__ void ring_gemm(Pipeline& pipe, const Params& p, int cycle, int phase, int width, int columns, Load load,
                          Epilogue epilogue) {
  const int col_tiles = ceil_div(columns, width);
  RingItem it;
  gemm_tiles<false>(
      pipe, ring_items(p, col_tiles), p.barrier, phase,
      [&](long t, TileLoad& l) {
        if (!ring_item(p, cycle, col_tiles, width, t, it)) return false;
        l = load(it);
        return true;
      },
      [&](long, int half, const float(&acc)[kAccumulators]) { epilogue(it, half, acc); });
}

// A K-major tile load: A rows a_row.. (128), B rows b0.. and b1.. (128 each), K = k columns.
__device__ __forceinline__ TileLoad k_major(const CUtensorMap& ma, const CUtensorMap& mb, int a_row, int b0, int b1,
                                            int k) {
  return TileLoad{&ma, &mb, a_row, {b0, b1}, 0, k / kBox};
}
// ... with B's 256 rows contiguous from b_row.
__device__ __forceinline__ TileLoad k_major(const CUtensorMap& ma, const CUtensorMap& mb, int a_row, int b_row, int k) {
  return k_major(ma, mb, a_row, b_row, b_row + kTileN / 2, k);
}

// C = a b^T over every token g (the shared expert's GEMMs): A map [N, k], B map [n, k]; the
// accumulators of token g, columns col and col + 1 (< n), go to store(g, col, c0, c1).
template <class Store>
__device__ void token_gemm(Pipeline& pipe, const Params& p, const CUtensorMap& a, const CUtensorMap& b, int k, int n,
                           int phase, Store store) {
  const int N = p.c.tokens(), col_tiles = ceil_div(n, kTileN);
  gemm_tiles<false>(
      pipe, long(ceil_div(N, kTileRows)) * col_tiles, p.barrier, phase,
      [&](long t, TileLoad& l) {
        const int n0 = int(t % col_tiles) * kTileN;
        l = k_major(a, b, int(t / col_tiles) * kTileRows, n0, k);
        return true;
      },
      [&](long t, int half, const float(&acc)[kAccumulators]) {
        const long first = t / col_tiles * kTileRows;
        const int n0 = int(t % col_tiles) * kTileN;
        for_each_pair(
            half, acc,
            [&](int row, int col, float v0, float v1) {
              if (first + row < N) store(first + row, n0 + col, v0, v1);
            },
            min(kTileN, n - n0));
      });
}

// out[g, :] = bf16(a[g, :] b^T) for every token g: out [N, n].
__device__ inline void token_gemm_bf16(Pipeline& pipe, const Params& p, const CUtensorMap& a, const CUtensorMap& b,
                                       int k, int n, bf16* out, int phase) {
  token_gemm(pipe, p, a, b, k, n, phase,
             [&](long g, int col, float v0, float v1) { store_pair(out + g * n + col, v0, v1); });
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

// The (token, slot) layout row `row` came from: its source rank's buffers (src) and the slot's index
// in them.
__device__ inline long source_slot(const Params& p, int row, const RankBuffers*& src) {
  const SlotSource s = slot_source(p, row);
  src = &p.rank[token_rank(p, s.token)];
  return long(token_local(p, s.token)) * p.c.top_k + s.slot;
}

// A finished half tile goes to bf16 rows in global memory through the consumer warpgroup's staging
// rows in shared memory, in passes of 64 columns. stage_row_dst publishes where each of the
// warpgroup's 64 rows goes (row_dst(row within the whole tile); nullptr: skip) in one of two tables;
// thread t < 64 computes row t's.
template <class RowDst>
__device__ __forceinline__ void stage_row_dst(Pipeline& pipe, int half, int table, RowDst row_dst) {
  const int t = threadIdx.x % 128;
  if (t < kTileM / 2) pipe.smem->staged_dst[half][table][t] = row_dst(kTileM / 2 * half + t);
}

// One pass: accumulators [32 window, 32 window + 32) (tile columns 64 window ..), word(i) giving pair
// i packed as bf16, are staged; then 8 lanes copy each row's 128 bytes with 16-byte stores to its
// destination in `table`, plus `offset` elements. A thread copies the same four rows in every pass.
// Windows are whole: H, I and Is are multiples of 64 (config.h), so no pass runs past a row's end.
// (fp32 tiles skip the staging: the accumulator layout's 8-byte pairs already fill whole sectors, and
// staged they were slower, results/2026-11-29-h200-w.)
template <class Word>
__device__ __forceinline__ void staged_pass(Pipeline& pipe, int half, int table, int window, long offset, Word word) {
  constexpr int kPerPass = kTileM / 2 * kStagedCols / 128;  // accumulators per thread and pass
  constexpr int kChunk = int(16 / sizeof(bf16)), kChunksPerRow = kStagedCols / kChunk;  // 16-byte chunks, lanes per row
  constexpr int kRowsPerThread = kTileM / 2 * kChunksPerRow / 128;
  uint16_t(*rows)[kStagedPitch] = pipe.smem->staged[half];
  void* const* dst = pipe.smem->staged_dst[half][table];
  const int t = threadIdx.x % 128, chunk = t % kChunksPerRow;
  warpgroup_sync(half);  // the last pass's copies are done with the rows; the destinations are published
#pragma unroll
  for (int i = kPerPass * window; i < kPerPass * (window + 1); i += 2)
    *reinterpret_cast<uint32_t*>(&rows[acc_row(half, i) - kTileM / 2 * half][acc_col(i) - kStagedCols * window]) =
        word(i);
  warpgroup_sync(half);
#pragma unroll
  for (int j = 0; j < kRowsPerThread; ++j) {
    const int r = t / kChunksPerRow + 128 / kChunksPerRow * j;
    if (bf16* d = static_cast<bf16*>(dst[r]))
      *reinterpret_cast<int4*>(d + offset + kChunk * chunk) = *reinterpret_cast<const int4*>(&rows[r][kChunk * chunk]);
  }
}

// Push: a finished half tile, each valid row rounded to bf16 into the (token, slot) buffer of its
// source rank (y_j in the forward, dx_j in the backward). The row table is free: the warpgroup met at
// the end of this tile's chain, after the last tile's passes.
__device__ inline void push_to_slots(Pipeline& pipe, const Params& p, const RingItem& it, int half,
                                     const float (&acc)[kAccumulators]) {
  const int H = p.c.hidden;
  stage_row_dst(pipe, half, 0, [&](int r) -> bf16* {
    if (r >= it.t.rows) return nullptr;
    const RankBuffers* src;
    const long slot = source_slot(p, it.t.first_row + r, src);
    return src->slots + slot * H + it.n0;
  });
#pragma unroll
  for (int w = 0; w < kTileN / kStagedCols; ++w)
    if (it.n0 + kStagedCols * w < H)
      staged_pass(pipe, half, 0, w, kStagedCols * w, [&](int i) { return pack_bf16(acc[i], acc[i + 1]); });
}

// Eight consecutive bf16 (16 bytes: one vector access per lane, so a warp moves 512 bytes per step).
struct alignas(16) Bf16x8 {
  bf16 e[8];
};

// A warp's pass over one row of n vectors: lane l handles vectors l, l + 32, ...; store(c, load(c)).
// kBatch of a lane's loads are issued before their stores: such a loop is latency-bound, and the
// compiler may not hoist a load over a store it cannot prove distinct.
template <int kBatch = 4, class Load, class Store>
__device__ __forceinline__ void row_pass(int n, Load load, Store store) {
  using Value = decltype(load(0));
  for (int c0 = lane_id(); c0 < n; c0 += 32 * kBatch) {
    Value v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      v[b] = c0 + 32 * b < n ? load(c0 + 32 * b) : Value{};  // no value kept from the last pass
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      if (c0 + 32 * b < n) store(c0 + 32 * b, v[b]);
  }
}

// Warp-wide copy of one H-row (16-byte vectors; rows are 128-byte aligned as H % 64 == 0); a null
// source writes zeros. Eight vectors per lane in flight: the copies are bound by loads in flight.
__device__ __forceinline__ void copy_row(bf16* dst, const bf16* src, int h) {
  const int4* s = reinterpret_cast<const int4*>(src);
  int4* d = reinterpret_cast<int4*>(dst);
  row_pass<8>(
      h / 8,
      [&](int i) {
        return src ? s[i] : int4{0, 0, 0, 0};
      },
      [&](int i, int4 v) { d[i] = v; });
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

// ... of a valid ring row.
__device__ inline long source_slot(const Params& p, const RingRow& row, const RankBuffers*& src) {
  return source_slot(p, row.t.first_row + row.q % kTileRows, src);
}

// Ring rows of this cycle over the executed ranks (a multiple of 32: rings are whole tiles).
__device__ __forceinline__ long cycle_ring_rows(const Params& p) { return long(executed_ranks(p)) * p.ring_rows; }

// A warp's share of this cycle's tile rows, one row per call of row(RingRow): the ring rows that hold
// a tile, its padding rows included (valid false).
template <class Row>
__device__ __forceinline__ void for_each_tile_row(const Params& p, int cycle, Row row) {
  for (long item = warp_id(); item < cycle_ring_rows(p); item += warp_count()) {
    const RingRow r = ring_row(p, cycle, item);
    if (r.in_tile) row(r);
  }
}

// The forward's dispatch: x of every row of this cycle's tiles, pulled from the source ranks' buffers
// straight into xe (per padded row: GEMM1's A, and dW1's operand in the backward); padding rows zero.
__device__ inline void pull_x(const Params& p, int cycle) {
  const int H = p.c.hidden;
  for_each_tile_row(p, cycle, [&](const RingRow& row) {
    const RankBuffers* src = nullptr;
    const long slot = row.valid ? source_slot(p, row, src) : 0;
    copy_row(p.xe + row.pad * H, row.valid ? src->x + slot / p.c.top_k * H : nullptr, H);
  });
}

// Across GPUs: the other GPUs' tokens' rows of a per-token [N, H] buffer, copied from their ranks'
// buffers (`source(rank)`) into this GPU's global view.
template <class Source>
__device__ void gather_token_rows(const Params& p, bf16* view, Source source) {
  const int H = p.c.hidden;
  for (long g = warp_id(); g < p.c.tokens(); g += warp_count()) {
    const int r = token_rank(p, int(g));
    if (!executes(p, r)) copy_row(view + g * H, source(r) + long(token_local(p, int(g))) * H, H);
  }
}

// The same for a small per-token [N, width] buffer, element by element.
template <class T, class Source>
__device__ void gather_token_values(const Params& p, T* view, int width, Source source) {
  const long per_rank = long(p.c.tokens_per_rank) * width;
  for (long i = thread_id(); i < p.c.tokens() * long(width); i += thread_count()) {
    const int r = int(i / per_rank);
    if (!executes(p, r)) view[i] = source(r)[i % per_rank];
  }
}

// The combines on the source ranks: for each of this GPU's tokens and 8 columns (one thread), start(i,
// acc) sets the 8 columns' sums (i: the vector index in [N, H/8]), step(slot, value, acc) continues one
// column's sum over one slot, in slot order, and finish(i, token, acc) writes the vector. Eight slots'
// 16-byte vectors are loaded before they are summed: the loads are what the combine waits for.
template <class Start, class Step, class Finish>
__device__ void combine_tokens(const Params& p, Start start, Step step, Finish finish) {
  constexpr int kBatch = 8;
  const int H = p.c.hidden, k = p.c.top_k, chunks = H / 8;
  for (long i = own_token_begin(p) * chunks + thread_id(); i < own_token_end(p) * chunks; i += thread_count()) {
    const int g = int(i / chunks);
    const RankBuffers& rb = p.rank[token_rank(p, g)];
    const long t = token_local(p, g);
    const Bf16x8* slots = reinterpret_cast<const Bf16x8*>(rb.slots + t * k * H) + i % chunks;
    float acc[8];
    start(i, acc);
    for (int j0 = 0; j0 < k; j0 += kBatch) {
      Bf16x8 v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (j0 + j < k) v[j] = slots[long(j0 + j) * chunks];
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (j0 + j < k) {
#pragma unroll
          for (int col = 0; col < 8; ++col) acc[col] = step(rb, t, j0 + j, v[j].e[col], acc[col]);
        }
    }
    finish(i, g, acc);
  }
}

// The 8 columns' starting sums: the shared expert's vector i of `shared` ([N, H] bf16), or +0.
__device__ __forceinline__ void start_from_shared(const Params& p, const bf16* shared, long i, float (&acc)[8]) {
  const Bf16x8 s = p.c.has_shared() ? reinterpret_cast<const Bf16x8*>(shared)[i] : Bf16x8{};
#pragma unroll
  for (int col = 0; col < 8; ++col) acc[col] = to_float(s.e[col]);
}

}  // namespace mok::gpu
