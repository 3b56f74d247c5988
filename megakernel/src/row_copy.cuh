// Warp-wide row copies: one warp moves one row in 16-byte vectors, several loads in flight per lane;
// and the fp8 mode's row quantization.
#pragma once

#include "bf16_words.cuh"
#include "mok/core/fp8_gemm.h"
#include "schedule.cuh"

namespace mok::gpu {

// Eight consecutive bf16 (16 bytes: one vector access per lane, so a warp moves 512 bytes per step).
struct alignas(16) Bf16x8 {
  bf16 e[8];
};

// A warp's pass over one row of n vectors, 32 kBatch at a time: vector i is lane i % 32's, and each
// lane issues its kBatch loads before their steps (such a loop is latency-bound, and the compiler may
// not hoist a load over a store it cannot prove distinct). Every lane runs each step that holds some of
// the row, step(i, v, in_row), a lane past the row's end on a zero value: so a step may shuffle across
// the whole warp.
template <int kBatch, class Load, class Step>
__device__ __forceinline__ void warp_row_pass(int n, Load load, Step step) {
  using Value = decltype(load(0));
  for (int base = 0; base < n; base += 32 * kBatch) {
    Value v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = base + 32 * b + lane_id();
      v[b] = i < n ? load(i) : Value{};
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (base + 32 * b >= n) break;  // the whole warp past the row's end: the same in every lane
      const int i = base + 32 * b + lane_id();
      step(i, v[b], i < n);
    }
  }
}

// store(i, load(i)) on each of the row's n vectors (warp_row_pass).
template <int kBatch = 4, class Load, class Store>
__device__ __forceinline__ void row_pass(int n, Load load, Store store) {
  warp_row_pass<kBatch>(n, load, [&](int i, const auto& v, bool in_row) {
    if (in_row) store(i, v);
  });
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

// each(lane, row) for the lanes set in `lanes` (the same in every lane), in lane order, with that lane's
// `row`. The whole warp calls it: rows go round by shuffles.
template <class Each>
__device__ __forceinline__ void for_each_lane_row(uint32_t lanes, long row, Each each) {
  for (uint32_t left = lanes; left; left &= left - 1) {
    const int lane = __ffs(left) - 1;
    each(lane, __shfl_sync(~0u, row, lane));
  }
}

// Warp-wide copy of one H-row into several: src (16-byte vectors, read once) into dst(row) for the rows
// of `lanes` (for_each_lane_row), as copy_row copies into one; step(lane, row, i, v) may change vector i
// (8 bf16 as 4 words) on its way into that row (returning it). Every lane runs each step (it may
// shuffle), a lane past the row's end on a zero vector.
template <class Dst, class Step>
__device__ __forceinline__ void copy_row_to_rows(const bf16* src, int h, uint32_t lanes, long row, Dst dst, Step step) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
  warp_row_pass<8>(
      h / 8, [&](int i) { return s[i]; },
      [&](int i, const uint4& v, bool in_row) {
        for_each_lane_row(lanes, row, [&](int lane, long r) {
          const uint4 out = step(lane, r, i, v);
          if (in_row) reinterpret_cast<uint4*>(dst(r))[i] = out;
        });
      });
}

// ... each vector unchanged.
template <class Dst>
__device__ __forceinline__ void copy_row_to_rows(const bf16* src, int h, uint32_t lanes, long row, Dst dst) {
  copy_row_to_rows(src, h, lanes, row, dst, [](int, long, int, const uint4& v) { return v; });
}

// The quantization of one 1 x 128 block (the core's quantize_block) held by a half warp, 8 values per
// lane as 4 words (v: this lane's): the block's largest magnitude by shuffles within the half warp,
// then this lane's 8 E4M3 codes, packed (converted two at a time, to_e4m3x2_scaled); e: the block's
// scale exponent. The whole warp takes part, a block per half warp: its shuffles take the full mask
// (offsets below 16 stay in a half; a mask per half warp costs a loop over the lanes' masks).
__device__ __forceinline__ uint2 quantize_half_warp(const uint4& v, int& e) {
  static_assert(kFp8Block == 16 * 8, "a half warp's 16-byte vectors cover one block");
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t amax = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) amax = max(amax, magnitude_bits(w[j]));
#pragma unroll
  for (int offset = 8; offset > 0; offset /= 2) amax = max(amax, __shfl_xor_sync(~0u, amax, offset));
  e = block_scale_exponent(amax);
  uint32_t codes[2];
#pragma unroll
  for (int j = 0; j < 4; j += 2) codes[j / 2] = e4m3x2_of(w[j], e) | e4m3x2_of(w[j + 1], e) << 16;
  return uint2{codes[0], codes[1]};
}

// Vector i's E4M3 codes (quantize_half_warp's) into that row of an Fp8Matrix, and its block's exponent
// by the block's first lane.
__device__ __forceinline__ void store_codes(const Fp8Matrix& row, int i, uint2 codes, int e) {
  reinterpret_cast<uint2*>(row.values)[i] = codes;
  if (i % 16 == 0) row.block_exp(i / 16) = e;
}

// Vector i (8 values as 4 words) of a row quantized into that row of an Fp8Matrix by a step of a
// warp_row_pass (quantize_half_warp): its half warp holds the vector's whole block; a lane past the
// row's end (in_row false: its whole half warp, as rows are whole blocks) stores nothing.
__device__ __forceinline__ void store_quantized(const Fp8Matrix& row, int i, const uint4& v, bool in_row) {
  int e;
  const uint2 codes = quantize_half_warp(v, e);
  if (in_row) store_codes(row, i, codes, e);
}

// One row of h bf16 quantized into E4M3 in 1 x 128 blocks (quantize_half_warp), once, into the rows of
// `lanes` (for_each_lane_row): dst_q(row) [h], its h / 128 exponents (block_exp: kFp8Block apart, the
// activations' tile-major layout); and copied into dst(row) unless that is null (the pull's copy). A null
// source quantizes (and copies) zeros. h % 128 == 0.
template <class DstQ, class Dst>
__device__ __forceinline__ void quantize_row_to_rows(const bf16* src, int h, uint32_t lanes, long row, DstQ dst_q,
                                                     Dst dst) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
  warp_row_pass<8>(
      h / 8, [&](int i) { return src ? s[i] : uint4{}; },
      [&](int i, const uint4& v, bool in_row) {
        int e;
        const uint2 codes = quantize_half_warp(v, e);
        for_each_lane_row(lanes, row, [&](int, long r) {
          if (!in_row) return;
          if (bf16* d = dst(r)) reinterpret_cast<uint4*>(d)[i] = v;
          store_codes(dst_q(r), i, codes, e);
        });
      });
}

// quantize_row_to_rows into one row.
__device__ __forceinline__ void quantize_row(Fp8Matrix dst_q, bf16* dst, const bf16* src, int h) {
  quantize_row_to_rows(
      src, h, 1u, 0, [&](long) { return dst_q; }, [&](long) { return dst; });
}

// Rows [0, rows) of q quantized from h bf16 each, a warp per row: row(r) is row r's source.
template <class Row>
__device__ void quantize_rows(const Fp8Matrix& q, long rows, int h, Row row) {
  for (long r = warp_id(); r < rows; r += warp_count()) quantize_row(q.row(r, h), nullptr, row(r), h);
}

// The rows of the shared expert's tokens (Params::shared_tokens) of an [S, H] bf16 input quantized into
// q (the fp8 mode's A of a shared-expert GEMM): row(r) is its token r's (from its first); the scale
// exponents of the padding rows past the last (its last token tile reads them) zero.
template <class Row>
__device__ void quantize_token_rows(const Params& p, const Fp8Matrix& q, Row row) {
  const int H = p.c.hidden;
  const long rows = p.shared_tokens.rows();
  quantize_rows(q, rows, H, row);
  static_assert(kTileRows == kFp8Block, "the exponent tables' rows are padded to whole tiles (activation_section)");
  const long blocks = H / kFp8Block, tail = (long(ceil_div(int(rows), kTileRows)) * kTileRows - rows) * blocks;
  for (long i = thread_id(); i < tail; i += thread_count()) q.row(rows + i / blocks, H).block_exp(int(i % blocks)) = 0;
}

// quantize_token_rows of a per-token input (x or dy) read from its tokens' ranks' buffers (token_row):
// across GPUs the next GPU's first tokens too, with no gather of them before.
__device__ inline void quantize_shared_rows(const Params& p, const Fp8Matrix& q, const bf16* RankBuffers::*input) {
  quantize_token_rows(p, q, [&](long r) { return token_row(p, int(p.shared_tokens.begin + r), input); });
}

}  // namespace mok::gpu
