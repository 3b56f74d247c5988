// The megakernel's matrix engine: 128 x 256 output tiles on wgmma, fed by the TMA through a
// multi-stage mbarrier pipeline, with a producer warpgroup and two consumer warpgroups per block.
//   warpgroup 0, thread 0: for each K-block (64 of K), waits for a free stage, then copies six
//     64 x 64 bf16 boxes (A rows 0-127, B columns 0-255) into it;
//   warpgroups 1 and 2: wait for the stage, run the K-steps of 16 in order on their 64 rows
//     (wgmma m64n256k16, one accumulator chain per element: the K-step order of mok/core/kstep.h),
//     release the stage, and at the tile's end hand the accumulators to the phase's epilogue.
// A tile of 256 columns needs a quarter fewer operand bytes per product than 128 x 128 tiles (which
// ran at 51-71% of peak) and half the wgmma instructions; its 128 accumulators per consumer thread
// come from the producer warpgroup's registers (setmaxnreg) for the length of a GEMM phase.
// Tiles are handed out round-robin over the persistent blocks (the tile scheduler); every role walks
// the same sequence, so the pipeline's counters agree without talking. The weight gradients' blocks
// claim their tiles at run time instead (ClaimedWalk), the producer handing them to the consumers. The
// producer runs ahead into the next tile while the consumers finish their epilogue.
// The fp8 mode's tiles (kFp8: E4M3 operands, both K-major) use the same stages and boxes with K-blocks
// of 128 (a box row is 128 bytes either way); their consumers run the FP8 chain (consume_fp8).
// Paired blocks (LaunchConfig::paired_blocks: a launch in clusters of two): in the expert GEMM phases the
// two blocks of a cluster run tiles t and t ^ 1 (consecutive tiles of the banded order: the same B where
// they are an expert's consecutive row tiles) in step, and where their B is the same each block's
// producer loads one half of it into both blocks' stages (the TMA's multicast), so B leaves L2 once for
// two tiles. Where one of the two has no tile it runs a stand-in (its peer's operands, no epilogue), so
// that the two pipelines stay in step. Every other phase runs its blocks unpaired.
#pragma once

#include <cuda.h>

#include <type_traits>

#include "gemm_geometry.cuh"
#include "grid_sync.cuh"
#include "mok/core/fp8_gemm.h"
#include "mok/megakernel/ptx/cluster.cuh"
#include "mok/megakernel/ptx/named_barrier.cuh"
#include "mok/megakernel/ptx/setmaxnreg.cuh"
#include "mok/megakernel/ptx/timer.cuh"
#include "mok/megakernel/ptx/tma.cuh"
#include "mok/megakernel/ptx/wgmma.cuh"

namespace mok::gpu {

// Where one output tile's operands start: A's 128 rows from a, B's 256 in two halves of 128 from b[0]
// and b[1] (GEMM1 puts its gate and up columns side by side). A K-major operand (its rows along M or
// N, K along the row: the forward's operands, the input gradients' A) covers rows a .. (or b ..), and
// K-block kb is columns a_k + 64 kb ..; an MN-major operand (its rows along K: the weight gradients'
// A^T B, and the input gradients' weights read as stored) covers columns a .. (b ..), and K-block kb
// is rows a_k + 64 kb .. (b_k ..).
// A chain of K-steps over zero rows leaves every accumulator unchanged (a zero-product step returns
// C exactly, and C is never -0: docs/numerics.md), so chains are whole K-blocks of 4 K-steps.
// E4M3 operands (the fp8 mode's tiles) are K-major; their K-blocks are kFp8Block wide, and a_exp /
// b_exp are the scale exponents of A's rows ([rows / 128, k_blocks, 128] from the map's row 0: Fp8Matrix)
// and of B's 128-row blocks ([rows / 128, k_blocks]). The fp8 weight gradients' operands (Fp8Columns,
// consume_fp8<true>) have a scale per row of A and per row of B (a column of the product) and K-block instead
// (ColumnScaleSource); their B halves are adjacent (b[1] = b[0] + 128).
// Where the producer copies each K-block's ColumnScales from: A's exponents a_exps and B's scales
// b_scales ([K / 128, a_stride or b_stride]), and b_range, the smallest and largest e of each of B's
// K-blocks ([K / 128]).
struct ColumnScaleSource {
  const int8_t* a_exps = nullptr;
  const float* b_scales = nullptr;
  const int4* b_range = nullptr;
  int a_stride = 0, b_stride = 0;
};
struct TileLoad {
  const CUtensorMap *ma, *mb;
  int a, b[2];
  int a_k, b_k;  // the first K index of each operand
  int k_blocks;  // the chain length in K-blocks of 64 (bf16) or kFp8Block (E4M3)
  const int32_t* a_exp = nullptr;
  const int32_t* b_exp = nullptr;
  ColumnScaleSource columns = {};
};
static_assert(kFp8Block * sizeof(fp8_e4m3) == kBox * sizeof(bf16), "an E4M3 K-block fills a box row as a bf16 one");

// The operands' majorness of one GEMM phase: both K-major (C = A B^T on row-major matrices), B
// MN-major (C = A B), or both MN-major (C = A^T B).
struct Majors {
  bool a_mn, b_mn;
};
inline constexpr Majors kNT{false, false}, kNN{false, true}, kTN{true, true};

struct Pipeline {
  GemmSmem* smem;
  // K-blocks through the pipeline so far, counted alike by every role (in a claimed phase the producer
  // warpgroup's other threads take the producer thread's count at its end: ClaimedWalk).
  uint32_t blocks = 0;
  // Numbers through the block's TileQueue so far (its slots' phases), counted alike by the producer
  // thread and the consumers, the only roles that use the queue (ClaimedWalk).
  uint32_t queued = 0;
  // Paired blocks (launch_pipeline<true>: the paired kernels'; a constant once inlined, so the other kernels
  // hold no trace of the paired path).
  bool paired = false;
  // The stage and its phase parity of the K-block `ahead` blocks on.
  __device__ uint32_t stage(uint32_t ahead = 0) const { return (blocks + ahead) % kStages; }
  __device__ uint32_t parity(uint32_t ahead = 0) const { return (blocks + ahead) / kStages & 1u; }
};

// The block's dynamic shared memory from its first kSwizzleAlign boundary: an offset into the shared
// array, not an integer round trip, so the compiler keeps its address space (LDS / STS; through a
// pointer cast back from an integer its ordinary loads and stores are generic).
__device__ __forceinline__ uint8_t* aligned_dynamic_smem() {
  extern __shared__ uint8_t dynamic_smem[];
  const uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(dynamic_smem));
  return dynamic_smem + (kSwizzleAlign - at % kSwizzleAlign) % kSwizzleAlign;
}

// full_arrivals: the arrivals that complete a stage beside its TMA bytes (the producer thread's; more
// where other threads fill part of it, as mok-gather-probe's cp.async rows do).
__device__ inline Pipeline pipeline_init(uint32_t full_arrivals = 1) {
  Pipeline pipe{reinterpret_cast<GemmSmem*>(aligned_dynamic_smem())};
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(&pipe.smem->full[s], full_arrivals);
      ptx::mbarrier_init(&pipe.smem->empty[s], kConsumerThreads);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();
  return pipe;
}

// A bounded wait: false once the watchdog stops it (checked every 256 tries: each try is a bounded
// hardware wait already). kCluster: acquire at cluster scope (arrivals of the peer block).
template <bool kCluster = false>
__device__ inline bool pipeline_wait(uint64_t* bar, uint32_t parity, const GridBarrier& b, int phase) {
  const long long start = ptx::global_timer_ns();
  const auto done = [&] {
    return kCluster ? ptx::mbarrier_try_wait_cluster(bar, parity) : ptx::mbarrier_try_wait(bar, parity);
  };
  for (uint32_t spin = 1; !done(); ++spin)
    if (spin % 256 == 0 && watchdog_stop(b, start, kPipelineTimeout, phase, 0, int(blockIdx.x))) return false;
  return true;
}

// The launch's pipeline. kPaired (the paired kernels', launched in clusters of two blocks,
// LaunchConfig::paired_blocks): the blocks of a cluster meet once its barriers are set (at the cluster's
// barrier, where no block can have left yet).
template <bool kPaired>
__device__ inline Pipeline launch_pipeline() {
  Pipeline pipe = pipeline_init();
  if constexpr (!kPaired) return pipe;
  pipe.paired = true;
  if (threadIdx.x == 0) {
    pipe.smem->pairing.meetings = 0;
    ptx::mbarrier_init(&pipe.smem->pairing.met, 2);
    ptx::fence_barrier_init();
  }
  ptx::cluster_sync();  // (a cluster barrier is a block barrier too)
  return pipe;
}

// The other block of this block's cluster (paired blocks).
__device__ __forceinline__ uint32_t peer_block() { return ptx::cluster_rank() ^ 1u; }

// The pair meets (every thread of both blocks; a wait with the watchdog, as a peer may have left on an
// error): what each block did before is done for the other after. False (in every thread of the block)
// once the watchdog stops it.
__device__ inline bool meet_peer(const Pipeline& pipe, const GridBarrier& b, int phase) {
  Pairing& pairing = pipe.smem->pairing;
  __syncthreads();
  const uint32_t parity = pairing.meetings & 1u;
  if (threadIdx.x == 0) {
    ptx::mbarrier_arrive_remote_release(&pairing.met, ptx::cluster_rank());
    ptx::mbarrier_arrive_remote_release(&pairing.met, peer_block());
  }
  const bool met = __syncthreads_and(pipeline_wait<true>(&pairing.met, parity, b, phase));
  if (threadIdx.x == 0) ++pairing.meetings;  // read again after the next meeting's __syncthreads
  return met;
}

// A GEMM phase's start in a paired launch: the stages' barriers set for this phase's arrivals (sharing:
// the peer's consumer warps release this block's stages too) and the pipeline's count from zero, in both
// blocks, then the pair meets, so no arrival of the peer reaches a barrier before it is set. (The last
// phase's end was a meeting, so none of its arrivals is still to come.)
__device__ inline bool begin_paired_phase(Pipeline& pipe, bool sharing, const GridBarrier& b, int phase) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(&pipe.smem->full[s], 1);
      ptx::mbarrier_init(&pipe.smem->empty[s], kConsumerThreads + (sharing ? kConsumerWarps : 0));
    }
    ptx::fence_barrier_init();
  }
  pipe.blocks = 0;
  return meet_peer(pipe, b, phase);
}

// A consumer thread's release of `stage` (arrive: it read the stage and is healthy), predicated in the
// instructions as mbarrier_arrive_if; kSharing (the pair shares B), also one arrival per warp at the
// peer's stage, whose B half this block's producer wrote (the warp's lanes converged).
template <bool kSharing>
__device__ __forceinline__ void release_stage(const Pipeline& pipe, uint32_t stage, bool arrive) {
  ptx::mbarrier_arrive_if(&pipe.smem->empty[stage], arrive);
  if constexpr (kSharing) {
    const bool warp_arrives = __all_sync(~0u, arrive);
    ptx::mbarrier_arrive_remote_if(&pipe.smem->empty[stage], peer_block(), warp_arrives && threadIdx.x % 32 == 0);
  }
}

// Before a producer gives up: lets the copies of its last stages land (bounded by 1 ms), so no block
// leaves with bulk copies into its shared memory in flight.
__device__ inline void drain_copies(const Pipeline& pipe) {
  const long long deadline = ptx::global_timer_ns() + 1000000;
  const uint32_t first = pipe.blocks > uint32_t(kStages) ? pipe.blocks - kStages : 0;
  for (uint32_t j = first; j < pipe.blocks; ++j)
    while (!ptx::mbarrier_try_wait(&pipe.smem->full[j % kStages], (j / kStages) & 1u) &&
           ptx::global_timer_ns() < deadline) {
    }
}

// Barrier of one consumer warpgroup alone (its named barrier: the ids are immediates).
__device__ __forceinline__ void warpgroup_sync(Warpgroup consumer) {
  if (consumer == Warpgroup::consumer0)
    ptx::bar_sync<int(NamedBarrier::consumer0), kWarpgroupThreads>();
  else
    ptx::bar_sync<int(NamedBarrier::consumer1), kWarpgroupThreads>();
}

// True when `v` holds in every thread of the consumer warpgroup (the same named barriers), so the
// warpgroup leaves a phase together.
__device__ __forceinline__ bool warpgroup_all(Warpgroup consumer, bool v) {
  return consumer == Warpgroup::consumer0 ? ptx::bar_red_and<int(NamedBarrier::consumer0), kWarpgroupThreads>(v)
                                          : ptx::bar_red_and<int(NamedBarrier::consumer1), kWarpgroupThreads>(v);
}

// The fp8 chain's turns, on a tile of at least kTurnsMinBlocks K-blocks: the consumers issue their
// wgmma groups (a half tile's K-block each) in alternation, consumer 0 first, so that the tensor core
// runs one consumer's group while the other drains and promotes its last one. Consumer 1 waits until
// consumer 0 issued (consumer0_issued), consumer 0 until consumer 1 issued its previous group
// (consumer1_issued); consumer 1's opening pass grants consumer 0 the tile's first turn and consumer
// 0's closing wait takes back consumer 1's last pass, so every arrival is waited for within the tile.
// Both consumers run the same tile (a failed wait skips waits, not groups) and its verdict is both
// consumers', so they leave the tile loop together. The weight gradients' chains (kColumnScales),
// whose K varies from tile to tile, take no turns: every other phase's tiles take turns all or none.
// On short chains the barriers cost more than the turns gain (docs/results/2026-12-05-h100-d call 2,
// 2026-12-05-h100-f).
inline constexpr int kTurnsMinBlocks = 48;
__device__ __forceinline__ void wait_turn(Warpgroup consumer) {
  if (consumer == Warpgroup::consumer0)
    ptx::bar_sync<int(NamedBarrier::consumer1_issued), kConsumerThreads>();
  else
    ptx::bar_sync<int(NamedBarrier::consumer0_issued), kConsumerThreads>();
}
__device__ __forceinline__ void pass_turn(Warpgroup consumer) {
  if (consumer == Warpgroup::consumer0)
    ptx::bar_arrive<int(NamedBarrier::consumer0_issued), kConsumerThreads>();
  else
    ptx::bar_arrive<int(NamedBarrier::consumer1_issued), kConsumerThreads>();
}

// True when `v` holds in every thread of both consumer warpgroups.
__device__ __forceinline__ bool consumers_all(bool v) {
  return ptx::bar_red_and<int(NamedBarrier::consumers), kConsumerThreads>(v);
}

// kColumnScales: each stage also gets the K-block's ColumnScales (TileLoad::columns); else in the fp8
// mode the scale exponents of A's 128 rows (StageScales::a_exps, a bulk copy) and of B's two halves
// (GemmSmem::b_exps, stored before the stage's arrival, whose release the consumers' wait acquires),
// the latter loaded a K-block ahead.
// kSharing (paired blocks sharing B) with b_half >= 0: this block loads B's half b_half into both blocks'
// stages, and its peer the other half. kBHalves 1 (narrow tiles: consume_fp8_narrow's):
// B's half 0 alone (the stage's second half unwritten; its exponent half 0's, unread).
template <Majors kM, bool kFp8, bool kColumnScales, bool kSharing = false, int kBHalves = 2>
__device__ inline bool produce(Pipeline& pipe, const TileLoad& l, const GridBarrier& b, int phase, int b_half = -1) {
  static_assert(kBHalves == 2 || (kBHalves == 1 && kFp8 && !kColumnScales && !kSharing),
                "B's two halves, or half 0 alone for consume_fp8_narrow (unshared, exponents per block)");
  constexpr bool kBExps = kFp8 && !kColumnScales;
  const int32_t* eb0 = kBExps ? l.b_exp + long(l.b[0] / kFp8Block) * l.k_blocks : nullptr;
  const int32_t* eb1 = kBExps && kBHalves == 2 ? l.b_exp + long(l.b[1] / kFp8Block) * l.k_blocks : eb0;
  int2 next = kBExps && l.k_blocks > 0 ? int2{eb0[0], eb1[0]} : int2{};
  for (int kb = 0; kb < l.k_blocks; ++kb, ++pipe.blocks) {
    const int2 exps = next;
    if (kBExps && kb + 1 < l.k_blocks) next = int2{eb0[kb + 1], eb1[kb + 1]};
    if (!pipeline_wait(&pipe.smem->empty[pipe.stage()], pipe.parity() ^ 1u, b, phase)) {
      drain_copies(pipe);
      return false;
    }
    if constexpr (kBExps) pipe.smem->b_exps[pipe.stage()] = exps;
    uint64_t* full = &pipe.smem->full[pipe.stage()];
    uint8_t* st = pipe.smem->stage[pipe.stage()];
    constexpr int kUnloaded = (2 - kBHalves) * 2 * kBoxBytes;  // B's second half's two boxes, if unloaded
    ptx::mbarrier_arrive_expect_tx(full, kStageBytes - kUnloaded +
                                             (kColumnScales ? sizeof(ColumnScales)
                                              : kBExps      ? sizeof(StageScales::a_exps)
                                                            : 0));
    // A box at (column, row) of its map: K runs along the rows of an MN-major operand.
    const auto load = [&](int box, const CUtensorMap* map, bool mn, int at, int k) {
      ptx::tma_load_2d(st + box * kBoxBytes, map, mn ? at : k, mn ? k : at, full);
    };
    const int k = (kFp8 ? kFp8Block : kBox) * kb;
    // Both blocks' stages at once: the same offset in each, each copy completing on its block's barrier.
    const auto load_both = [&](int box, int at) {
      ptx::tma_load_2d_multicast(st + box * kBoxBytes, l.mb, kM.b_mn ? at : l.b_k + k, kM.b_mn ? l.b_k + k : at, full,
                                 0b11);
    };
    for (int h = 0; h < 2; ++h) {  // A's box h, B's half h (two boxes)
      load(h, l.ma, kM.a_mn, l.a + kBox * h, l.a_k + k);
      if (h >= kBHalves) continue;
      if (!kSharing || b_half < 0) {
        load(kABoxes + 2 * h, l.mb, kM.b_mn, l.b[h], l.b_k + k);
        load(kABoxes + 2 * h + 1, l.mb, kM.b_mn, l.b[h] + kBox, l.b_k + k);
      } else if (h == b_half) {
        load_both(kABoxes + 2 * h, l.b[h]);
        load_both(kABoxes + 2 * h + 1, l.b[h] + kBox);
      }
    }
    if constexpr (kBExps) {  // the tile's 128 rows of A's K-block: whole, as the activation stores them
      static_assert(kTileRows == kFp8Block, "an activation's exponents come in tiles of rows (Fp8Matrix)");
      const int32_t* from = l.a_exp + (long(l.a / kTileRows) * l.k_blocks + kb) * kTileRows;
      ptx::bulk_load(pipe.smem->scales[pipe.stage()].a_exps, from, sizeof(StageScales::a_exps), full);
    }
    if constexpr (kColumnScales) {
      ColumnScales& cs = pipe.smem->scales[pipe.stage()].columns;
      const ColumnScaleSource& from = l.columns;
      const long block = (l.b_k + k) / kFp8Block;  // A's and B's K-blocks are the same rows
      ptx::bulk_load(cs.b, from.b_scales + block * from.b_stride + l.b[0], sizeof(cs.b), full);
      ptx::bulk_load(cs.a_exps, from.a_exps + block * from.a_stride + l.a, sizeof(cs.a_exps), full);
      ptx::bulk_load(&cs.b_range, from.b_range + block, sizeof(cs.b_range), full);
    }
  }
  return true;
}

// The four K-steps of one stage, in K order, on this consumer warpgroup's 64 rows (A's box).
template <Majors kM>
__device__ __forceinline__ void stage_steps(const uint8_t* st, Warpgroup consumer, float (&acc)[kAccumulators]) {
  const uint64_t da = ptx::smem_descriptor_sw128(st + consumer_index(consumer) * kBoxBytes);
  const uint64_t db = ptx::smem_descriptor_sw128(st + kABytes, kM.b_mn ? kBoxBytes : 0);
  // A K-step's start, in descriptor address units of 16 bytes: 16 K-rows of 128 bytes on (MN-major),
  // or 16 K-columns of 2 bytes on (K-major).
  constexpr uint64_t kRowsStep = kWgmmaK * kBox * 2 >> 4, kColumnsStep = kWgmmaK * 2 >> 4;
  constexpr uint64_t a_step = kM.a_mn ? kRowsStep : kColumnsStep, b_step = kM.b_mn ? kRowsStep : kColumnsStep;
#pragma unroll
  for (int kk = 0; kk < kStepsPerStage; ++kk)
    ptx::wgmma_bf16_m64n256k16<kM.a_mn, kM.b_mn>(acc, da + kk * a_step, db + kk * b_step);
}

// Whether a partial times 2^s is exact and normal (promote's argument below; promote_columns' too).
__device__ __forceinline__ bool in_promote_window(int s) { return s >= -108 && s <= 102; }

// acc[kFirst + i] = acc[kFirst + i] + partial[i] 2^s (fp8_gemm_element's promotion, scale_by_exp2), s
// the exponent of accumulator i's row: s_lo for rows 16 w + g, s_hi for rows 16 w + g + 8 ((i / 2) % 2,
// the fragment of ptx/wgmma.cuh). A partial is zero or of magnitude in [2^-18, 2^25): 128 products of
// E4M3 values, each a multiple of 2^-18 and at most 448^2, summed by the tensor core, whose cuts toward
// zero keep that grid (or a coarser one) and never grow a magnitude. So for s in [-108, 102] its
// product by 2^s is a normal float, exact, and acc plus it is one fused multiply-add (one rounding, as
// the add alone), by a factor computed once per row, as it nearly always is. Elsewhere, scale_by_exp2's
// own path, then the add.
template <int kFirst, int kTotals>
__device__ __forceinline__ void promote(float (&acc)[kTotals], const float (&partial)[kAccumulators / 2], int s_lo,
                                        int s_hi) {
  static_assert(kFirst + kAccumulators / 2 <= kTotals, "the partials' totals lie in acc");
  constexpr int kCount = kAccumulators / 2;
  if (in_promote_window(s_lo) && in_promote_window(s_hi)) {
    const float f_lo = exp2_of(s_lo), f_hi = exp2_of(s_hi);
#pragma unroll
    for (int i = 0; i < kCount; ++i) acc[kFirst + i] = fma32(partial[i], (i / 2) % 2 ? f_hi : f_lo, acc[kFirst + i]);
  } else {
#pragma unroll
    for (int i = 0; i < kCount; ++i)
      acc[kFirst + i] = acc[kFirst + i] + scale_by_exp2(partial[i], (i / 2) % 2 ? s_hi : s_lo);
  }
}

// The exponent e of a scale 2^e (a normal float: e in [-126, 127]).
__device__ __forceinline__ int scale_exponent_of(float scale) { return int(__float_as_uint(scale) >> 23) - 127; }

// promote's with a scale per column of B (the fp8 weight gradients'): acc[kFirst + i] = acc[kFirst + i]
// + partial[i] 2^(s_row + s_col), s_row the exponent of A's row (the stage's a_exps: the thread's tile
// rows, acc_row, and 8 below), 2^s_col the scale of B's row (cs.b from kFirst's half). Where every
// s_col and every sum lies in promote's window [-108, 102] (from the K-block's smallest and largest
// s_col, b_range), partial 2^s_col is exact and normal, its product by 2^s_row exact too, and one fused
// multiply-add adds it with the add's one rounding; elsewhere scale_by_exp2's own path, then the add.
// Everything comes from the stage, so nothing is held from one K-block to the next.
template <int kFirst>
__device__ __forceinline__ void promote_columns(float (&acc)[kAccumulators], const float (&partial)[kAccumulators / 2],
                                                const ColumnScales& cs, Warpgroup consumer) {
  static_assert(kFirst == 0 || kFirst == kAccumulators / 2, "kFirst: a half's first accumulator");
  constexpr int kCount = kAccumulators / 2;
  const int tile_row = acc_row(consumer, 0);
  const int s_lo = cs.a_exps[tile_row], s_hi = cs.a_exps[tile_row + 8], s_col_min = cs.b_range.x,
            s_col_max = cs.b_range.y;
  // acc_col(i) = 8 (i / 4) + 2 (t % 4) + i % 2: the pairs of this thread's columns
  const float* pair = cs.b + (kFirst ? kTileN / 2 : 0) + 2 * (threadIdx.x % 4);
  if (in_promote_window(s_col_min) && in_promote_window(s_col_max) && in_promote_window(min(s_lo, s_hi) + s_col_min) &&
      in_promote_window(max(s_lo, s_hi) + s_col_max)) {
    const float f_lo = exp2_of(s_lo), f_hi = exp2_of(s_hi);
#pragma unroll
    for (int i = 0; i < kCount; i += 2) {
      const float2 f = *reinterpret_cast<const float2*>(pair + 8 * (i / 4));
      const float f_row = (i / 2) % 2 ? f_hi : f_lo;
      acc[kFirst + i] = fma32(partial[i] * f.x, f_row, acc[kFirst + i]);
      acc[kFirst + i + 1] = fma32(partial[i + 1] * f.y, f_row, acc[kFirst + i + 1]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kCount; i += 2) {
      const float2 f = *reinterpret_cast<const float2*>(pair + 8 * (i / 4));
      const int s_row = (i / 2) % 2 ? s_hi : s_lo;
      acc[kFirst + i] = acc[kFirst + i] + scale_by_exp2(partial[i], s_row + scale_exponent_of(f.x));
      acc[kFirst + i + 1] = acc[kFirst + i + 1] + scale_by_exp2(partial[i + 1], s_row + scale_exponent_of(f.y));
    }
  }
}

// Issues half h of B (128 columns: one weight block) over one stage's K-block: four m64n128k32 K-steps
// from +0 on this consumer's rows (A descriptor da), into partial, as one wgmma group. Its fragment is
// the first half of an m64n256 one.
template <int kHalf>
__device__ __forceinline__ void fp8_half_block(const uint8_t* st, uint64_t da, float (&partial)[kAccumulators / 2]) {
  constexpr uint64_t kStep = kFp8StepK * sizeof(fp8_e4m3) >> 4;  // a K-step's 32 bytes, in 16-byte units
  const uint64_t db = ptx::smem_descriptor_sw128(st + kABytes + kHalf * 2 * kBoxBytes);
  ptx::wgmma_fence_operands(partial);
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kFp8StepsPerBlock; ++kk)  // the first K-step from +0 (no C): no zeroing of the partials
    ptx::wgmma_e4m3_m64n128k32(partial, da + kk * kStep, db + kk * kStep, kk > 0);
  ptx::wgmma_commit();
}

// Waits for this consumer's wgmma group, so its partials can be read.
__device__ __forceinline__ void fp8_half_done(float (&partial)[kAccumulators / 2]) {
  ptx::wgmma_wait<0>();
  ptx::wgmma_fence_operands(partial);
}

// One tile's FP8 chain on this consumer warpgroup's 64 rows (mok/core/fp8_gemm.h, fp8_gemm_element):
// per K-block of kFp8Block, each half of B (one weight block) gets four K-steps from +0 and is promoted
// into acc (fp32, from +0) with the scale exponents of the thread's two rows and of the block, all from
// the stage (produce(); read at the K-block's start, before the thread releases the stage;
// kColumnScales: of its rows and columns).
// A consumer has registers for one half's partials at a time (64 beside the 128 totals), so one
// group is in flight; the rest of the K-block's work runs in its shadow: the wait for the next stage
// during half 1's K-steps, so a consumer's chain is K-steps and promotions only. While one consumer
// promotes, the other's K-steps keep the tensor core busy. A stage is released once half 1's K-steps
// have read it (kColumnScales: once its promotion has read the stage's ColumnScales). The failure
// rules are consume()'s.
// kColumnScales (the fp8 weight gradients'): scales per row of A and per column (promote_columns).
template <bool kColumnScales, bool kSharing = false>
__device__ __forceinline__ bool consume_fp8(Pipeline& pipe, const TileLoad& l, Warpgroup consumer,
                                            float (&acc)[kAccumulators], const GridBarrier& b, int phase) {
#pragma unroll
  for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;
  const int row = acc_row(consumer, 0);  // the thread's rows of the tile: row and row + 8
  const auto wait_stage = [&](uint32_t ahead) {
    return pipeline_wait(&pipe.smem->full[pipe.stage(ahead)], pipe.parity(ahead), b, phase);
  };
  bool healthy = l.k_blocks == 0 || wait_stage(0);
  const bool turns = !kColumnScales && l.k_blocks >= kTurnsMinBlocks;  // a phase's tiles: all or none
  if (turns && consumer == Warpgroup::consumer1) pass_turn(consumer);  // consumer 0's first turn
  float partial[kAccumulators / 2];
  for (int kb = 0; kb < l.k_blocks; ++kb, ++pipe.blocks) {
    __syncwarp();  // wgmma is .sync.aligned: the warp's lanes meet again after their waits
    const StageScales& scales = pipe.smem->scales[pipe.stage()];
    // The weights' chain's K-block exponents: A's two rows', B's two halves'.
    const int2 ea = kColumnScales ? int2{} : int2{scales.a_exps[row], scales.a_exps[row + 8]};
    const int2 eb = kColumnScales ? int2{} : pipe.smem->b_exps[pipe.stage()];
    const uint8_t* st = pipe.smem->stage[pipe.stage()];
    const uint64_t da = ptx::smem_descriptor_sw128(st + consumer_index(consumer) * kBoxBytes);
    if (turns) wait_turn(consumer);
    fp8_half_block<0>(st, da, partial);
    if (turns) pass_turn(consumer);
    fp8_half_done(partial);
    if constexpr (kColumnScales)
      promote_columns<0>(acc, partial, scales.columns, consumer);
    else
      promote<0>(acc, partial, ea.x + eb.x, ea.y + eb.x);
    if (turns) wait_turn(consumer);
    fp8_half_block<1>(st, da, partial);
    if (turns) pass_turn(consumer);
    const bool next_healthy = healthy && (kb + 1 == l.k_blocks || wait_stage(1));
    __syncwarp();  // the lanes meet again after the wait, before the aligned wgmma wait
    fp8_half_done(partial);
    // The release follows the last read of the stage: the column scales' promotion reads it, the other
    // promotion only registers.
    if constexpr (kColumnScales) promote_columns<kAccumulators / 2>(acc, partial, scales.columns, consumer);
    release_stage<kSharing>(pipe, pipe.stage(), healthy);
    if constexpr (!kColumnScales) promote<kAccumulators / 2>(acc, partial, ea.x + eb.y, ea.y + eb.y);
    healthy = next_healthy;
  }
  if (!turns) return warpgroup_all(consumer, healthy);
  if (consumer == Warpgroup::consumer0) wait_turn(consumer);  // consumer 1's last pass
  return consumers_all(healthy);
}

// consume_fp8's chain on a narrow tile (produce<..., kBHalves = 1>: 128 x 128, each consumer 64 x 128; mok-fp8-chain's
// fed-kimi-k2-n128): one group a K-block, B's half 0, promoted into acc's first half (the second stays 0), so a
// consumer waits for its group once a K-block, not twice. Each output's K-steps and promotions are consume_fp8's (the
// same m64n128k32 groups from +0, in K order): the same bits. In the fp8 ring phases it ran bit for bit and 11-18%
// slower (docs/benchmarks.md, session 69: a narrow tile's feed, a third more bytes a product).
__device__ __forceinline__ bool consume_fp8_narrow(Pipeline& pipe, const TileLoad& l, Warpgroup consumer,
                                                   float (&acc)[kAccumulators], const GridBarrier& b, int phase) {
#pragma unroll
  for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;
  const int row = acc_row(consumer, 0);
  const auto wait_stage = [&](uint32_t ahead) {
    return pipeline_wait(&pipe.smem->full[pipe.stage(ahead)], pipe.parity(ahead), b, phase);
  };
  bool healthy = l.k_blocks == 0 || wait_stage(0);
  float partial[kAccumulators / 2];
  for (int kb = 0; kb < l.k_blocks; ++kb, ++pipe.blocks) {
    __syncwarp();
    const StageScales& scales = pipe.smem->scales[pipe.stage()];
    const int2 ea{scales.a_exps[row], scales.a_exps[row + 8]};
    const int eb = pipe.smem->b_exps[pipe.stage()].x;
    const uint8_t* st = pipe.smem->stage[pipe.stage()];
    fp8_half_block<0>(st, ptx::smem_descriptor_sw128(st + consumer_index(consumer) * kBoxBytes), partial);
    const bool next_healthy = healthy && (kb + 1 == l.k_blocks || wait_stage(1));
    __syncwarp();
    fp8_half_done(partial);
    release_stage<false>(pipe, pipe.stage(), healthy);
    promote<0>(acc, partial, ea.x + eb, ea.y + eb);
    healthy = next_healthy;
  }
  return warpgroup_all(consumer, healthy);
}

// One tile's chain on this consumer warpgroup's 64 rows, continued from acc's values. One stage's wgmma group stays in
// flight while the next is issued (the accumulators' K-steps still run in issue order); a stage is released once the
// group reading it has completed. After a failed wait the loop runs on without waiting (its results are void: the
// launch reports the error), so no exit leaves a group in flight, and the verdict is the warpgroup's, so no thread
// leaves its warpgroup behind in a wgmma.
template <Majors kM, bool kSharing = false>
__device__ inline bool consume(Pipeline& pipe, const TileLoad& l, Warpgroup consumer, float (&acc)[kAccumulators],
                               const GridBarrier& b, int phase) {
  uint32_t previous = 0;
  bool healthy = true;
  for (int kb = 0; kb < l.k_blocks; ++kb, ++pipe.blocks) {
    healthy = healthy && pipeline_wait(&pipe.smem->full[pipe.stage()], pipe.parity(), b, phase);
    __syncwarp();  // wgmma is .sync.aligned: the warp's lanes meet again after their waits
    ptx::wgmma_fence_operands(acc);
    ptx::wgmma_fence();
    stage_steps<kM>(pipe.smem->stage[pipe.stage()], consumer, acc);
    ptx::wgmma_commit();
    ptx::wgmma_wait<1>();
    ptx::wgmma_fence_operands(acc);
    // An unhealthy consumer stops releasing stages: the producer must not re-arm a stage whose bytes
    // may still be landing (it fails its own wait instead).
    release_stage<kSharing>(pipe, previous, healthy && kb > 0);
    previous = pipe.stage();
  }
  ptx::wgmma_wait<0>();
  ptx::wgmma_fence_operands(acc);
  release_stage<kSharing>(pipe, previous, healthy && l.k_blocks > 0);
  return warpgroup_all(consumer, healthy);  // every thread of the warpgroup gets here
}

// Barrier of the whole block from the roles' separate paths. The roles reach it from different
// instructions, which the aligned form (bar.sync) leaves undefined: barrier.sync is the form that
// allows it.
__device__ __forceinline__ void block_sync() { ptx::barrier_sync<int(NamedBarrier::block), kThreads>(); }

// Runs tiles [0, tiles) of one phase over the persistent blocks. job(t, load) fills the tile's
// operands (false: nothing to do); start(t, consumer, acc) sets a consumer's accumulators before its
// chain (bf16 operands; zeros by default: the fp8 chain always starts from zeros); epilogue(t,
// consumer, acc) consumes a consumer's finished half tile; the job, the start and the epilogue of one
// tile run back to back in each thread. kM: the operands' majorness; kFp8: E4M3 operands (kColumnScales:
// the fp8 weight gradients', scaled per column of B, consume_fp8).
// Registers move through the block's pool in a fixed order, each move behind a block barrier: the
// producer warpgroup gives, then the consumers take; at the end the consumers give back, then the
// producer takes. (Unordered, a producer warp with no tiles could take its registers back before the
// consumers got them, and the block would wait forever in setmaxnreg and __syncthreads.)
struct ZeroStart {
  __device__ void operator()(long, Warpgroup, float (&acc)[kAccumulators]) const {
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;
  }
};
// How a phase's blocks take its tiles. RoundRobin (gemm_tiles' default): block b of G takes b, b + G, ...
// ClaimedWalk: each block takes the next tile no block has taken when its producer is free, as greedy
// list scheduling does, for a list of unequal chains (the weight gradients, longest first: round-robin
// let the blocks' free times drift apart, a long gradient's tiles, which read the same operands, then
// started scattered in time and read them from DRAM again and again; docs/benchmarks.md, session 61).
// The producer thread claims from `counter` (zeroed before the launch; one per phase) and hands the
// numbers to the consumers through the block's TileQueue, the list's end as -1; the producer
// warpgroup's other threads walk none and take the pipeline's count at the phase's end. Which block
// runs a tile changes no bit.
struct RoundRobin {};
struct ClaimedWalk {
  unsigned int* counter;
};
inline constexpr int kQueueSlots = 4;
struct TileQueue {
  uint64_t full[kQueueSlots];   // a number posted (the producer thread's arrival)
  uint64_t empty[kQueueSlots];  // a number read (every consumer thread's arrival)
  long tile[kQueueSlots];
  uint32_t blocks;  // the producer thread's pipeline count at a claimed phase's end
};
// Static shared memory, so that only the kernels with a claimed phase hold it.
__device__ __forceinline__ TileQueue& tile_queue() {
  __shared__ TileQueue queue;
  return queue;
}
// A launch's queue, before its first claimed phase (a block barrier follows before that).
__device__ inline void init_tile_queue() {
  TileQueue& q = tile_queue();
  if (threadIdx.x != 0) return;
  for (int s = 0; s < kQueueSlots; ++s) {
    ptx::mbarrier_init(&q.full[s], 1);
    ptx::mbarrier_init(&q.empty[s], kConsumerThreads);
  }
  ptx::fence_barrier_init();
}
// The producer thread's walk of a claimed phase: claim, post, produce, until a claim past the list
// (posted as -1; after its own produce failed, -1 next; after a failed wait for a slot, nothing more: the
// consumers' waits fail too, and the launch stops before another claimed phase).
template <Majors kM, bool kFp8, bool kColumnScales, class Job>
__device__ void produce_claimed(Pipeline& pipe, const ClaimedWalk& walk, long tiles, Job& job, const GridBarrier& b,
                                int phase) {
  TileQueue& q = tile_queue();
  bool healthy = true;
  for (uint32_t n = pipe.queued;; ++n) {
    const long claimed = healthy ? long(atomicAdd(walk.counter, 1u)) : tiles;
    const long t = claimed < tiles ? claimed : -1;
    const uint32_t slot = n % kQueueSlots;
    if (!pipeline_wait(&q.empty[slot], (n / kQueueSlots & 1u) ^ 1u, b, phase)) break;
    q.tile[slot] = t;
    ptx::mbarrier_arrive(&q.full[slot]);  // releases the number to the consumers' waits
    if (t < 0) {
      pipe.queued = n + 1;
      break;
    }
    TileLoad l;
    if (job(t, l)) healthy = produce<kM, kFp8, kColumnScales>(pipe, l, b, phase);
  }
  q.blocks = pipe.blocks;
}
// A consumer thread's n-th number of the launch's queue (-1: the list's end, or a failed wait). The
// verdict is the warpgroup's, as consume's: threads split by an error landing mid-wait would leave
// some of their warpgroup behind in its named barriers and its wgmma.
__device__ inline long take_claimed(Warpgroup consumer, uint32_t n, const GridBarrier& b, int phase) {
  TileQueue& q = tile_queue();
  const uint32_t slot = n % kQueueSlots;
  const bool posted = pipeline_wait(&q.full[slot], n / kQueueSlots & 1u, b, phase);
  __syncwarp();  // bar.red is aligned: the warp's lanes meet again after their waits
  if (!warpgroup_all(consumer, posted)) return -1;
  const long t = q.tile[slot];
  ptx::mbarrier_arrive(&q.empty[slot]);
  return t;
}

// A tile as a block of a pair runs it (take_tile): whether it is the block's own (else a stand-in: no
// epilogue), and the half of B the block loads for both (-1: the block loads all of B itself).
struct PairedTile {
  bool own = true;
  int b_half = -1;
};

// Whether two tiles' B is the same K-blocks of the same rows.
__device__ __forceinline__ bool same_b(const TileLoad& x, const TileLoad& y) {
  return x.mb == y.mb && x.b[0] == y.b[0] && x.b[1] == y.b[1] && x.b_k == y.b_k && x.k_blocks == y.k_blocks &&
         x.b_exp == y.b_exp;
}

// Tile t of this block in a phase of `tiles` (false: nothing to run). Paired blocks sharing B run t and
// t ^ 1 in step (the pair's tiles; every role of both blocks computes both jobs, its own last, so the
// job's state is its own tile's): a block without a tile runs its peer's as a stand-in, and the pair
// shares B unless both have tiles with different B (then the tiles' K-block counts must agree, as
// every tile's of an expert phase do).
template <bool kSharing, class Job>
__device__ __forceinline__ bool take_tile(Job& job, long t, long tiles, TileLoad& l, PairedTile& pt) {
  if constexpr (!kSharing) return job(t, l);
  TileLoad peer_load;
  const bool peer = (t ^ 1) < tiles && job(t ^ 1, peer_load);
  pt.own = t < tiles && job(t, l);
  if (!pt.own && !peer) return false;
  if (!pt.own) l = peer_load;
  pt.b_half = !pt.own || !peer || same_b(l, peer_load) ? int(ptx::cluster_rank()) : -1;
  return true;
}

// gemm_tiles' tile loop; kSharing: paired blocks sharing B (take_tile), a path of its own, so that the
// unpaired one keeps its registers.
template <Majors kM, bool kFp8, bool kColumnScales, bool kSharing, class Job, class Epilogue, class Start, class Walk>
__device__ void gemm_tile_loop(Pipeline& pipe, long tiles, const GridBarrier& b, int phase, Job& job,
                               Epilogue& epilogue, Start& start, const Walk& walk) {
  constexpr bool kClaimed = std::is_same_v<Walk, ClaimedWalk>;
  static_assert(!kClaimed || !kSharing, "paired blocks sharing B walk their pairs' tiles in step");
  // Paired blocks sharing B walk the pairs' tiles (both blocks alike: the grid's block count is even).
  const long walked = kSharing ? (tiles + 1) & ~1L : tiles;
  const int warpgroup = __shfl_sync(~0u, int(threadIdx.x) / kWarpgroupThreads, 0);  // warp-uniform, visibly
  // Each role's path is straight, so the compiler sees every instruction's register budget.
  if (warpgroup == 0) {  // the producer; the consumers' role (warpgroup_role) is computed on their path
    ptx::setmaxnreg_dec<kProducerRegisters>();
    block_sync();
    if constexpr (kClaimed) {
      if (threadIdx.x == 0) produce_claimed<kM, kFp8, kColumnScales>(pipe, walk, tiles, job, b, phase);
    } else {
      bool healthy = true;
      for (long t = blockIdx.x; t < walked && healthy; t += gridDim.x) {
        TileLoad l;
        PairedTile pt;
        if (!take_tile<kSharing>(job, t, tiles, l, pt)) continue;
        if (threadIdx.x == 0)
          healthy = produce<kM, kFp8, kColumnScales, kSharing>(pipe, l, b, phase, pt.b_half);
        else
          pipe.blocks += l.k_blocks;
      }
    }
    __syncwarp();  // thread 0 may have left the loop early; the barrier and setmaxnreg are warp-aligned
    block_sync();
    if constexpr (kClaimed) pipe.blocks = tile_queue().blocks;
    ptx::setmaxnreg_inc<kKernelRegisters>();
  } else {
    block_sync();
    ptx::setmaxnreg_inc<kConsumerRegisters>();
    // The K-block counts (the pipeline's, and below a tile's) are the same in every thread, but the
    // compiler does not always see it (after a tile loop that left on a warpgroup's verdict; a tile's
    // count read from a table): broadcast, they keep the stage index and the wgmma descriptors in
    // uniform registers (else 16 R2UR a K-block in the bf16 loops, 32 in the fp8 ones).
    pipe.blocks = __shfl_sync(~0u, pipe.blocks, 0);
    const Warpgroup consumer = warpgroup_role(warpgroup);
    for (long n = kClaimed ? long(pipe.queued) : long(blockIdx.x);; n += kClaimed ? 1 : gridDim.x) {
      long t = n;
      if constexpr (kClaimed) {
        if ((t = take_claimed(consumer, uint32_t(n), b, phase)) < 0) {
          pipe.queued = uint32_t(n + 1);
          break;
        }
      } else if (t >= walked) {
        break;
      }
      TileLoad l;
      PairedTile pt;
      if (!take_tile<kSharing>(job, t, tiles, l, pt)) continue;
      l.k_blocks = __shfl_sync(~0u, l.k_blocks, 0);
      float acc[kAccumulators];
      if constexpr (kFp8) {
        if (!consume_fp8<kColumnScales, kSharing>(pipe, l, consumer, acc, b, phase)) break;
      } else {
        if (!kSharing || pt.own)
          start(t, consumer, acc);
        else
          ZeroStart{}(t, consumer, acc);
        if (!consume<kM, kSharing>(pipe, l, consumer, acc, b, phase)) break;
      }
      if (!kSharing || pt.own) epilogue(t, consumer, acc);
    }
    ptx::setmaxnreg_dec<kKernelRegisters>();
    block_sync();
  }
}

// kShareB: an expert phase, whose paired blocks share B (take_tile); walk: how the blocks take the tiles
// (RoundRobin, ClaimedWalk).
template <Majors kM, bool kFp8 = false, bool kColumnScales = false, bool kShareB = false, class Job, class Epilogue,
          class Start = ZeroStart, class Walk = RoundRobin>
__device__ void gemm_tiles(Pipeline& pipe, long tiles, const GridBarrier& b, int phase, Job job, Epilogue epilogue,
                           Start start = {}, Walk walk = {}) {
  static_assert(!kFp8 || (!kM.a_mn && !kM.b_mn), "E4M3 operands are K-major");
  static_assert(kFp8 || !kColumnScales, "column scales are the E4M3 chain's");
  if (!pipe.paired)
    return gemm_tile_loop<kM, kFp8, kColumnScales, false>(pipe, tiles, b, phase, job, epilogue, start, walk);
  if (!begin_paired_phase(pipe, kShareB, b, phase)) return;
  gemm_tile_loop<kM, kFp8, kColumnScales, kShareB>(pipe, tiles, b, phase, job, epilogue, start, walk);
  // The pair's last arrivals at each other's stages are in before either goes on.
  meet_peer(pipe, b, phase);
}

// Visits this thread's accumulator pairs of columns [0, columns): store(row, col, d[col], d[col + 1]).
template <class Store>
__device__ __forceinline__ void for_each_pair(Warpgroup consumer, const float (&acc)[kAccumulators], Store store,
                                              int columns = kTileN) {
#pragma unroll
  for (int i = 0; i < kAccumulators; i += 2)
    if (acc_col(i) < columns) store(acc_row(consumer, i), acc_col(i), acc[i], acc[i + 1]);
}

}  // namespace mok::gpu
