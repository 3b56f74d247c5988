// The GEMM epilogues' bf16 stores: half tiles rounded to bf16 and moved to global memory (stored, or
// added into what it holds) from the consumers' registers, 16 bytes a lane after a quad transpose.
#pragma once

#include "bf16_words.cuh"
#include "schedule.cuh"
#include "tile_gemm.cuh"
#include "tile_schedules.cuh"

namespace mok::gpu {

// Four of a row's bf16 words, w[c] at columns 8 c + 2 q, +1 (of some 32-column group) in quad thread
// q, transposed within the quad: thread q gets columns 8 q .. 8 q + 7, 16 bytes in order. Two exchanges
// of two words: with thread q ^ 2 the words of the other half (c & 2 != q & 2), then with q ^ 1 the
// two it needs. Every lane of the warp must take part (the shuffles' full mask).
__device__ __forceinline__ uint4 quad_transpose_words(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  const unsigned q = threadIdx.x % 4;
  const bool odd = q & 1, upper = q & 2;
  const uint32_t kept0 = upper ? w2 : w0, kept1 = upper ? w3 : w1;  // words q & 2, +1 of thread q
  const uint32_t got0 = __shfl_xor_sync(~0u, upper ? w0 : w2, 2);   // the same words of thread q ^ 2
  const uint32_t got1 = __shfl_xor_sync(~0u, upper ? w1 : w3, 2);
  const uint32_t mine = odd ? kept1 : kept0, across = odd ? got1 : got0;  // word q of threads q, q ^ 2
  const uint32_t near = __shfl_xor_sync(~0u, odd ? kept0 : kept1, 1);     // word q of thread q ^ 1
  const uint32_t far = __shfl_xor_sync(~0u, odd ? got0 : got1, 1);        // word q of thread q ^ 3
  const uint2 near_pair = odd ? uint2{near, mine} : uint2{mine, near};    // threads q & 2, +1
  const uint2 far_pair = odd ? uint2{far, across} : uint2{across, far};   // threads q & 2 ^ 2, +1
  return upper ? uint4{far_pair.x, far_pair.y, near_pair.x, near_pair.y}
               : uint4{near_pair.x, near_pair.y, far_pair.x, far_pair.y};
}

// Group g (columns 32 g .. 32 g + 31) of this thread's row `half`, from its bf16 words w (word half + 2 k
// at columns 8 k + 2 q, +1, as the accumulators lie: acc_tile_col), as this lane's 16 bytes: columns
// 32 g + 8 q ... Every lane of the warp must call it.
template <int kWords>
__device__ __forceinline__ uint4 row_group(const uint32_t (&w)[kWords], int half, int g) {
  const auto word = [&](int c) { return w[half + 2 * (4 * g + c)]; };
  return quad_transpose_words(word(0), word(1), word(2), word(3));
}

// Where this lane's 16 bytes of a group starting at `group` (row_group) go; nullptr where the row is.
__device__ __forceinline__ uint4* lane_chunk(bf16* row, long group) {
  return row ? reinterpret_cast<uint4*>(row + group + 8 * (threadIdx.x % 4)) : nullptr;
}

// A finished half tile rounded to bf16 and stored into the rows row_dst(r) (r within the whole tile;
// nullptr: skip), or with kAdd added into what they hold as autograd adds bf16 gradients (core
// add_bf16_words), columns 0 .. `columns` (a multiple of 32: H, I and Is are multiples of 64, config.h).
// From registers, after a quad transpose (row_group): each quad's 64 bytes of a row in one 16-byte store
// a lane, whole sectors, with neither shared memory nor a barrier (through staging rows, 128 bytes a
// row, GEMM1 took 1-6% longer: docs/results/2026-12-03-h200-h). (fp32 tiles need no transpose: the
// accumulator layout's 8-byte pairs already fill whole sectors.) With kAdd a row's held chunks are
// loaded before any is written (the compiler cannot move a load past a store to the same row).
template <bool kAdd = false, class RowDst>
__device__ __forceinline__ void store_rows_bf16(Warpgroup consumer, const float (&acc)[kAccumulators], int columns,
                                                RowDst row_dst) {
  constexpr int kGroups = kTileN / 32;
  uint32_t w[kAccumulators / 2];
#pragma unroll
  for (int i = 0; i < kAccumulators; i += 2) w[i / 2] = pack_bf16(acc[i], acc[i + 1]);
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // the thread's two rows
    bf16* const row = row_dst(acc_row(consumer, 2 * half));
    const auto chunk = [&](int g) { return 32 * g < columns ? lane_chunk(row, 32 * g) : nullptr; };
    [[maybe_unused]] uint4 held[kGroups];
    if constexpr (kAdd) {
#pragma unroll
      for (int g = 0; g < kGroups; ++g)
        if (const uint4* d = chunk(g)) held[g] = *d;
    }
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      if (32 * g >= columns) continue;  // the whole warp's
      uint4 v = row_group(w, half, g);
      if (uint4* d = chunk(g)) {
        if constexpr (kAdd)
          v = {add_bf16_words(held[g].x, v.x), add_bf16_words(held[g].y, v.y), add_bf16_words(held[g].z, v.z),
               add_bf16_words(held[g].w, v.w)};
        *d = v;
      }
    }
  }
}

// Push: a finished half tile, each valid row rounded to bf16 into the (token, slot) buffer of its
// source rank (y_j in the forward, dx_j in the backward).
__device__ inline void push_to_slots(const Params& p, const RingItem& it, Warpgroup consumer,
                                     const float (&acc)[kAccumulators]) {
  const int H = p.c.hidden;
  store_rows_bf16(consumer, acc, H - it.n0, [&](int r) -> bf16* {
    if (r >= it.t.rows) return nullptr;
    const RankBuffers* src;
    const long slot = source_slot(p, it.t.first_row + r, src);
    return src->slots + slot * H + it.n0;
  });
}

}  // namespace mok::gpu
