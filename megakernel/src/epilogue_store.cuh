// The GEMM epilogues' stores: accumulator pairs rounded to bf16 and packed; bf16 half tiles moved to
// global memory through the consumer warpgroup's staging rows in shared memory (InRegisters phases);
// and the epilogue warps' stores of staged half tiles (Staged phases), whole rows, 16 bytes per lane.
#pragma once

#include "schedule.cuh"
#include "tile_gemm.cuh"
#include "tile_schedules.cuh"

namespace mok::gpu {

__device__ __forceinline__ float low_float(uint32_t w) { return to_float(bf16{uint16_t(w & 0xffffu)}); }
__device__ __forceinline__ float high_float(uint32_t w) { return to_float(bf16{uint16_t(w >> 16)}); }

__device__ __forceinline__ void store_pair(bf16* dst, float v0, float v1) {
  *reinterpret_cast<uint32_t*>(dst) = pack_bf16(v0, v1);
}

// A finished half tile goes to bf16 rows in global memory through the consumer warpgroup's staging
// rows in shared memory, in passes of 64 columns. stage_row_dst publishes where each of the
// warpgroup's 64 rows goes (row_dst(row within the whole tile); nullptr: skip) in one of two tables;
// thread t < 64 computes row t's.
template <class RowDst>
__device__ __forceinline__ void stage_row_dst(Pipeline& pipe, Warpgroup consumer, int table, RowDst row_dst) {
  const int c = consumer_index(consumer), t = threadIdx.x % kWarpgroupThreads;
  if (t < kWgmmaM) pipe.smem->staged_dst[c][table][t] = row_dst(kWgmmaM * c + t);
}

// One pass: accumulators [32 window, 32 window + 32) (tile columns 64 window ..), word(i) giving pair
// i packed as bf16, are staged; then 8 lanes copy each row's 128 bytes with 16-byte stores to its
// destination in `table`, plus `offset` elements. A thread copies the same four rows in every pass.
// Windows are whole: H, I and Is are multiples of 64 (config.h), so no pass runs past a row's end.
// (fp32 tiles skip the staging: the accumulator layout's 8-byte pairs already fill whole sectors, and
// staged they were slower, docs/results/2026-11-29-h200-w.)
template <class Word>
__device__ __forceinline__ void staged_pass(Pipeline& pipe, Warpgroup consumer, int table, int window, long offset,
                                            Word word) {
  constexpr int kPerPass = kWgmmaM * kStagedCols / kWarpgroupThreads;  // accumulators per thread and pass
  constexpr int kChunk = int(16 / sizeof(bf16)), kChunksPerRow = kStagedCols / kChunk;  // 16-byte chunks, lanes per row
  constexpr int kRowsPerThread = kWgmmaM * kChunksPerRow / kWarpgroupThreads;
  const int c = consumer_index(consumer);
  uint16_t(*rows)[kStagedPitch] = pipe.smem->staged[c];
  void* const* dst = pipe.smem->staged_dst[c][table];
  const int t = threadIdx.x % kWarpgroupThreads, chunk = t % kChunksPerRow;
  warpgroup_sync(consumer);  // the last pass's copies are done with the rows; the destinations are published
#pragma unroll
  for (int i = kPerPass * window; i < kPerPass * (window + 1); i += 2)
    *reinterpret_cast<uint32_t*>(&rows[acc_row(consumer, i) - kWgmmaM * c][acc_col(i) - kStagedCols * window]) =
        word(i);
  warpgroup_sync(consumer);
#pragma unroll
  for (int j = 0; j < kRowsPerThread; ++j) {
    const int r = t / kChunksPerRow + kWarpgroupThreads / kChunksPerRow * j;
    if (bf16* d = static_cast<bf16*>(dst[r]))
      *reinterpret_cast<int4*>(d + offset + kChunk * chunk) = *reinterpret_cast<const int4*>(&rows[r][kChunk * chunk]);
  }
}

// The (token, slot) buffer row of the source rank of ring tile `it`'s row r (valid rows only), at the
// tile's first column: where a push writes it.
__device__ __forceinline__ bf16* slot_row(const Params& p, const RingItem& it, int r) {
  const RankBuffers* src;
  const long slot = source_slot(p, it.t.first_row + r, src);
  return src->slots + slot * p.c.hidden + it.n0;
}

// Push: a finished half tile, each valid row rounded to bf16 into the (token, slot) buffer of its
// source rank (y_j in the forward, dx_j in the backward). The row table is free: the warpgroup met at
// the end of this tile's chain, after the last tile's passes.
__device__ inline void push_to_slots(Pipeline& pipe, const Params& p, const RingItem& it, Warpgroup consumer,
                                     const float (&acc)[kAccumulators]) {
  const int H = p.c.hidden;
  stage_row_dst(pipe, consumer, 0, [&](int r) { return r < it.t.rows ? slot_row(p, it, r) : nullptr; });
#pragma unroll
  for (int w = 0; w < kTileN / kStagedCols; ++w)
    if (it.n0 + kStagedCols * w < H)
      staged_pass(pipe, consumer, 0, w, kStagedCols * w, [&](int i) { return pack_bf16(acc[i], acc[i + 1]); });
}

// The epilogue warp's share of a staged half tile: rows w, w + kEpilogueWarps, ... (w: its index among
// the epilogue warps, warps 1-3 of warpgroup 0); fn(r) for each.
inline constexpr int kRowsPerEpilogueWarp = (kWgmmaM + kEpilogueWarps - 1) / kEpilogueWarps;
__device__ __forceinline__ int epilogue_warp() { return int(threadIdx.x) / 32 - 1; }
__device__ __forceinline__ int staged_row(int j) { return epilogue_warp() + kEpilogueWarps * j; }
template <class Fn>
__device__ __forceinline__ void for_each_staged_row(Fn fn) {
  for (int j = 0; j < kRowsPerEpilogueWarp; ++j)
    if (staged_row(j) < kWgmmaM) fn(staged_row(j));
}

// A staged half tile (`half` of the tile) to global rows: tile row i goes to row_dst(i) (nullptr:
// skipped), its first `columns` columns (a multiple of 8), 16 bytes per lane. Lane j first finds the
// destination of the warp's j-th row, so the rows' lookups (chains of loads) overlap.
template <class RowDst>
__device__ __forceinline__ void drain_rows(int half, StagedRows rows, int columns, RowDst row_dst) {
  static_assert(kRowsPerEpilogueWarp <= 32 && kTileN == 32 * 8, "a lane per row to look up, 8 columns per lane");
  const int lane = lane_id();
  bf16* mine =
      lane < kRowsPerEpilogueWarp && staged_row(lane) < kWgmmaM ? row_dst(kWgmmaM * half + staged_row(lane)) : nullptr;
  const bool in_row = 8 * lane < columns;
  for (int j = 0; j < kRowsPerEpilogueWarp; ++j) {
    bf16* d = reinterpret_cast<bf16*>(__shfl_sync(~0u, reinterpret_cast<unsigned long long>(mine), j));
    if (d && in_row && staged_row(j) < kWgmmaM)
      *reinterpret_cast<int4*>(d + 8 * lane) = *reinterpret_cast<const int4*>(&rows[staged_row(j)][8 * lane]);
  }
}

// Push (the epilogue warps'): a staged tile's valid rows into the (token, slot) buffers of their
// source ranks.
__device__ __forceinline__ void drain_to_slots(const Params& p, const RingItem& it, int half, StagedRows rows) {
  drain_rows(half, rows, p.c.hidden - it.n0, [&](int r) { return r < it.t.rows ? slot_row(p, it, r) : nullptr; });
}

}  // namespace mok::gpu
