// Warp-wide row copies: one warp moves one row in 16-byte vectors, several loads in flight per lane;
// and the fp8 mode's row quantization.
#pragma once

#include "mok/core/fp8_gemm.h"
#include "schedule.cuh"

namespace mok::gpu {

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

// The quantization of one 1 x 128 block (the core's quantize_block) held by a half warp, 8 values per
// lane (v: this lane's): the block's largest magnitude by shuffles within the half warp, then this
// lane's 8 E4M3 codes, packed (converted two at a time, to_e4m3x2_scaled); e: the block's scale
// exponent. The half warp's 16 lanes take part together.
__device__ __forceinline__ uint2 quantize_half_warp(const Bf16x8& v, int& e) {
  static_assert(kFp8Block == 16 * 8, "a half warp's 16-byte vectors cover one block");
  const unsigned half_warp = lane_id() < 16 ? 0x0000ffffu : 0xffff0000u;
  uint32_t amax = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) amax = max(amax, uint32_t(v.e[j].bits & 0x7fffu));
#pragma unroll
  for (int offset = 8; offset > 0; offset /= 2) amax = max(amax, __shfl_xor_sync(half_warp, amax, offset));
  e = block_scale_exponent(amax);
  uint32_t word[2] = {};
#pragma unroll
  for (int j = 0; j < 8; j += 2)
    word[j / 4] |= uint32_t(to_e4m3x2_scaled(to_float(v.e[j]), to_float(v.e[j + 1]), e)) << (8 * (j % 4));
  return uint2{word[0], word[1]};
}

// Vector i (8 values) of a row quantized into that row of an Fp8Matrix (quantize_half_warp): its half
// warp holds the vector's whole block, lane i % 32 vector i, as in a row_pass over whole blocks.
__device__ __forceinline__ void store_quantized(const Fp8Matrix& row, int i, const Bf16x8& v) {
  int e;
  reinterpret_cast<uint2*>(row.values)[i] = quantize_half_warp(v, e);
  if (i % 16 == 0) row.exps[i / 16] = e;
}

// One row of h bf16 quantized into E4M3 in 1 x 128 blocks (quantize_half_warp): dst_q [h], its
// exponents [h / 128]; and copied into dst unless it is null (the pull's copy_row). A null source
// quantizes (and copies) zeros. Vector i is lane i % 32's, so each block's 16 vectors are one half
// warp's, all present or all past the row's end (h % 128 == 0).
__device__ __forceinline__ void quantize_row(Fp8Matrix dst_q, bf16* dst, const bf16* src, int h) {
  const Bf16x8* s = reinterpret_cast<const Bf16x8*>(src);
  Bf16x8* d = reinterpret_cast<Bf16x8*>(dst);
  row_pass<8>(
      h / 8, [&](int i) { return src ? s[i] : Bf16x8{}; },
      [&](int i, const Bf16x8& v) {
        if (dst) d[i] = v;
        store_quantized(dst_q, i, v);
      });
}

// Every token's row of an [N, H] bf16 input quantized into q (the fp8 mode's A of a shared-expert GEMM
// over all tokens): row(g) is token g's; the scale exponents of the padding rows past the last token
// (its last token tile reads them) zero.
template <class Row>
__device__ void quantize_token_rows(const Params& p, const Fp8Matrix& q, Row row) {
  const int H = p.c.hidden, N = p.c.tokens();
  for (long g = warp_id(); g < N; g += warp_count()) quantize_row(q.row(g, H), nullptr, row(g), H);
  static_assert(kTileRows == kFp8Block, "the exponent tables' rows are padded to whole tiles (fp8_sections)");
  const long blocks = H / kFp8Block, tail = (ceil_div(N, kTileRows) * kTileRows - N) * blocks;
  for (long i = thread_id(); i < tail; i += thread_count()) q.exps[N * blocks + i] = 0;
}

}  // namespace mok::gpu
