// The GEMM epilogues' stores through shared memory: half tiles rounded to bf16 and stored into global
// memory through the consumer warpgroup's staging rows, or the weight gradients' half tiles stored or
// added by the TMA from the consumer's chunk buffers.
#pragma once

#include <type_traits>

#include "bf16_words.cuh"
#include "schedule.cuh"
#include "tile_gemm.cuh"
#include "tile_schedules.cuh"

namespace mok::gpu {

// A finished half tile goes to bf16 rows in global memory through the consumer warpgroup's staging
// rows in shared memory, in passes of 64 columns. stage_row_dst publishes where each of the
// warpgroup's 64 rows goes (row_dst(row within the whole tile); nullptr: skip); thread t < 64 computes
// row t's.
template <class RowDst>
__device__ __forceinline__ void stage_row_dst(Pipeline& pipe, Warpgroup consumer, RowDst row_dst) {
  const int c = consumer_index(consumer), t = threadIdx.x % kWarpgroupThreads;
  if (t < kWgmmaM) pipe.smem->staged_dst[c][t] = row_dst(kWgmmaM * c + t);
}

// One pass: accumulators [32 window, 32 window + 32) (tile columns 64 window ..), word(i) giving pair
// i packed as bf16, are staged; then 8 lanes copy each row's 128 bytes with 16-byte stores to its
// destination, plus `offset` elements. A thread copies the same four rows in every pass.
// Windows are whole: H, I and Is are multiples of 64 (config.h), so no pass runs past a row's end.
// (g skips the staging: the accumulator layout's 8-byte pairs already fill whole sectors, and staged
// they were slower, docs/results/2026-11-29-h200-w; weight gradients leave by TMA, store_rows_by_tma.)
template <class Word>
__device__ __forceinline__ void staged_pass(Pipeline& pipe, Warpgroup consumer, int window, long offset, Word word) {
  constexpr int kPerPass = kWgmmaM * kStagedCols / kWarpgroupThreads;  // accumulators per thread and pass
  constexpr int kChunk = int(16 / sizeof(bf16)), kChunksPerRow = kStagedCols / kChunk;  // 16-byte chunks, lanes per row
  constexpr int kRowsPerThread = kWgmmaM * kChunksPerRow / kWarpgroupThreads;
  const int c = consumer_index(consumer);
  uint16_t(*rows)[kStagedPitch] = pipe.smem->staged[c];
  void* const* dst = pipe.smem->staged_dst[c];
  const int t = threadIdx.x % kWarpgroupThreads, chunk = t % kChunksPerRow;
  warpgroup_sync(consumer);  // the last pass's copies are done with the rows; the destinations are published
#pragma unroll
  for (int i = kPerPass * window; i < kPerPass * (window + 1); i += 2)
    *reinterpret_cast<uint32_t*>(&rows[acc_row(consumer, i) - kWgmmaM * c][acc_col(i) - kStagedCols * window]) =
        word(i);
  warpgroup_sync(consumer);
  const auto row = [&](int j) { return t / kChunksPerRow + kWarpgroupThreads / kChunksPerRow * j; };
  const auto chunk_at = [&](int j) -> uint4* {
    bf16* d = static_cast<bf16*>(dst[row(j)]);
    return d ? reinterpret_cast<uint4*>(d + offset + kChunk * chunk) : nullptr;
  };
#pragma unroll
  for (int j = 0; j < kRowsPerThread; ++j)
    if (uint4* d = chunk_at(j)) *d = *reinterpret_cast<const uint4*>(&rows[row(j)][kChunk * chunk]);
}

// A finished half tile rounded to bf16 and stored into the rows row_dst(r) (r within the whole tile;
// nullptr: skip), columns 0 .. `columns` of the tile (a multiple of 64), through the staging rows:
// whole 128-byte row parts, 16 bytes per lane. The row table is free: the warpgroup met at the end of
// this tile's chain, after the last tile's passes.
template <class RowDst>
__device__ __forceinline__ void store_rows_bf16(Pipeline& pipe, Warpgroup consumer, const float (&acc)[kAccumulators],
                                                int columns, RowDst row_dst) {
  stage_row_dst(pipe, consumer, row_dst);
#pragma unroll
  for (int w = 0; w < kTileN / kStagedCols; ++w)
    if (kStagedCols * w < columns)
      staged_pass(pipe, consumer, w, kStagedCols * w, [&](int i) { return pack_bf16(acc[i], acc[i + 1]); });
}

// A finished half tile into rows row0.. of `map` (an output of Out: MapElement::f32, or bf16_out with
// the accumulators rounded as pack_bf16 rounds them), columns col0 .. col0 + `columns` (a multiple of
// 64): stored, or with `add` added into what the rows hold by the TMA's reduce-add (core gradient_add.h:
// the fp32 add, or autograd's bf16 add; subnormals kept, NaN canonical: TmaReduceAdd). The epilogue issues
// no global load or store, and the copies drain while the next tile's chain runs.
// The chunks: 64 bytes of each row (16 fp32 or 32 bf16 columns), written into one of two buffers in the
// 64-byte swizzle (out_chunk_col: conflict-free pair writes). Bulk async-groups belong to a thread, so
// thread 0 of the warpgroup issues every chunk, and before each barrier waits until the previous chunk
// has been read: after the barrier the other buffer is free. finish_chunk_copies() must follow the
// phase's last tile.
template <class Out>
__device__ __forceinline__ void store_rows_by_tma(Pipeline& pipe, Warpgroup consumer, const float (&acc)[kAccumulators],
                                                  const CUtensorMap* map, int col0, int row0, int columns, bool add) {
  constexpr int kCols = kOutChunkCols<Out>, kPerChunk = kCols / 2;  // accumulators per thread and chunk
  static_assert(std::is_same_v<Out, float> || std::is_same_v<Out, bf16>, "fp32 or bf16 outputs");
  const int c = consumer_index(consumer);
  const bool issuer = threadIdx.x % kWarpgroupThreads == 0;
  if (issuer) ptx::bulk_wait_group_read<0>();  // the last tile's final chunk has left its buffer
  warpgroup_sync(consumer);
#pragma unroll
  for (int chunk = 0; chunk < kTileN / kCols; ++chunk) {
    if (kCols * chunk >= columns) break;
    Out(*rows)[kCols] = reinterpret_cast<Out(*)[kCols]>(pipe.smem->out_chunks[c][chunk % kOutChunkBuffers]);
#pragma unroll
    for (int i = kPerChunk * chunk; i < kPerChunk * (chunk + 1); i += 2) {
      const int row = acc_row(consumer, i) - kWgmmaM * c, col = acc_col(i) - kCols * chunk;
      Out* const at = &rows[row][out_chunk_col<Out>(row, col)];
      if constexpr (std::is_same_v<Out, float>)
        *reinterpret_cast<float2*>(at) = float2{acc[i], acc[i + 1]};
      else
        *reinterpret_cast<uint32_t*>(at) = pack_bf16(acc[i], acc[i + 1]);
    }
    ptx::fence_async_shared();                   // the writes come before the TMA's reads of the buffer
    if (issuer) ptx::bulk_wait_group_read<0>();  // the previous chunk has left the other buffer
    warpgroup_sync(consumer);
    if (issuer) {
      if (add)
        ptx::tma_reduce_add_2d(map, rows, col0 + kCols * chunk, row0);
      else
        ptx::tma_store_2d(map, rows, col0 + kCols * chunk, row0);
      ptx::bulk_commit_group();
    }
  }
}

// After a phase's last store_rows_by_tma: its copies have completed, so the buffers (the staging rows)
// are free for the next phase's epilogues and the outputs are written before the phase's barrier.
__device__ __forceinline__ void finish_chunk_copies() {
  if (threadIdx.x % kWarpgroupThreads == 0) ptx::bulk_wait_all();
  __syncthreads();
}

// Push: a finished half tile, each valid row rounded to bf16 into the (token, slot) buffer of its
// source rank (y_j in the forward, dx_j in the backward).
__device__ inline void push_to_slots(Pipeline& pipe, const Params& p, const RingItem& it, Warpgroup consumer,
                                     const float (&acc)[kAccumulators]) {
  const int H = p.c.hidden;
  store_rows_bf16(pipe, consumer, acc, H - it.n0, [&](int r) -> bf16* {
    if (r >= it.t.rows) return nullptr;
    const RankBuffers* src;
    const long slot = source_slot(p, it.t.first_row + r, src);
    return src->slots + slot * H + it.n0;
  });
}

}  // namespace mok::gpu
