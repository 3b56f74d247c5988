// The matrix engine's geometry (tile_gemm.cuh): the block's warpgroups and named barriers, the
// output tile, the TMA boxes and pipeline stages, the shared memory, the registers, and where each
// accumulator sits. Every derived size is checked where it is derived.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mok/core/bf16.h"
#include "mok/core/saved_layout.h"

namespace mok::gpu {

// A block is three warpgroups of 128 threads, by role in a GEMM phase: warpgroup 0 is the TMA
// producer, warpgroups 1 and 2 the wgmma consumers, each on its own 64 rows of the tile. A role's value
// is its warpgroup - 1, so a consumer's value is its index (its rows, its staging rows).
inline constexpr int kWarpgroupThreads = 128;
enum class Warpgroup : int { producer = -1, consumer0 = 0, consumer1 = 1 };
inline constexpr int kConsumers = 2;
inline constexpr int kThreads = (1 + kConsumers) * kWarpgroupThreads;
// Arrivals that free a stage: every consumer thread's, after its last read of it (one per warp after a
// __syncwarp is as correct, but compute-sanitizer's racecheck does not see that ordering:
// docs/results/2026-12-03-h200-f/mbarrier_probe.cu).
inline constexpr int kConsumerThreads = kConsumers * kWarpgroupThreads;
inline constexpr int kConsumerWarps = kConsumerThreads / 32;

__device__ __forceinline__ Warpgroup warpgroup_role(int warpgroup) { return Warpgroup(warpgroup - 1); }
__device__ __forceinline__ int consumer_index(Warpgroup consumer) { return int(consumer); }

// Named barrier ids (immediates in the PTX, so ptxas reserves only these).
enum class NamedBarrier : int {
  sync_threads = 0,      // __syncthreads
  consumer0 = 1,         // consumer warpgroup 0 alone
  consumer1 = 2,         // consumer warpgroup 1 alone
  block = 3,             // the whole block, reached from the roles' separate paths
  consumer0_issued = 4,  // the fp8 chain's turns (wait_turn in tile_gemm.cuh): consumer 0 issued a group
  consumer1_issued = 5,  // consumer 1 issued a group
  consumers = 6,         // both consumer warpgroups
};

// The output tile: kTileRows (mok/core/saved_layout.h: experts' rows are padded to whole tiles) x
// kTileN, one wgmma m64n256k16 chain per consumer and K-step.
inline constexpr int kWgmmaM = 64, kWgmmaK = 16, kTileN = 256;
static_assert(kConsumers * kWgmmaM == kTileRows, "the consumers' rows make the tile experts are padded to");

// TMA: 64 x 64 bf16 boxes, rows of 128 bytes (the swizzle's span). A stage holds one K-block of 64:
// A's two boxes of 64 rows (consumer c's rows are box c), then B's four boxes of 64 columns.
inline constexpr int kBox = 64;
inline constexpr int kBoxBytes = kBox * kBox * 2;
inline constexpr int kABoxes = kTileRows / kBox, kBBoxes = kTileN / kBox;
inline constexpr int kABytes = kABoxes * kBoxBytes;  // A's boxes come first in a stage
inline constexpr int kStageBytes = (kABoxes + kBBoxes) * kBoxBytes;
inline constexpr int kStepsPerStage = kBox / kWgmmaK;  // K-steps per pipeline stage
inline constexpr int kStages = 4;
static_assert(kBox * 2 == 128, "a box row is the 128-byte swizzle span");
static_assert(kBox == kWgmmaM, "consumer c's A rows are box c");
static_assert(kABoxes == 2 && kBBoxes == 4 && kStageBytes == 6 * kBoxBytes,
              "produce() copies six boxes per stage and announces kStageBytes");
static_assert(kTileRows % kBox == 0, "a weight gradient's last K-block ends in its expert's padding rows");

// Accumulators per consumer thread: its share of the warpgroup's 64 x 256 half tile.
inline constexpr int kAccumulators = kWgmmaM * kTileN / kWarpgroupThreads;

// Where accumulator i of thread t of consumer c sits in the tile (the wgmma m64n256 fragment,
// ptx/wgmma.cuh): rows 64 c.., columns 0-255.
__host__ __device__ constexpr int acc_tile_row(int c, int t, int i) {
  return kWgmmaM * c + 16 * (t / 32) + (t % 32) / 4 + 8 * ((i / 2) % 2);
}
// (t unsigned, as threadIdx.x is: the compiler then keeps t % 4 a mask.)
__host__ __device__ constexpr int acc_tile_col(unsigned t, int i) { return 8 * (i / 4) + 2 * (t % 4) + i % 2; }

// Each element of the tile is one accumulator of one consumer thread.
constexpr bool accumulators_cover_tile() {
  bool seen[kTileRows * kTileN] = {};
  for (int c = 0; c < kConsumers; ++c)
    for (int t = 0; t < kWarpgroupThreads; ++t)
      for (int i = 0; i < kAccumulators; ++i) {
        const int row = acc_tile_row(c, t, i), col = acc_tile_col(t, i);
        if (row < kWgmmaM * c || row >= kWgmmaM * (c + 1) || col < 0 || col >= kTileN || seen[row * kTileN + col])
          return false;
        seen[row * kTileN + col] = true;
      }
  return true;
}
static_assert(kAccumulators == 128 && accumulators_cover_tile(),
              "one m64n256 fragment (ptx/wgmma.cuh) per consumer thread, covering the consumer's half tile once");

// This thread's accumulator i (consumer: its warpgroup).
__device__ __forceinline__ int acc_row(Warpgroup consumer, int i) {
  return acc_tile_row(consumer_index(consumer), threadIdx.x % kWarpgroupThreads, i);
}
__device__ __forceinline__ int acc_col(int i) { return acc_tile_col(threadIdx.x, i); }

// Registers per thread during a GEMM phase (setmaxnreg): each producer thread gives up 128, each
// consumer thread takes 64 more; kKernelRegisters is what __launch_bounds__(kThreads, 1) gives every
// thread, and what all get back afterwards.
inline constexpr int kKernelRegisters = 168, kProducerRegisters = 40, kConsumerRegisters = 232;
static_assert(kKernelRegisters == 65536 / kThreads / 8 * 8, "what one block per SM gives each thread");
static_assert(kWarpgroupThreads * (kProducerRegisters + kConsumers * kConsumerRegisters) <= kThreads * kKernelRegisters,
              "the consumers take only what the producer gave");

// The bf16 epilogues but GEMM1's (from registers: expert_up.cuh) stage a half tile in passes of 64
// columns (four stages of 48 KB leave no room for more).
// bf16 rows stored as whole 128-byte parts, 16 bytes per lane, take about 30% less time than the
// accumulator layout's scattered 4-byte stores (GEMM2 and dx epilogues, docs/results/2026-11-29-h200-v).
inline constexpr int kStagedCols = 64;
inline constexpr int kStagedPitch = kStagedCols + 8;  // bf16 per staged row; the pad spreads rows over banks

// The 128-byte swizzle repeats every 8 rows (1024 bytes): a stage's boxes start at multiples of it (and
// the epilogue's chunk buffers, whose 64-byte swizzle repeats every 512).
inline constexpr int kSwizzleAlign = 1024;

// The weight gradients' TMA copies (store_rows_by_tma): a consumer's 64 rows go out 64 bytes of a row at
// a time (16 fp32 or 32 bf16 columns), each chunk a box of 64 rows x 64 bytes in the 64-byte swizzle
// (tensor_map.h, MapElement::f32 and bf16_out), from two buffers in turn.
inline constexpr int kOutChunkBytes = 64, kOutChunkBuffers = 2;
template <class Out>
inline constexpr int kOutChunkCols = kOutChunkBytes / int(sizeof(Out));

// Where element (row, col) of a chunk of Out lies in its row of the buffer: the 64-byte swizzle XORs a
// byte address's 16-byte unit (bits 4-5) with its bits 7-8, which in 64-byte rows are the row's bits 1-2.
template <class Out>
__host__ __device__ constexpr int out_chunk_col(int row, int col) {
  constexpr int kUnit = 16 / int(sizeof(Out));  // elements of a 16-byte unit
  return kUnit * ((col / kUnit) ^ (row / 2 % 4)) + col % kUnit;
}

// Each element of a chunk has its own place, and a warp's write of one accumulator pair (8 rows, 4 lanes
// a row: 8 bytes each in fp32, 4 in bf16) touches each of the 32 banks as often as a pair has 4-byte
// words: the fewest wavefronts, two in fp32 (unswizzled, rows 2 apart share banks: four), one in bf16.
template <class Out>
constexpr bool out_chunk_writes_spread() {
  constexpr int kCols = kOutChunkCols<Out>, kWords = 2 * int(sizeof(Out)) / 4;  // a pair's 4-byte words
  bool seen[kWgmmaM * kCols] = {};
  for (int row = 0; row < kWgmmaM; ++row)
    for (int col = 0; col < kCols; ++col) {
      const int at = kCols * row + out_chunk_col<Out>(row, col);
      if (at < 0 || at >= kWgmmaM * kCols || seen[at]) return false;
      seen[at] = true;
    }
  for (int warp = 0; warp < kWarpgroupThreads / 32; ++warp)
    for (int i = 0; i < kAccumulators; i += 2) {
      int hits[32] = {};
      for (int lane = 0; lane < 32; ++lane) {
        const int t = 32 * warp + lane, col = acc_tile_col(unsigned(t), i) % kCols;
        const int row = acc_tile_row(0, t, i), at = kCols * row + out_chunk_col<Out>(row, col);
        if (col % 2 != 0 || at % 2 != 0) return false;  // the pair is one aligned write
        for (int w = 0; w < kWords; ++w) ++hits[(at * int(sizeof(Out)) / 4 + w) % 32];
      }
      for (int bank = 0; bank < 32; ++bank)
        if (hits[bank] != kWords) return false;
    }
  return true;
}
static_assert(out_chunk_writes_spread<float>() && out_chunk_writes_spread<bf16>(),
              "the chunk's swizzle is a bijection and its pair writes are conflict-free");

// The fp8 weight gradients' operands have a scale per row and K-block (Fp8Columns): a stage holds, beside
// the boxes, the K-block's scales of B's 256 rows (the product's columns), the scale exponents of A's 128
// rows and B's smallest and largest exponent. Their rows in memory are padded to whole tiles, so a
// tile's copy never reads past them.
struct ColumnScales {
  float b[kTileN];           // 2^e
  int8_t a_exps[kTileRows];  // e
  int4 b_range;              // B's block row's smallest and largest e (x, y)
};
static_assert(sizeof(ColumnScales) % 16 == 0, "bulk copies of 16-byte multiples");
// A stage's scales beside its boxes: the fp8 weight gradients' ColumnScales, or in the other fp8 GEMMs
// the scale exponents of A's 128 rows for the stage's K-block (a tile's copy of its activation's).
union StageScales {
  ColumnScales columns;
  int32_t a_exps[kTileRows];
};
__host__ __device__ constexpr int column_scale_stride(int cols) { return (cols + kTileN - 1) / kTileN * kTileN; }

// Paired blocks (LaunchConfig::paired_blocks, tile_gemm.cuh): the pair's meetings so far, and the barrier they
// meet at (one arrival from each block).
struct Pairing {
  uint32_t meetings;
  uint64_t met;
};

struct GemmSmem {
  alignas(kSwizzleAlign) uint8_t stage[kStages][kStageBytes];
  alignas(16) StageScales scales[kStages];  // the fp8 chains' scales, per stage
  int2 b_exps[kStages];                     // the fp8 weights' chain: the scale exponents of B's two halves, per stage
  uint64_t full[kStages];                   // TMA bytes landed
  uint64_t empty[kStages];                  // every consumer thread done reading (kConsumerThreads arrivals; paired
                                            // blocks sharing B: and each of the peer's consumer warps, kConsumerWarps)
  Pairing pairing;                          // paired blocks: where the two meet
  // Each consumer's epilogue rows: the bf16 staging rows, or the 64-byte-row chunks of its TMA copies
  // (fp32 or bf16: store_rows_by_tma).
  union {
    alignas(16) uint16_t staged[kConsumers][kWgmmaM][kStagedPitch];
    alignas(kSwizzleAlign) uint8_t out_chunks[kConsumers][kOutChunkBuffers][kWgmmaM * kOutChunkBytes];
  };
  void* staged_dst[kConsumers][kWgmmaM];  // per consumer, where each staged row goes
};
inline constexpr size_t kSmemBytes = sizeof(GemmSmem) + kSwizzleAlign;  // + room to align the dynamic base
inline constexpr size_t kMaxSmemPerBlock = 227 * 1024;  // Hopper's most (opt-in) shared memory per block
static_assert(kSmemBytes <= kMaxSmemPerBlock, "the pipeline fits one block's shared memory");

}  // namespace mok::gpu
