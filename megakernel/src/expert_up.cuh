// GEMM1 + SwiGLU of the routed experts (h = bf16(xe W1^T), a = bf16(swiglu(h)) per padded row) and its
// epilogue, shared by the forward (this cycle's tiles) and, in recompute mode, the backward (every
// tile of this GPU's experts, before its ring cycles): one code, so the recomputed h and a are the
// forward's bits.
#pragma once

#include "epilogue_store.cuh"
#include "gemm_phases.cuh"
#include "mok/core/swiglu.h"
#include "schedule.cuh"
#include "tile_gemm.cuh"
#include "tile_schedules.cuh"

namespace mok::gpu {

// Gate columns per GEMM1 tile (the up columns fill the tile's other half).
inline constexpr int kGateCols = kTileN / 2;
static_assert(kGateCols == kFp8Block, "a GEMM1 tile's a columns are one fp8 block of each row");
static_assert(kGateCols == 32 * 4, "an epilogue lane holds 4 gate columns and their up partners");

// The bf16 GEMM1 epilogue (the consumers'): the tile's columns 0-127 are gate columns n0.., 128-255
// the matching up columns (those at or past inter - n0 are another matrix's: not written);
// h = bf16(gate | up) and a = bf16(swiglu(h)) for rows < valid, into rows first.. of h and a. All of a
// is computed in registers before the staged passes, so the compiler interleaves the 64 independent
// SwiGLUs (they are most of this epilogue's time).
__device__ inline void swiglu_epilogue(Pipeline& pipe, const Params& p, Warpgroup consumer,
                                       const float (&acc)[kAccumulators], int inter, int n0, int valid, long first,
                                       bf16* h, bf16* a) {
  constexpr int kUp = kAccumulators / 2;                  // accumulator i's up partner: i + kUp
  constexpr int kGateWindows = kTileN / 2 / kStagedCols;  // the up columns' windows follow the gate's
  uint32_t hw[kAccumulators / 2], aw[kUp / 2];
#pragma unroll
  for (int i = 0; i < kAccumulators; i += 2) hw[i / 2] = pack_bf16(acc[i], acc[i + 1]);
  const float limit = p.c.swiglu_limit;
#pragma unroll
  for (int i = 0; i < kUp; i += 2) {
    const uint32_t g = hw[i / 2], u = hw[(i + kUp) / 2];
    aw[i / 2] = pack_bf16(swiglu(low_float(g), low_float(u), limit), swiglu(high_float(g), high_float(u), limit));
  }
  stage_row_dst(pipe, consumer, 0, [&](int r) { return r < valid ? h + (first + r) * 2 * inter + n0 : nullptr; });
  stage_row_dst(pipe, consumer, 1, [&](int r) { return r < valid ? a + (first + r) * inter + n0 : nullptr; });
#pragma unroll
  for (int w = 0; w < kGateWindows; ++w) {
    if (n0 + kStagedCols * w >= inter) continue;
    staged_pass(pipe, consumer, 0, w, kStagedCols * w, [&](int i) { return hw[i / 2]; });
    staged_pass(pipe, consumer, 0, kGateWindows + w, inter + kStagedCols * w, [&](int i) { return hw[i / 2]; });
    staged_pass(pipe, consumer, 1, w, kStagedCols * w, [&](int i) { return aw[i / 2]; });
  }
}

// The fp8 mode's a for GEMM2 (aq): one staged row's a columns n0.., one 1 x 128 block of the row,
// quantized (the core's quantize_block) by the warp, 4 values per lane (av): the block's largest
// magnitude by shuffles over the warp, then this lane's 4 E4M3 codes (to_e4m3x2_scaled).
__device__ __forceinline__ void quantize_a_row(uint2 av, int n0, const Fp8Matrix& dst) {
  uint32_t amax = 0;
  for (const uint32_t w : {av.x, av.y}) amax = max(amax, max(w & 0x7fffu, (w >> 16) & 0x7fffu));
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) amax = max(amax, __shfl_xor_sync(~0u, amax, offset));
  const int e = block_scale_exponent(amax);
  const uint32_t codes = uint32_t(to_e4m3x2_scaled(low_float(av.x), high_float(av.x), e)) |
                         uint32_t(to_e4m3x2_scaled(low_float(av.y), high_float(av.y), e)) << 16;
  *reinterpret_cast<uint32_t*>(dst.values + n0 + 4 * lane_id()) = codes;
  if (lane_id() == 0) dst.exps[n0 / kFp8Block] = e;
}

// The fp8 forward's GEMM1 epilogue (the epilogue warps', on a staged half tile; columns as in
// swiglu_epilogue): for tile rows < valid, h = bf16(gate | up) and a = bf16(swiglu(h)) into rows
// first.. of h and a, and a quantized into aq for GEMM2; a warp per row, a lane its 4 gate columns and
// their up partners. Rows at or past valid (a token tile's past the last token) get a zero scale
// exponent in aq: GEMM2's tile reads it.
__device__ __forceinline__ void drain_swiglu_fp8(const Params& p, int half, StagedRows rows, int inter, int n0,
                                                 int valid, long first, bf16* h, bf16* a, const Fp8Matrix& aq) {
  const int col = 4 * lane_id();
  const float limit = p.c.swiglu_limit;
  for_each_staged_row([&](int r) {
    const long row = first + kWgmmaM * half + r;
    if (kWgmmaM * half + r >= valid) {
      if (lane_id() == 0) aq.row(row, inter).exps[n0 / kFp8Block] = 0;
      return;
    }
    const uint2 g = *reinterpret_cast<const uint2*>(&rows[r][col]);
    const uint2 u = *reinterpret_cast<const uint2*>(&rows[r][kGateCols + col]);
    const auto swiglu_pair = [&](uint32_t gw, uint32_t uw) {
      return pack_bf16(swiglu(low_float(gw), low_float(uw), limit), swiglu(high_float(gw), high_float(uw), limit));
    };
    const uint2 av{swiglu_pair(g.x, u.x), swiglu_pair(g.y, u.y)};
    bf16* hr = h + row * 2 * inter + n0 + col;  // inter % 128 == 0 in fp8: every column is the matrix's
    *reinterpret_cast<uint2*>(hr) = g;
    *reinterpret_cast<uint2*>(hr + inter) = u;
    *reinterpret_cast<uint2*>(a + row * inter + n0 + col) = av;
    quantize_a_row(av, n0, aq.row(row, inter));
  });
}

// GEMM1 + SwiGLU on the rows of xe (in the fp8 mode, kFp8: of xq) of the expert tiles of `tiles`
// (RingTiles or OwnTiles, 128 columns of I per tile) into p.h and p.a (and p.aq). Padding rows (zero in xe) are
// written too: their a is zero, as the weight gradients expect.
// In the fp8 forward (kFp8) the epilogue warps store the tiles (drain_swiglu_fp8), elsewhere the consumers.
template <bool kFp8, class Tiles>
__device__ void expert_up_tiles(Pipeline& pipe, const Params& p, const Tiles& tiles) {
  const int I = p.c.intermediate, H = p.c.hidden;
  const auto load = [&](const RingItem& it) {
    const int w = own_expert(p, it.t.expert) * 2 * I + it.n0;
    if constexpr (kFp8) return k_major(p.maps.xq, p.maps.w1q, it.t.pad_row, w, w + I, H, {p.xq.exps, p.w1_exp});
    return k_major(p.maps.xe, p.maps.w1, it.t.pad_row, w, w + I, H);
  };
  if constexpr (kFp8)
    expert_gemm<kNT, true>(pipe, p, tiles, kExpertUp, load, Staged{[&](const RingItem& it, int half, StagedRows rows) {
                             drain_swiglu_fp8(p, half, rows, I, it.n0, kTileRows, it.t.pad_row, p.h, p.a, p.aq);
                           }});
  else
    expert_gemm<kNT>(pipe, p, tiles, kExpertUp, load,
                     InRegisters{[&](const RingItem& it, Warpgroup consumer, const float(&acc)[kAccumulators]) {
                       swiglu_epilogue(pipe, p, consumer, acc, I, it.n0, kTileRows, it.t.pad_row, p.h, p.a);
                     }});
}

// The forward's GEMM1 + SwiGLU on this cycle's tiles: (rank, ring slot, column tile).
template <bool kFp8>
__device__ inline void expert_up(Pipeline& pipe, const Params& p, int cycle) {
  expert_up_tiles<kFp8>(pipe, p, RingTiles{p, cycle, ceil_div(p.c.intermediate, kGateCols), kGateCols});
}

// The backward's recompute (Params::recompute): h and a of every tile of this GPU's experts in one pass.
__device__ inline void recompute_up(Pipeline& pipe, const Params& p) {
  expert_up_tiles<false>(pipe, p, OwnTiles{p, ceil_div(p.c.intermediate, kGateCols), kGateCols});
}

}  // namespace mok::gpu
