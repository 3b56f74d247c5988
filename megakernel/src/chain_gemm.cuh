// Products of which every output is one fma chain (core/fma_chain.h: an fp32 fma per term, in index order
// from +0): the router's logits, its weight gradient and its share of dx. Each output's chain still runs
// in one thread, term after term, so its bits are fma_chain's; the tiling changes only where the terms
// come from. A block stages K-chunks of a 96 x 64 output tile's A and B in the GEMM stages (idle in the
// router phases), each value loaded once feeding 4 fmas of a thread and 16 to 24 threads, where a thread
// per output loaded both terms of every fma (a GEMM's fmas at a load's rate: 8.8 ms for kimi-k2's logits).
#pragma once

#include <type_traits>

#include "chain_tiles.cuh"
#include "mok/core/bf16.h"
#include "mok/core/host_device.h"
#include "mok/megakernel/ptx/prefetch.cuh"
#include "tile_gemm.cuh"

namespace mok::gpu {

inline constexpr int kChainK = 32;     // the K-chunk staged
inline constexpr int kChainMicro = 4;  // a thread's outputs: 4 x 4
// Floats after each staged row: a warp staging along k writes one float to each of 32 rows, 4-way bank
// conflicts with the pad (32-way without it), and rows stay whole float4s.
inline constexpr int kChainPad = 4;
static_assert((kChainM / kChainMicro) * (kChainN / kChainMicro) == kThreads, "a thread per 4 x 4 outputs");
inline constexpr int kChainRowA = kChainM + kChainPad, kChainRowB = kChainN + kChainPad;  // staged rows' floats
static_assert(4 * (kChainK * (kChainRowA + kChainRowB) + kChainM * kChainRowB) <= sizeof(GemmSmem::stage),
              "the stages hold a chunk and a tile");
using ChainAcc = float[kChainMicro][kChainMicro];  // a thread's outputs of a tile

// This thread's first output row and column within a tile.
__device__ __forceinline__ int chain_m() { return threadIdx.x / (kChainN / kChainMicro) * kChainMicro; }
__device__ __forceinline__ int chain_n() { return threadIdx.x % (kChainN / kChainMicro) * kChainMicro; }

// The GEMM stages' floats in a chain phase: a chunk's A rows ([kChainK] of kChainRowA), its B rows
// ([kChainK] of kChainRowB), then a stashed tile's rows ([kChainM] of kChainRowB).
struct ChainStages {
  float *a, *b, *tile;
};
__device__ __forceinline__ ChainStages chain_stages(Pipeline& pipe) {
  float* const a = reinterpret_cast<float*>(&pipe.smem->stage[0][0]);
  float* const b = a + kChainK * kChainRowA;
  return {a, b, b + kChainK * kChainRowB};
}

// A finish's first step where the block reads the tile's outputs: each thread's put in the tile's rows
// (the output at m0 + r, n0 + c at r * kChainRowB + c), then the block meets. It must meet again before
// the next tile's (its reads done).
__device__ __forceinline__ const float* stash_chain_tile(Pipeline& pipe, const ChainAcc& acc) {
  float* const rows = chain_stages(pipe).tile;
#pragma unroll
  for (int i = 0; i < kChainMicro; ++i)
    *reinterpret_cast<float4*>(rows + (chain_m() + i) * kChainRowB + chain_n()) =
        float4{acc[i][0], acc[i][1], acc[i][2], acc[i][3]};
  __syncthreads();
  return rows;
}

// Which index an operand's consecutive elements follow in memory, so that a warp's loads are whole lines.
enum class Contiguous { along_k, along_mn };

// A term's bits as loaded (a bf16's in the low half) and the term from them. A chunk's loads keep their
// bits until the chunk is staged: converted beside its load, a bf16 term made the thread wait for the
// load there (ptxas put each shift right after its load: a chunk's loads ran as three round trips, and
// the fmas after them).
__device__ __forceinline__ uint32_t term_bits(const float* p) { return bits_of(*p); }
__device__ __forceinline__ uint32_t term_bits(const bf16* p) { return p->bits; }
template <class Element>
__device__ __forceinline__ float chain_term(uint32_t bits) {
  if constexpr (std::is_same_v<Element, bf16>)
    return to_float(bf16{uint16_t(bits)});
  else
    return float_of(bits);
}

// Which operand is streamed from memory, each of its elements read once by each tile across it (the
// logits' x: by one block where E <= kChainM): a thread asks L2 for its elements of the chunk
// kChainPrefetchAhead beyond the one it loads, so that the load waits for L2, not memory (with a chunk's
// fmas between them, the block waited for memory). On the other operands, and on the backward's x, it
// cost time (results/2026-12-04-h200-b, and -d with the loads kept as bits).
enum class Streamed { none, a, b };
inline constexpr int kChainPrefetchAhead = 2 * kChainK;

// One staged operand of Element (float or bf16): rows [kChainK] of kWidth values (+ kChainPad), and the
// chunk a thread brings next, as bits. A thread's elements lie kThreads apart in the chunk's memory
// order: along that order's inner index its place stays, along the outer it steps by kStep.
template <class Element, int kWidth, Contiguous kOrder, bool kStreamed>
struct ChainOperand {
  static constexpr int kInner = kOrder == Contiguous::along_k ? kChainK : kWidth;
  static constexpr int kOuter = kOrder == Contiguous::along_k ? kWidth : kChainK;
  static constexpr int kStep = kThreads / kInner, kCount = (kOuter + kStep - 1) / kStep;
  static_assert(kThreads % kInner == 0, "a thread's inner index is the same for each of its elements");
  uint32_t next[kCount];

  // The k and the index along M (or N) of this thread's element j.
  static __device__ __forceinline__ int2 element(int j) {
    const int inner = threadIdx.x % kInner, outer = threadIdx.x / kInner + j * kStep;
    return kOrder == Contiguous::along_k ? int2{inner, outer} : int2{outer, inner};
  }
  static __device__ __forceinline__ bool inside(int j) { return threadIdx.x / kInner + j * kStep < kOuter; }
  // The chunk from k0 (*at(mn, k), +0 outside [0, mn_end) x [0, k_end)); streamed, L2 asked for the
  // one kChainPrefetchAhead further.
  template <class At>
  __device__ __forceinline__ void load(At at, long mn0, long mn_end, long k0, long k_end) {
#pragma unroll
    for (int j = 0; j < kCount; ++j) {
      const long k = k0 + element(j).x, mn = mn0 + element(j).y;
      const bool row = inside(j) && mn < mn_end;
      next[j] = row && k < k_end ? term_bits(at(mn, k)) : 0u;  // +0 outside
      if constexpr (kStreamed)
        if (row && k + kChainPrefetchAhead < k_end) ptx::prefetch_l2(at(mn, k + kChainPrefetchAhead));
    }
  }
  __device__ __forceinline__ void stage(float* rows) const {
#pragma unroll
    for (int j = 0; j < kCount; ++j)
      if (inside(j)) rows[element(j).x * (kWidth + kChainPad) + element(j).y] = chain_term<Element>(next[j]);
  }
};

// f(m, n, i, j) for each of this thread's outputs of `tile` inside [0, M) x [0, N) (acc[i][j]'s).
template <class F>
__device__ __forceinline__ void for_each_chain_output(long M, long N, const ChainTile& tile, F f) {
#pragma unroll
  for (int i = 0; i < kChainMicro; ++i)
#pragma unroll
    for (int j = 0; j < kChainMicro; ++j) {
      const long m = tile.m0 + chain_m() + i, n = tile.n0 + chain_n() + j;
      if (m < M && n < N) f(m, n, i, j);
    }
}

// Which tiles of a product a block takes. StaticTiles: every gridDim.x-th from its own. ClaimedTiles: the
// next that no block has taken, from a counter zeroed before the launch, so that blocks busy elsewhere
// first (combine_dx's, after the router-weight gradient's tiles) take fewer. Either way each tile is one
// block's, and its outputs do not depend on which. A counter serves one product a launch, whose start
// never stops a block (a stopped block would drop the tile it claimed).
struct StaticTiles {
  __device__ long first() const { return blockIdx.x; }
  __device__ long next(long index) const { return index + gridDim.x; }
};
struct ClaimedTiles {
  unsigned int* counter;
  __device__ long first() const { return claim(); }
  __device__ long next(long) const { return claim(); }
  __device__ long claim() const {
    __shared__ unsigned int claimed;
    __syncthreads();  // every thread has read the last claim
    if (threadIdx.x == 0) claimed = atomicAdd(counter, 1u);
    __syncthreads();
    return claimed;
  }
};

// For every tile of [0, M) x [0, N), over the grid's blocks (as `tiles` hands them out): each thread's
// outputs there, the chain over k in [0, K) of *a(m, k) times *b(k, n) (a and b give the terms'
// addresses; float or bf16) from the value start(tile, acc) puts in acc[i][j] (the output at tile.m0 +
// chain_m() + i, tile.n0 + chain_n() + j), handed to finish(tile, acc). A start returns whether the
// block goes on, the same for every thread (false: the block takes no more tiles). Every thread of the
// block calls it and each hook (they may meet the block); the stages must be free (no GEMM's TMA in
// flight), and are again on return.
template <Contiguous kAOrder, Contiguous kBOrder, Streamed kStreamed, class A, class B, class Start, class Finish,
          class Tiles = StaticTiles>
__device__ void chain_gemm(Pipeline& pipe, long M, long N, long K, A a, B b, Start start, Finish finish,
                           Tiles tiles = {}) {
  const ChainStages stages = chain_stages(pipe);
  const int tm = chain_m(), tn = chain_n();
  const auto b_by_n = [&](long n, long k) { return b(k, n); };
  ChainOperand<std::remove_cvref_t<decltype(*a(0L, 0L))>, kChainM, kAOrder, kStreamed == Streamed::a> as;
  ChainOperand<std::remove_cvref_t<decltype(*b(0L, 0L))>, kChainN, kBOrder, kStreamed == Streamed::b> bs;
  for (long index = tiles.first(); index < chain_tile_count(M, N); index = tiles.next(index)) {
    const ChainTile tile = chain_tile(index, N);
    as.load(a, tile.m0, M, 0, K);  // in flight during the start
    bs.load(b_by_n, tile.n0, N, 0, K);
    ChainAcc acc = {};
    if (!start(tile, acc)) break;
    // A thread whose outputs all lie outside skips the fmas: whole warps do where M < kChainM (rows run
    // along the warps; columns along the lanes, where idle lanes would save nothing).
    const bool live = tile.m0 + tm < M && tile.n0 + tn < N;
    for (long k0 = 0; k0 < K; k0 += kChainK) {
      __syncthreads();  // the last chunk's reads are done
      as.stage(stages.a);
      bs.stage(stages.b);
      __syncthreads();
      if (k0 + kChainK < K) {  // the next chunk's loads in flight during this one's fmas
        as.load(a, tile.m0, M, k0 + kChainK, K);
        bs.load(b_by_n, tile.n0, N, k0 + kChainK, K);
      }
      // No fma(0, 0, acc) past K: it would turn -0 to +0.
      const int terms = !live ? 0 : int(K - k0 < kChainK ? K - k0 : kChainK);
#pragma unroll 8
      for (int k = 0; k < terms; ++k) {
        const float4 av = *reinterpret_cast<const float4*>(stages.a + k * kChainRowA + tm);
        const float4 bv = *reinterpret_cast<const float4*>(stages.b + k * kChainRowB + tn);
        const float ar[kChainMicro] = {av.x, av.y, av.z, av.w}, br[kChainMicro] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
        for (int i = 0; i < kChainMicro; ++i)
#pragma unroll
          for (int j = 0; j < kChainMicro; ++j) acc[i][j] = fma32(ar[i], br[j], acc[i][j]);
      }
    }
    // Each chain ends as fma_chain's does: a NaN is the canonical one.
#pragma unroll
    for (int i = 0; i < kChainMicro; ++i)
#pragma unroll
      for (int j = 0; j < kChainMicro; ++j) acc[i][j] = canonical_nan(acc[i][j]);
    finish(tile, acc);
  }
  ptx::fence_async_shared();  // these generic writes come before the next GEMM's TMA writes to the stages
  __syncthreads();            // and every thread's reads of them are done
}

// A start for chain_gemm: every chain from +0.
struct FromZero {
  __device__ bool operator()(const ChainTile&, ChainAcc&) const { return true; }
};

// A finish for chain_gemm that hands each output inside [0, M) x [0, N) to store(m, n, value).
template <class Store>
__device__ __forceinline__ auto store_each_output(long M, long N, Store store) {
  return [=](const ChainTile& tile, const ChainAcc& acc) {
    for_each_chain_output(M, N, tile, [&](long m, long n, int i, int j) { store(m, n, acc[i][j]); });
  };
}

}  // namespace mok::gpu
