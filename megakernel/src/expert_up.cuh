// The pull of x into xe and GEMM1 + SwiGLU of the routed experts (h = bf16(xe W1^T), a = bf16(swiglu(h))
// per padded row) with its epilogue, and the shared expert's GEMM1 + SwiGLU, shared by the forward
// (this cycle's tiles) and, in recompute mode, the backward (every tile of this GPU's experts, and the
// shared expert's tokens, before its ring cycles): one code, so the pulled xe and the recomputed h (and
// the shared expert's a) are the forward's bits.
#pragma once

#include "bf16_words.cuh"
#include "gemm_phases.cuh"
#include "row_copy.cuh"
#include "schedule.cuh"
#include "swiglu_words.cuh"
#include "tile_gemm.cuh"
#include "tile_schedules.cuh"

namespace mok::gpu {

// The dispatch: x of the tile rows to_row selects (their padded rows; -1: not this pull's), pulled from
// the source ranks' buffers straight into xe (per padded row: GEMM1's A, and dW1's operand in the
// backward), a warp per token, which reads its x once for all of its rows (for_each_token_slots); with
// `padding` the padding rows zero as well. In the fp8 mode (kFp8) each row is also quantized into xq
// (GEMM1's A), and without `copy` only that.
template <bool kFp8, class ToRow>
__device__ void pull_x_rows(const Params& p, bool padding, bool copy, ToRow to_row) {
  const int H = p.c.hidden;
  const auto xe = [&](long pad) { return copy ? p.xe + pad * H : nullptr; };
  const auto xq = [&](long pad) { return p.xq.row(pad, H); };
  if (padding)
    for_each_padding_row(p, [&](ExpertTileRow row) {
      if constexpr (kFp8)
        quantize_row(xq(pad_row(p, row)), xe(pad_row(p, row)), nullptr, H);
      else
        copy_row(xe(pad_row(p, row)), nullptr, H);
    });
  for_each_token_slots(p, to_row, [&](int g, int, uint32_t lanes, long pad) {
    const bf16* x = token_row(p, g, &RankBuffers::x);
    if constexpr (kFp8)
      quantize_row_to_rows(x, H, lanes, pad, xq, xe);
    else
      copy_row_to_rows(x, H, lanes, pad, xe);
  });
}

// The forward's pull of this cycle's tile rows; the padding rows once, in the first (xe holds every
// cycle's rows). The fp8 mode's GEMM1 reads xq, and its backward pulls xe for itself (saves_xe), so its
// forward writes no xe.
template <bool kFp8>
__device__ void pull_x(const Params& p, int cycle) {
  pull_x_rows<kFp8>(p, cycle == 0, !kFp8,
                    [&](ExpertTileRow row) { return ring_item(p, cycle, row) >= 0 ? pad_row(p, row) : -1; });
}

// The backward's pull where the saved buffer holds no xe (saves_xe): every tile row of this GPU's
// experts, padding rows included; kFp8 (recompute mode's GEMM1s) quantizes each into xq too.
template <bool kFp8>
__device__ void pull_own_x(const Params& p) {
  pull_x_rows<kFp8>(p, true, true, [&](ExpertTileRow row) { return pad_row(p, row); });
}

// A quad's 16-bit pieces of one row, transposed: each of the quad's threads q holds piece c (columns
// 8 c + 2 q, +1) of c = 0..3, as words c01 (pieces 0, 1) and c23; it gets the four threads' pieces c = q,
// columns 8 q .. 8 q + 7 in order, for one 8-byte store. Two exchanges of one word each: with thread
// q ^ 2 the pieces c of the other half (c & 2 != q & 2), then with q ^ 1 the piece it needs.
__device__ __forceinline__ uint2 quad_transpose(uint32_t c01, uint32_t c23) {
  const unsigned q = threadIdx.x % 4;
  const bool odd = q & 1, upper = q & 2;
  const auto piece = [](uint32_t w, bool high) { return high ? w >> 16 : w & 0xffffu; };
  const uint32_t kept = upper ? c23 : c01;                                           // thread q's pieces q & 2, +1
  const uint32_t across = __shfl_xor_sync(~0u, upper ? c01 : c23, 2);                // thread q ^ 2's same pieces
  const uint32_t given = piece(kept, !odd) | piece(across, !odd) << 16;              // what thread q ^ 1 needs
  const uint32_t got = __shfl_xor_sync(~0u, given, 1);                               // threads q ^ 1's, q ^ 3's piece q
  const uint32_t mine = piece(kept, odd), far = piece(across, odd);                  // threads q's, q ^ 2's piece q
  const uint32_t near_pair = odd ? (got & 0xffffu) | mine << 16 : mine | got << 16;  // threads q & 2, +1
  const uint32_t far_pair = odd ? got >> 16 | far << 16 : far | (got & 0xffff0000u);  // threads q & 2 ^ 2, +1
  return upper ? uint2{far_pair, near_pair} : uint2{near_pair, far_pair};
}

// quad_transpose for 32-bit words: four of a row's bf16 words, w[c] at columns 8 c + 2 q, +1 (of some
// 32-column group) in quad thread q, transposed within the quad: thread q gets columns 8 q .. 8 q + 7, 16 bytes in
// order. Two exchanges of two words: with thread q ^ 2 the words of the other half (c & 2 != q & 2), then with q ^ 1
// the two it needs. Every lane of the warp must take part (the shuffles' full mask).
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

// Group g of this thread's row `half` from the words `w` (its words j with j % 2 == half; word half + 2 k
// at columns 8 k + 2 q, as the accumulators lie), columns 32 g .. 32 g + 31, stored from registers: 16
// bytes a lane at dst + 8 q (dst nullptr: not stored; the shuffles run anyway).
template <int kWords>
__device__ __forceinline__ void store_word_group(const uint32_t (&w)[kWords], int half, int g, bf16* dst) {
  const auto word = [&](int c) { return w[half + 2 * (4 * g + c)]; };
  const uint4 v = quad_transpose_words(word(0), word(1), word(2), word(3));
  if (dst) *reinterpret_cast<uint4*>(dst + 8 * (threadIdx.x % 4)) = v;
}

// One 1 x 128 block of each of a consumer's rows, from a tile epilogue's bf16 words (the core's
// quantize_block): columns n0.. (of `cols`) of rows first + row of q, for rows < valid (past them: a
// zero scale exponent). The words are one 128-column half of the tile's accumulator pairs: a thread
// holds 32 of a row's values (its words j with j % 2 the row's, word half + 2 k at columns 8 k + 2 (t % 4)),
// the quad of threads t % 4 the rest. The codes leave by quad_transpose, 8 bytes a store (16 stores of
// 2 bytes a row before: kimi-k2's fp8 GEMM1 took 2% longer). The fp8 mode's a for GEMM2 (aq) from GEMM1's
// epilogue, and the backward's shared dh.
template <int kWords>
__device__ inline void quantize_block_columns(const uint32_t (&aw)[kWords], Warpgroup consumer, int cols, int n0,
                                              int valid, long first, const Fp8Matrix& q) {
  static_assert(kWords == 32, "16 words of each of the thread's two rows: 4 groups of a quad's 4 x 4 pieces");
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // the thread's two rows: accumulators 2 half, 2 half + 1, ...
    uint32_t amax = 0;
#pragma unroll
    for (int j = half; j < kWords; j += 2) amax = max(amax, magnitude_bits(aw[j]));
    amax = max(amax, __shfl_xor_sync(~0u, amax, 1));
    amax = max(amax, __shfl_xor_sync(~0u, amax, 2));
    const int row = acc_row(consumer, 2 * half);  // the quad's: its shuffles run on every row, valid or not
    const Fp8Matrix dst = q.row(first + row, cols);
    const int e = block_scale_exponent(amax);
#pragma unroll
    for (int m = 0; m < 4; ++m) {  // group m: pieces k = 4 m + c, columns 32 m ..
      const auto code = [&](int c) { return e4m3x2_of(aw[half + 2 * (4 * m + c)], e); };
      const uint2 codes = quad_transpose(code(0) | code(1) << 16, code(2) | code(3) << 16);
      if (row < valid) *reinterpret_cast<uint2*>(dst.values + n0 + 32 * m + 8 * (threadIdx.x % 4)) = codes;
    }
    // A token tile's row past the last token: GEMM2's tile reads its exponent.
    if (threadIdx.x % 4 == 0) dst.block_exp(n0 / kFp8Block) = row < valid ? e : 0;
  }
}

// Where a GEMM1 epilogue writes h, a and, in the fp8 mode, a quantized (aq: GEMM2's operand); h and a
// null: not written. The forward writes what its GEMM2 and the backward read; in recompute mode the
// backward makes h and a again, so the forward writes GEMM2's operand alone (a, or in the fp8 mode aq).
// The routed experts' a is GEMM2's operand alone (expert_up_tiles): the backward makes it from h.
// The shared expert's recompute writes shared_aq too (not read; S rows, not worth an instantiation of its
// own).
struct UpOutputs {
  bf16 *h, *a;
  Fp8Matrix aq;
};
template <bool kFp8>
__device__ __forceinline__ UpOutputs up_outputs(const Params& p, bool forward, bf16* h, bf16* a, const Fp8Matrix& aq) {
  if (!forward || !p.recompute) return {h, a, aq};
  return {nullptr, kFp8 ? nullptr : a, aq};
}

// The GEMM1 epilogue: the tile's columns 0-127 are gate columns n0.., 128-255 the matching up
// columns (those at or past inter - n0 are another matrix's: not written); h = bf16(gate | up) and
// a = bf16(swiglu(h)) for rows < valid, into rows first.. of out's h, a, and in the fp8 mode (aq) a
// quantized for GEMM2. All of a is computed in registers first, its SwiGLUs in batches (swiglu_words), so
// the compiler interleaves them (one by one they were most of this epilogue's time). kWithA false: h
// alone (out.a and out.aq ignored), no SwiGLU: the routed experts' recompute in the backward, whose
// per-row phase makes a from h.
template <bool kFp8 = false, bool kWithA = true>
__device__ inline void swiglu_epilogue(const Params& p, Warpgroup consumer, const float (&acc)[kAccumulators],
                                       int inter, int n0, int valid, long first, const UpOutputs& out) {
  constexpr int kUp = kAccumulators / 2;        // accumulator i's up partner: i + kUp
  constexpr int kGateGroups = kTileN / 2 / 32;  // 32-column groups of gate columns; the up ones follow
  uint32_t hw[kAccumulators / 2], aw[kUp / 2];
#pragma unroll
  for (int i = 0; i < kAccumulators; i += 2) hw[i / 2] = pack_bf16(acc[i], acc[i + 1]);
  if constexpr (kWithA) {
    constexpr int kBatch = 8;  // words of a per batch of sigmoids
    static_assert(kUp / 2 % kBatch == 0, "whole batches of a's words");
#pragma unroll
    for (int j = 0; j < kUp / 2; j += kBatch) swiglu_words<kBatch>(hw + j, hw + kUp / 2 + j, p.c.swiglu_limit, aw + j);
    if constexpr (kFp8) quantize_block_columns(aw, consumer, inter, n0, valid, first, out.aq);
  }
  // h and a leave from registers after a quad transpose, 16 bytes a lane: no staging rows, no barriers
  // (staged, olmoe's fp8 GEMM1 took 5-7% longer; the other bf16 epilogues were slower from registers:
  // docs/results/2026-12-03-h200-h, call 3).
  const auto at = [](bf16* row, long col) { return row ? row + col : nullptr; };
  const int h_rows = out.h ? valid : 0, a_rows = out.a ? valid : 0;  // rows stored
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // the thread's two rows
    const int row = acc_row(consumer, 2 * half);
    bf16* const h_row = row < h_rows ? out.h + (first + row) * 2 * inter + n0 : nullptr;
    bf16* const a_row = row < a_rows ? out.a + (first + row) * inter + n0 : nullptr;
#pragma unroll
    for (int g = 0; g < kGateGroups; ++g) {
      if (n0 + 32 * g >= inter) continue;  // another matrix's columns (the whole warp's)
      store_word_group(hw, half, g, at(h_row, 32 * g));
      store_word_group(hw, half, kGateGroups + g, at(h_row, inter + 32 * g));
      if constexpr (kWithA) store_word_group(aw, half, g, at(a_row, 32 * g));
    }
  }
}

// Gate columns per GEMM1 tile (the up columns fill the tile's other half).
inline constexpr int kGateCols = kTileN / 2;
static_assert(kGateCols == kFp8Block,
              "a GEMM1 tile's a columns are one fp8 block of each row (quantize_block_columns)");

// GEMM1 (+ SwiGLU in the forward, kForward) on the rows of xe (in the fp8 mode, kFp8: of xq) of the expert
// tiles of `tiles` (RingTiles or OwnTiles, 128 columns of I per tile) into p.h, p.a and p.aq, those
// up_outputs names: the forward's; the backward's recompute writes h alone. a only in the bf16 forward.
// Padding rows (zero in xe) are written too: zero h, and in the forward zero a (GEMM2 reads whole tiles).
template <bool kFp8, bool kForward, class Tiles>
__device__ void expert_up_tiles(Pipeline& pipe, const Params& p, const Tiles& tiles) {
  const int I = p.c.intermediate, H = p.c.hidden;
  // The routed a: GEMM2's operand in the bf16 forward alone (no saved buffer holds it: expert_row_grads
  // makes it from h).
  const UpOutputs out = up_outputs<kFp8>(p, kForward, p.h, kForward && !kFp8 ? p.a : nullptr, p.aq);
  expert_gemm<kNT, kFp8>(
      pipe, p, tiles, kExpertUp,
      [&](const RingItem& it) {
        const int w = own_expert(p, it.t.expert) * 2 * I + it.n0;
        if constexpr (kFp8) return k_major(p.maps.xq, p.maps.w1q, it.t.pad_row, w, w + I, H, {p.xq.exps, p.w1_exp});
        return k_major(p.maps.xe, p.maps.w1, it.t.pad_row, w, w + I, H);
      },
      [&](const RingItem& it, Warpgroup consumer, const float(&acc)[kAccumulators]) {
        swiglu_epilogue<kFp8, kForward>(p, consumer, acc, I, it.n0, kTileRows, it.t.pad_row, out);
      });
}

// The forward's GEMM1 + SwiGLU on this cycle's tiles: (rank, ring slot, column tile).
template <bool kFp8>
__device__ inline void expert_up(Pipeline& pipe, const Params& p, int cycle) {
  expert_up_tiles<kFp8, true>(pipe, p, RingTiles{p, cycle, ceil_div(p.c.intermediate, kGateCols), kGateCols});
}

// The backward's recompute (Params::recompute): h of every tile of this GPU's experts in one pass
// (from xe, or in the fp8 mode xq, which pull_own_x fills first); no SwiGLU, no aq.
template <bool kFp8>
__device__ inline void recompute_up(Pipeline& pipe, const Params& p) {
  expert_up_tiles<kFp8, false>(pipe, p, OwnTiles{p, ceil_div(p.c.intermediate, kGateCols), kGateCols});
}

// The shared expert's GEMM1 + SwiGLU over its tokens (Params::shared_tokens; in the fp8 mode, kFp8, on
// x quantized into shared_xq by quantize_shared_rows) into shared_h, shared_a and shared_aq, those
// up_outputs names: tiles of 128 tokens x 128 intermediate columns. The forward's, and in recompute mode
// the backward's (`forward` false; its shared_aq is written too and not read); `phase`: the one it runs in.
template <bool kFp8>
__device__ void shared_up(Pipeline& pipe, const Params& p, int phase, bool forward) {
  const int N = int(p.shared_tokens.rows()), Is = p.c.shared_intermediate, H = p.c.hidden;
  const TokenTiles tiles{N, ceil_div(Is, kGateCols), kGateCols};
  const UpOutputs out = up_outputs<kFp8>(p, forward, p.shared_h, p.shared_a, p.shared_aq);
  gemm_tiles<kNT, kFp8>(
      pipe, tiles.count(), p.barrier, phase,
      [&](long t, TileLoad& l) {
        const int n0 = tiles.n0(t), first = int(tiles.first_token(t));
        if constexpr (kFp8)
          l = k_major(p.maps.shared_xq, p.maps.shared_w1q, first, n0, Is + n0, H, {p.shared_xq.exps, p.shared_w1_exp});
        else
          l = k_major(p.maps.x, p.maps.shared_w1, first, n0, Is + n0, H);
        return true;
      },
      [&](long t, Warpgroup consumer, const float(&acc)[kAccumulators]) {
        const long first = tiles.first_token(t);
        swiglu_epilogue<kFp8>(p, consumer, acc, Is, tiles.n0(t), int(min(long(kTileRows), N - first)), first, out);
      });
}

}  // namespace mok::gpu
