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
// the same sequence, so the pipeline's counters agree without talking. The producer runs ahead into
// the next tile while the consumers finish their epilogue.
#pragma once

#include <cuda.h>

#include "grid_sync.cuh"
#include "mok/megakernel/ptx/tma.cuh"
#include "mok/megakernel/ptx/wgmma.cuh"

namespace mok::gpu {

inline constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups
inline constexpr int kTileM = 128, kTileN = 256;
inline constexpr int kBox = 64;                            // TMA box: 64 x 64 bf16 = 8 KB, 128-byte rows
inline constexpr int kBoxBytes = kBox * kBox * 2;          // a quarter of B, a half of A
inline constexpr int kABytes = kTileM / kBox * kBoxBytes;  // A's boxes come first in a stage
inline constexpr int kStageBytes = (kTileM + kTileN) / kBox * kBoxBytes;
inline constexpr int kStepsPerStage = kBox / 16;  // K-steps per pipeline stage
inline constexpr int kStages = 4;
inline constexpr int kConsumerWarps = 8;
inline constexpr int kAccumulators = kTileM / 2 * kTileN / 128;  // per consumer thread

// Registers per thread during a GEMM phase (setmaxnreg): each producer thread gives up 128, each
// consumer thread takes 64 more; kKernelRegisters is what __launch_bounds__(kThreads, 1) gives every
// thread, and what all get back afterwards.
inline constexpr int kKernelRegisters = 168, kProducerRegisters = 40, kConsumerRegisters = 232;
static_assert(kKernelRegisters == 65536 / kThreads / 8 * 8, "what one block per SM gives each thread");
static_assert(128 * kProducerRegisters + 256 * kConsumerRegisters <= kThreads * kKernelRegisters);

// The epilogue stages a half tile in passes of 64 columns (four stages of 48 KB leave no room for more).
// bf16 rows stored as whole 128-byte parts, 16 bytes per lane, take about 30% less time than the
// accumulator layout's scattered 4-byte stores (GEMM2 and dx epilogues, results/2026-11-29-h200-v).
inline constexpr int kStagedCols = 64;
inline constexpr int kStagedPitch = kStagedCols + 8;  // bf16 per staged row; the pad spreads rows over banks

struct GemmSmem {
  alignas(1024) uint8_t stage[kStages][kStageBytes];
  uint64_t full[kStages];                                    // TMA bytes landed
  uint64_t empty[kStages];                                   // every consumer warp done reading
  alignas(16) uint16_t staged[2][kTileM / 2][kStagedPitch];  // each consumer warpgroup's rows, as bf16
  void* staged_dst[2][2][kTileM / 2];                        // per warpgroup, two tables of where each staged row goes
};
inline constexpr size_t kSmemBytes = sizeof(GemmSmem) + 1024;  // + room to align the dynamic base

// Where one output tile's operands start: A's 128 rows from a, B's 256 in two halves of 128 from b[0]
// and b[1] (GEMM1 puts its gate and up columns side by side). K-major operands (rows of K, the
// forward and the input gradients): rows a .. a + 127, K-block kb is columns 64 kb ..; MN-major
// operands (A^T B over rows, the weight gradients): columns a .., K-block kb is rows k_first + 64 kb ..
// A chain of K-steps over zero rows leaves every accumulator unchanged (a zero-product step returns
// C exactly, and C is never -0: docs/numerics.md), so chains are whole K-blocks of 4 K-steps.
struct TileLoad {
  const CUtensorMap *ma, *mb;
  int a, b[2];
  int k_first;
  int k_blocks;  // the chain length in K-blocks of 64
};

struct Pipeline {
  GemmSmem* smem;
  uint32_t blocks = 0;  // K-blocks through the pipeline so far, counted alike by every role
  __device__ uint32_t stage() const { return blocks % kStages; }
  __device__ uint32_t parity() const { return (blocks / kStages) & 1u; }
};

__device__ inline Pipeline pipeline_init() {
  extern __shared__ uint8_t dynamic_smem[];
  const uintptr_t base = (reinterpret_cast<uintptr_t>(dynamic_smem) + 1023) & ~uintptr_t(1023);
  Pipeline pipe{reinterpret_cast<GemmSmem*>(base)};
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(&pipe.smem->full[s], 1);
      ptx::mbarrier_init(&pipe.smem->empty[s], kConsumerWarps);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();
  return pipe;
}

// A bounded wait: false once the watchdog stops it (checked every 256 tries: each try is a bounded
// hardware wait already).
__device__ inline bool pipeline_wait(uint64_t* bar, uint32_t parity, const GridBarrier& b, int phase) {
  const long long start = global_ns();
  for (uint32_t spin = 1; !ptx::mbarrier_try_wait(bar, parity); ++spin)
    if (spin % 256 == 0 && watchdog_stop(b, start, kPipelineTimeout, phase, 0, int(blockIdx.x))) return false;
  return true;
}

// Before a producer gives up: lets the copies of its last stages land (bounded by 1 ms), so no block
// leaves with bulk copies into its shared memory in flight.
__device__ inline void drain_copies(const Pipeline& pipe) {
  const long long deadline = global_ns() + 1000000;
  const uint32_t first = pipe.blocks > uint32_t(kStages) ? pipe.blocks - kStages : 0;
  for (uint32_t j = first; j < pipe.blocks; ++j)
    while (!ptx::mbarrier_try_wait(&pipe.smem->full[j % kStages], (j / kStages) & 1u) && global_ns() < deadline) {
    }
}

// Barrier of consumer warpgroup `half` alone (named barriers 1 and 2; 0 is __syncthreads). Immediate
// ids, so ptxas reserves only these.
__device__ __forceinline__ void warpgroup_sync(int half) {
  if (half == 0)
    asm volatile("bar.sync 1, 128;\n" ::: "memory");
  else
    asm volatile("bar.sync 2, 128;\n" ::: "memory");
}

// True when `v` holds in every thread of consumer warpgroup `half` (the same named barriers), so the
// warpgroup leaves a phase together.
__device__ __forceinline__ bool warpgroup_all(int half, bool v) {
  uint32_t all;
  if (half == 0)
    asm volatile(
        "{\n"
        ".reg .pred p, q;\n"
        "setp.ne.u32 p, %1, 0;\n"
        "bar.red.and.pred q, 1, 128, p;\n"
        "selp.u32 %0, 1, 0, q;\n"
        "}\n"
        : "=r"(all)
        : "r"(uint32_t(v))
        : "memory");
  else
    asm volatile(
        "{\n"
        ".reg .pred p, q;\n"
        "setp.ne.u32 p, %1, 0;\n"
        "bar.red.and.pred q, 2, 128, p;\n"
        "selp.u32 %0, 1, 0, q;\n"
        "}\n"
        : "=r"(all)
        : "r"(uint32_t(v))
        : "memory");
  return all != 0;
}

template <bool kMnMajor>
__device__ inline bool produce(Pipeline& pipe, const TileLoad& l, const GridBarrier& b, int phase) {
  for (int kb = 0; kb < l.k_blocks; ++kb, ++pipe.blocks) {
    if (!pipeline_wait(&pipe.smem->empty[pipe.stage()], pipe.parity() ^ 1u, b, phase)) {
      drain_copies(pipe);
      return false;
    }
    uint64_t* full = &pipe.smem->full[pipe.stage()];
    uint8_t* st = pipe.smem->stage[pipe.stage()];
    ptx::mbarrier_arrive_expect_tx(full, kStageBytes);
    const int k = kMnMajor ? l.k_first + kBox * kb : kBox * kb;
    const auto load = [&](int box, const CUtensorMap* map, int at) {
      ptx::tma_load_2d(st + box * kBoxBytes, map, kMnMajor ? at : k, kMnMajor ? k : at, full);
    };
    for (int h = 0; h < 2; ++h) {
      load(h, l.ma, l.a + kBox * h);
      load(2 + 2 * h, l.mb, l.b[h]);
      load(3 + 2 * h, l.mb, l.b[h] + kBox);
    }
  }
  return true;
}

// The four K-steps of one stage, in K order, on this consumer warpgroup's 64 rows (half).
template <bool kMnMajor>
__device__ __forceinline__ void stage_steps(const uint8_t* st, int half, float (&acc)[kAccumulators]) {
  const uint64_t da = ptx::smem_descriptor_sw128(st + half * kBoxBytes);
  const uint64_t db = ptx::smem_descriptor_sw128(st + kABytes, kMnMajor ? kBoxBytes : 0);
  constexpr uint64_t step = kMnMajor ? 2048 >> 4 : 32 >> 4;  // descriptor address units of 16 bytes
#pragma unroll
  for (int kk = 0; kk < kStepsPerStage; ++kk)
    ptx::wgmma_bf16_m64n256k16<kMnMajor, kMnMajor>(acc, da + kk * step, db + kk * step);
}

// Pins the accumulator registers: the compiler may not move their reads or writes across this point
// (an in-flight wgmma group owns them).
__device__ __forceinline__ void fence_operands(float (&acc)[kAccumulators]) {
#pragma unroll
  for (int i = 0; i < kAccumulators; ++i) asm volatile("" : "+f"(acc[i])::"memory");
}

// One tile's chain on this consumer warpgroup's 64 rows (half). One stage's wgmma group stays in flight
// while the next is issued (the accumulators' K-steps still run in issue order); a stage is released
// once the group reading it has completed. After a failed wait the loop runs on without waiting (its
// results are void: the launch reports the error), so no exit leaves a group in flight, and the
// verdict is the warpgroup's, so no thread leaves its warpgroup behind in a wgmma.
template <bool kMnMajor>
__device__ inline bool consume(Pipeline& pipe, const TileLoad& l, int half, float (&acc)[kAccumulators],
                               const GridBarrier& b, int phase) {
#pragma unroll
  for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;
  uint32_t previous = 0;
  bool healthy = true;
  for (int kb = 0; kb < l.k_blocks; ++kb, ++pipe.blocks) {
    healthy = healthy && pipeline_wait(&pipe.smem->full[pipe.stage()], pipe.parity(), b, phase);
    __syncwarp();  // wgmma is .sync.aligned: the warp's lanes meet again after their waits
    fence_operands(acc);
    ptx::wgmma_fence();
    stage_steps<kMnMajor>(pipe.smem->stage[pipe.stage()], half, acc);
    ptx::wgmma_commit();
    ptx::wgmma_wait<1>();
    fence_operands(acc);
    // An unhealthy consumer stops releasing stages: the producer must not re-arm a stage whose bytes
    // may still be landing (it fails its own wait instead).
    ptx::mbarrier_arrive_if(&pipe.smem->empty[previous], healthy && kb > 0 && threadIdx.x % 32 == 0);
    previous = pipe.stage();
  }
  ptx::wgmma_wait<0>();
  fence_operands(acc);
  ptx::mbarrier_arrive_if(&pipe.smem->empty[previous], healthy && l.k_blocks > 0 && threadIdx.x % 32 == 0);
  return warpgroup_all(half, healthy);  // every thread of the warpgroup gets here
}

// Barrier of the whole block from the roles' separate paths (named barrier 3).
__device__ __forceinline__ void block_sync() { asm volatile("bar.sync 3, %0;\n" ::"n"(kThreads) : "memory"); }

template <int kRegisters>
__device__ __forceinline__ void registers_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void registers_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// Runs tiles [0, tiles) of one phase over the persistent blocks. job(t, load) fills the tile's
// operands (false: nothing to do); epilogue(t, half, acc) consumes a finished half tile; the job
// and the epilogue of one tile run back to back in each thread. kMnMajor: the operands' rows are
// along K (A^T B, the weight gradients).
// Registers move through the block's pool in a fixed order, each move behind a block barrier: the
// producer warpgroup gives, then the consumers take; at the end the consumers give back, then the
// producer takes. (Unordered, a producer warp with no tiles could take its registers back before the
// consumers got them, and the block would wait forever in setmaxnreg and __syncthreads.)
template <bool kMnMajor, class Job, class Epilogue>
__device__ void gemm_tiles(Pipeline& pipe, long tiles, const GridBarrier& b, int phase, Job job, Epilogue epilogue) {
  const int role = __shfl_sync(~0u, int(threadIdx.x) / 128, 0);  // warp-uniform, visibly to the compiler
  // Each role's path is straight, so the compiler sees every instruction's register budget.
  if (role == 0) {
    registers_decrease<kProducerRegisters>();
    block_sync();
    bool healthy = true;
    for (long t = blockIdx.x; t < tiles && healthy; t += gridDim.x) {
      TileLoad l;
      if (!job(t, l)) continue;
      if (threadIdx.x == 0)
        healthy = produce<kMnMajor>(pipe, l, b, phase);
      else
        pipe.blocks += l.k_blocks;
    }
    __syncwarp();  // thread 0 may have left the loop early; the barrier and setmaxnreg are warp-aligned
    block_sync();
    registers_increase<kKernelRegisters>();
  } else {
    block_sync();
    registers_increase<kConsumerRegisters>();
    for (long t = blockIdx.x; t < tiles; t += gridDim.x) {
      TileLoad l;
      if (!job(t, l)) continue;
      float acc[kAccumulators];
      if (!consume<kMnMajor>(pipe, l, role - 1, acc, b, phase)) break;
      epilogue(t, role - 1, acc);
    }
    registers_decrease<kKernelRegisters>();
    block_sync();
  }
}

// Where accumulator i of this thread sits in the 128 x 256 tile (half: the consumer warpgroup).
__device__ __forceinline__ int acc_row(int half, int i) {
  const int t = threadIdx.x % 128;
  return 64 * half + 16 * (t / 32) + (t % 32) / 4 + 8 * ((i / 2) % 2);
}
__device__ __forceinline__ int acc_col(int i) { return 8 * (i / 4) + 2 * (threadIdx.x % 4) + i % 2; }

// Visits this thread's accumulator pairs of columns [0, columns): store(row, col, d[col], d[col + 1]).
template <class Store>
__device__ __forceinline__ void for_each_pair(int half, const float (&acc)[kAccumulators], Store store,
                                              int columns = kTileN) {
#pragma unroll
  for (int i = 0; i < kAccumulators; i += 2)
    if (acc_col(i) < columns) store(acc_row(half, i), acc_col(i), acc[i], acc[i + 1]);
}

}  // namespace mok::gpu
