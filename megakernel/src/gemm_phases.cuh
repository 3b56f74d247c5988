// GEMM phases over the schedule's tiles: the ring phases (this cycle's expert tiles) and the token
// phases (the shared expert over its tokens, Params::shared_tokens), with their tile loads.
#pragma once

#include "epilogue_store.cuh"
#include "schedule.cuh"
#include "tile_gemm.cuh"
#include "tile_schedules.cuh"

namespace mok::gpu {

// A GEMM phase over the expert tiles of `tiles` (RingTiles, OwnTiles): load(it) gives a tile's
// operands (majorness kM; kFp8: E4M3), epilogue(it, consumer, acc) consumes a consumer's finished half
// tile.
template <Majors kM = kNT, bool kFp8 = false, class Tiles, class Load, class Epilogue>
__device__ void expert_gemm(Pipeline& pipe, const Params& p, const Tiles& tiles, int phase, Load load,
                            Epilogue epilogue) {
  RingItem it;
  gemm_tiles<kM, kFp8, false, true>(
      pipe, tiles.count(), p.barrier, phase,
      [&](long t, TileLoad& l) {
        if (!tiles.lookup(t, it)) return false;
        l = load(it);
        return true;
      },
      [&](long, Warpgroup consumer, const float(&acc)[kAccumulators]) { epilogue(it, consumer, acc); });
}

// A GEMM phase over this cycle's ring slots: tiles (rank, ring slot, kTileN of `columns` output
// columns).
template <Majors kM = kNT, bool kFp8 = false, class Load, class Epilogue>
__device__ void ring_gemm(Pipeline& pipe, const Params& p, int cycle, int phase, int columns, Load load,
                          Epilogue epilogue) {
  expert_gemm<kM, kFp8>(pipe, p, RingTiles{p, cycle, ceil_div(columns, kTileN), kTileN}, phase, load, epilogue);
}

// The scale exponents of a GEMM's E4M3 operands (TileLoad::a_exp, b_exp).
struct OperandScales {
  const int32_t* a = nullptr;
  const int32_t* b = nullptr;
};

// A K-major tile load: A rows a_row.. (128), B rows b0.. and b1.. (128 each),
// K = k columns; E4M3 operands with `scales`, bf16 without. An E4M3 A tile starts at a multiple of 128
// rows (every caller's: padded expert rows, ring rows, token tiles), where its exponents' tile starts
// (Fp8Matrix): the producer copies that tile's 128 exponents of each K-block whole.
__device__ __forceinline__ TileLoad k_major(const CUtensorMap& ma, const CUtensorMap& mb, int a_row, int b0, int b1,
                                            int k, OperandScales scales = {}) {
  return TileLoad{&ma, &mb, a_row, {b0, b1}, 0, 0, k / (scales.a ? kFp8Block : kBox), scales.a, scales.b};
}
// ... with B's 256 rows contiguous from b_row.
__device__ __forceinline__ TileLoad k_major(const CUtensorMap& ma, const CUtensorMap& mb, int a_row, int b_row, int k,
                                            OperandScales scales = {}) {
  return k_major(ma, mb, a_row, b_row, b_row + kTileN / 2, k, scales);
}

// A tile load with B as stored, rows along K (C = A B: the input gradients' weights, no transposed
// copy): A rows a_row.. (128, K-major from column 0), B columns b_col.. (256) of rows b_k.., K = k.
__device__ __forceinline__ TileLoad b_as_stored(const CUtensorMap& ma, const CUtensorMap& mb, int a_row, int b_col,
                                                int b_k, int k) {
  return TileLoad{&ma, &mb, a_row, {b_col, b_col + kTileN / 2}, 0, b_k, k / kBox};
}

// A GEMM phase over the shared expert's token rows (Params::shared_tokens, from its first: row r is its
// token begin + r): C = a b^T (kM = kNT: B map [n, k]; in fp8, E4M3 operands with `scales`) or C = a b
// (kM = kNN: B map [k, n]), A map [rows, k], n columns; epilogue(first, n0, consumer, acc) consumes a
// consumer's finished half tile of rows first.., columns n0.. .
template <Majors kM, bool kFp8 = false, class Epilogue>
__device__ void token_tiles_gemm(Pipeline& pipe, const Params& p, const CUtensorMap& a, const CUtensorMap& b, int k,
                                 int n, int phase, Epilogue epilogue, OperandScales scales = {}) {
  const TokenTiles tiles{int(p.shared_tokens.rows()), ceil_div(n, kTileN), kTileN};
  gemm_tiles<kM, kFp8>(
      pipe, tiles.count(), p.barrier, phase,
      [&](long t, TileLoad& l) {
        const int n0 = tiles.n0(t), a_row = int(tiles.first_token(t));
        l = kM.b_mn ? b_as_stored(a, b, a_row, n0, 0, k) : k_major(a, b, a_row, n0, k, scales);
        return true;
      },
      [&](long t, Warpgroup consumer, const float(&acc)[kAccumulators]) {
        epilogue(tiles.first_token(t), tiles.n0(t), consumer, acc);
      });
}

// token_tiles_gemm with the accumulators of row r, columns col and col + 1 (< n), going to
// store(r, col, c0, c1).
template <Majors kM, class Store>
__device__ void token_gemm(Pipeline& pipe, const Params& p, const CUtensorMap& a, const CUtensorMap& b, int k, int n,
                           int phase, Store store) {
  const long N = p.shared_tokens.rows();
  token_tiles_gemm<kM>(pipe, p, a, b, k, n, phase,
                       [&](long first, int n0, Warpgroup consumer, const float(&acc)[kAccumulators]) {
                         for_each_pair(
                             consumer, acc,
                             [&](int row, int col, float v0, float v1) {
                               if (first + row < N) store(first + row, n0 + col, v0, v1);
                             },
                             min(kTileN, n - n0));
                       });
}

// out[r, :] = bf16(a[r, :] b^T) (or b, kNN) for every row r: out [rows, n], through the staging rows
// (store_rows_bf16; n is H here, a multiple of 64).
template <Majors kM, bool kFp8 = false>
__device__ inline void token_gemm_bf16(Pipeline& pipe, const Params& p, const CUtensorMap& a, const CUtensorMap& b,
                                       int k, int n, bf16* out, int phase, OperandScales scales = {}) {
  const long N = p.shared_tokens.rows();
  token_tiles_gemm<kM, kFp8>(
      pipe, p, a, b, k, n, phase,
      [&](long first, int n0, Warpgroup consumer, const float(&acc)[kAccumulators]) {
        store_rows_bf16(pipe, consumer, acc, min(kTileN, n - n0),
                        [&](int r) { return first + r < N ? out + (first + r) * n + n0 : nullptr; });
      },
      scales);
}

}  // namespace mok::gpu
