// mok-fp8-chain: the FP8 consumer's K-block chain alone, to find where its time goes (issue 19). Every
// SM runs one block shaped as the megakernel's (a producer warpgroup and two consumer warpgroups at
// kConsumerRegisters). In the resident variants the producer idles and each consumer loops over one
// K-block's operands resident in shared memory (no TMA, no pipeline waits, no epilogue), with the
// megakernel's own functions (fp8_half_block, fp8_half_done, promote of tile_gemm.cuh); in the fed
// variants the producer feeds them. Variants:
//   chain        the megakernel's chain: per half of B, four K-steps from +0, wait, promote;
//   tensor-only  both halves' K-steps accumulating across K-blocks in the tensor core, one group in
//                flight while the next is issued (bf16's pattern): the operands' peak rate here;
//   one-consumer the chain on consumer 0 alone: its latency without the other's K-steps;
//   n128         DeepGEMM's chain: a 64 x 128 consumer tile (half the products per K-block), one
//                group per K-block, waited, promoted into 64 totals;
//   fed ...      the megakernel's chain as its GEMM phases feed it: produce() and consume_fp8() of
//                tile_gemm.cuh over every 128 x 256 tile of C = A B^T, kimi-k2's GEMM1 K of 7168 (the
//                TMA, the stages' mbarriers, the scale exponents from global memory), without an
//                epilogue: the chain alone against the chain fed. On one expert (A [16384, 7168], B
//                [4096, 7168]) with every code 1.0 (fed-ones) or random codes (fed-random), and on
//                kimi-k2's GEMM1 (fed-kimi-k2: 32 experts of 2048 rows, each its own B; random codes);
//                fed-kimi-k2-bf16: that one on bf16 operands through consume() (K-blocks of 64);
//                fed-kimi-k2-n128: that one in narrow tiles (128 x 128: produce() of B's half 0 alone,
//                consume_fp8_narrow(), one group a K-block; twice the tiles, each half the products).
// (Two partials with one group in flight while the other is promoted, which 64 totals would leave
// registers for, make ptxas serialize the wgmmas (C7514): the promotion reads accumulator registers
// while a group runs.)
// Prints per variant the consumer's cycles per K-block, the SM clock they ran at, and the rate over all SMs (both
// consumers' products, or one's for one-consumer). Timing only: the operands are arbitrary codes (no NaN; the fed
// variants' scale exponents 0).
// Usage: mok-fp8-chain [k_blocks=20000]. Exit status: 0 ran, 2 error, 77 no GPU.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "device_array.cuh"
#include "mok/core/tool_exit.h"
#include "mok/megakernel/check.h"
#include "mok/megakernel/megakernel.h"
#include "mok/tools/cli_args.h"
#include "probe_operands.cuh"
#include "tensor_map.h"
#include "tile_gemm.cuh"

namespace mok::gpu {
namespace {

enum class Variant { chain, tensor_only, one_consumer, n128 };
constexpr const char* kVariantNames[] = {"chain", "tensor-only", "one-consumer", "n128"};

// Columns of a consumer's tile in each variant.
constexpr int tile_columns(Variant v) { return v == Variant::n128 ? 128 : kTileN; }
// The chain a consumer runs (one-consumer runs the chain on one of them).
constexpr Variant chain_of(Variant v) { return v == Variant::one_consumer ? Variant::chain : v; }

// One consumer's K-blocks; returns a value of its accumulators, so nothing is optimized away.
template <Variant kVariant>
__device__ float resident_chain(const uint8_t* st, Warpgroup consumer, int k_blocks, int s) {
  float acc[kAccumulators];
#pragma unroll
  for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;
  const uint64_t da = ptx::smem_descriptor_sw128(st + consumer_index(consumer) * kBoxBytes);
  if constexpr (kVariant == Variant::tensor_only) {
    constexpr uint64_t kStep = kFp8StepK * sizeof(fp8_e4m3) >> 4;
    const uint64_t db_lo = ptx::smem_descriptor_sw128(st + kABytes);
    const uint64_t db_hi = ptx::smem_descriptor_sw128(st + kABytes + 2 * kBoxBytes);
    float lo[kAccumulators / 2], hi[kAccumulators / 2];
#pragma unroll
    for (int i = 0; i < kAccumulators / 2; ++i) lo[i] = hi[i] = 0.0f;
    for (int kb = 0; kb < k_blocks; ++kb) {
      ptx::wgmma_fence_operands(lo);
      ptx::wgmma_fence_operands(hi);
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kFp8StepsPerBlock; ++kk)
        ptx::wgmma_e4m3_m64n128k32(lo, da + kk * kStep, db_lo + kk * kStep, true);
#pragma unroll
      for (int kk = 0; kk < kFp8StepsPerBlock; ++kk)
        ptx::wgmma_e4m3_m64n128k32(hi, da + kk * kStep, db_hi + kk * kStep, true);
      ptx::wgmma_commit();
      ptx::wgmma_wait<1>();
      ptx::wgmma_fence_operands(lo);
      ptx::wgmma_fence_operands(hi);
    }
    ptx::wgmma_wait<0>();
    ptx::wgmma_fence_operands(lo);
    ptx::wgmma_fence_operands(hi);
#pragma unroll
    for (int i = 0; i < kAccumulators / 2; ++i) acc[i] = lo[i], acc[kAccumulators / 2 + i] = hi[i];
  } else {
    float partial[kAccumulators / 2];
    for (int kb = 0; kb < k_blocks; ++kb) {
      const int e = s + (kb & 1);  // not a constant: the promotion's exponent check stays
      fp8_half_block<0>(st, da, partial);
      fp8_half_done(partial);
      promote<0>(acc, partial, e, e);
      fp8_half_block<1>(st, da, partial);
      fp8_half_done(partial);
      promote<kAccumulators / 2>(acc, partial, e, e);
    }
  }
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kAccumulators; ++i) sum += acc[i];
  return sum;
}

// The 64 x 128 consumer tile's chain: 64 totals.
__device__ float resident_chain_n128(const uint8_t* st, Warpgroup consumer, int k_blocks, int s) {
  float acc[kAccumulators / 2], partial[kAccumulators / 2];
#pragma unroll
  for (int i = 0; i < kAccumulators / 2; ++i) acc[i] = 0.0f;
  const uint64_t da = ptx::smem_descriptor_sw128(st + consumer_index(consumer) * kBoxBytes);
  for (int kb = 0; kb < k_blocks; ++kb) {
    fp8_half_block<0>(st, da, partial);
    fp8_half_done(partial);
    promote<0>(acc, partial, s + (kb & 1), s + (kb & 1));
  }
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kAccumulators / 2; ++i) sum += acc[i];
  return sum;
}

// What a consumer recorded: its SM cycles and the global timer's nanoseconds over its K-blocks (their
// ratio: the SM clock it ran at).
struct ConsumerTime {
  long long cycles, ns, k_blocks;
};

// Both clocks now.
__device__ ConsumerTime clocks_now() { return ConsumerTime{clock64(), ptx::global_timer_ns(), 0}; }

__device__ void record(ConsumerTime* times, Warpgroup consumer, const ConsumerTime& start, long long k_blocks) {
  const ConsumerTime now = clocks_now();
  if (threadIdx.x % kWarpgroupThreads == 0)
    times[blockIdx.x * kConsumers + consumer_index(consumer)] =
        ConsumerTime{now.cycles - start.cycles, now.ns - start.ns, k_blocks};
}

template <Variant kVariant>
__global__ void __launch_bounds__(kThreads, 1) chain_kernel(int k_blocks, int s, float* sink, ConsumerTime* times) {
  uint8_t* st = aligned_dynamic_smem();
  // E4M3 codes of +-1 and +-2 (no NaN, no overflow in a partial).
  for (int i = threadIdx.x; i < kStageBytes; i += blockDim.x)
    st[i] = uint8_t(0x38 + (i % 7 == 0 ? 8 : 0)) | (i % 3 ? 0x80 : 0);
  __syncthreads();
  const int warpgroup = __shfl_sync(~0u, int(threadIdx.x) / kWarpgroupThreads, 0);
  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<kProducerRegisters>();
    return;
  }
  ptx::setmaxnreg_inc<kConsumerRegisters>();
  const Warpgroup consumer = warpgroup_role(warpgroup);
  if (kVariant == Variant::one_consumer && consumer != Warpgroup::consumer0) return;
  const ConsumerTime start = clocks_now();
  constexpr Variant kChain = chain_of(kVariant);
  float v;
  if constexpr (tile_columns(kVariant) == kTileN)
    v = resident_chain<kChain>(st, consumer, k_blocks, s);
  else
    v = resident_chain_n128(st, consumer, k_blocks, s);
  if (v == 12345.0f) *sink = v;  // never true for these operands: keeps the chain
  record(times, consumer, start, k_blocks);
}

// The fed variants' operands: A [experts tiles_m 128, K] and B [experts tiles_n columns, K] (expert e's
// tiles of A times its own rows of B), read through the megakernel's tensor maps, and their scale
// exponents ([rows, k_blocks] and [rows / 128, k_blocks]).
struct FedOperands {
  CUtensorMap a, b;
  const int32_t* a_exp;
  const int32_t* b_exp;
  ExpertTiles tiles;
  int k_blocks;
};

// Every tile of C = A B^T through produce() and consume_fp8() (kFp8; kNarrow: B's half 0 alone and
// consume_fp8_narrow()) or consume(), round-robin over the blocks, expert by expert with n fastest (the tiles in
// flight share A's rows and the expert's B, as a ring phase's do); no epilogue.
template <bool kFp8, bool kNarrow = false>
__global__ void __launch_bounds__(kThreads, 1)
    fed_kernel(const __grid_constant__ FedOperands op, GridBarrier b, float* sink, ConsumerTime* times) {
  constexpr int kBHalves = kNarrow ? 1 : 2;  // B's halves a stage loads
  Pipeline pipe = pipeline_init();
  const int tiles = op.tiles.count();
  const auto load_of = [&](int t) {
    const int b0 = op.tiles.b_row(t);
    return TileLoad{&op.a, &op.b, op.tiles.a_row(t), {b0, b0 + kTileN / 2}, 0, 0, op.k_blocks, op.a_exp, op.b_exp};
  };
  const int warpgroup = __shfl_sync(~0u, int(threadIdx.x) / kWarpgroupThreads, 0);
  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<kProducerRegisters>();
    if (threadIdx.x == 0)
      for (int t = blockIdx.x; t < tiles; t += gridDim.x)
        if (!produce<kNT, kFp8, false, false, kBHalves>(pipe, load_of(t), b, 0)) break;
    return;
  }
  ptx::setmaxnreg_inc<kConsumerRegisters>();
  const Warpgroup consumer = warpgroup_role(warpgroup);
  float acc[kAccumulators], v = 0.0f;
  long long k_blocks = 0;
  const ConsumerTime start = clocks_now();
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    if constexpr (!kFp8) {
#pragma unroll
      for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;  // consume() continues from acc's values
    }
    const bool healthy = kNarrow ? consume_fp8_narrow(pipe, load_of(t), consumer, acc, b, 0)
                         : kFp8  ? consume_fp8<false>(pipe, load_of(t), consumer, acc, b, 0)
                                 : consume<kNT>(pipe, load_of(t), consumer, acc, b, 0);
    if (!healthy) break;
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) v += acc[i];  // every accumulator read: no promotion left out
    k_blocks += op.k_blocks;
  }
  if (v == 12345.0f) *sink = v;  // never true for these operands: keeps the chain
  record(times, consumer, start, k_blocks);
}

// Times `launch(warm_up)` after a warm-up launch and an idle quarter second (so that, like mok-bench's
// launches, it starts near the top clock rather than under the power cap) and prints the variant's
// line; `columns`: a consumer's tile columns, `depth`: a K-block's. `check()` after each launch throws
// if it failed, before anything is printed.
template <class Launch, class Check>
void report(const char* name, int columns, int depth, DeviceArray<ConsumerTime>& times, Launch launch, Check check) {
  cudaEvent_t begin, end;
  MOK_CUDA_CHECK(cudaEventCreate(&begin));
  MOK_CUDA_CHECK(cudaEventCreate(&end));
  launch(true);
  times.zero();
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
  check();
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  MOK_CUDA_CHECK(cudaEventRecord(begin));
  launch(false);
  MOK_CUDA_CHECK(cudaEventRecord(end));
  MOK_CUDA_CHECK(cudaEventSynchronize(end));
  check();
  float ms = 0;
  MOK_CUDA_CHECK(cudaEventElapsedTime(&ms, begin, end));
  long long cycles = 0, ns = 0, k_blocks = 0;
  int counted = 0;
  for (const ConsumerTime& t : times.download())
    if (t.k_blocks > 0) cycles += t.cycles, ns += t.ns, k_blocks += t.k_blocks, ++counted;
  if (counted == 0) throw std::runtime_error(std::string(name) + ": no consumer recorded its cycles");
  const double flops = 2.0 * kWgmmaM * columns * depth * double(k_blocks);
  std::printf("%-17s %8.1f cycles per K-block per consumer at %5.0f MHz  %7.1f TFLOP/s  (%.3f ms, %d consumers)\n",
              name, double(cycles) / double(k_blocks), 1e3 * double(cycles) / double(ns), flops / ms / 1e9, ms,
              counted);
  MOK_CUDA_CHECK(cudaEventDestroy(begin));
  MOK_CUDA_CHECK(cudaEventDestroy(end));
}

template <Variant kVariant>
void run(int k_blocks, int sms, float* sink, DeviceArray<ConsumerTime>& times) {
  const auto kernel = chain_kernel<kVariant>;
  MOK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  report(
      kVariantNames[int(kVariant)], tile_columns(kVariant), kFp8Block, times,
      [&](bool warm_up) {
        kernel<<<sms, kThreads, kSmemBytes>>>(warm_up ? k_blocks / 10 : k_blocks, 0, sink, times.get());
        MOK_CUDA_CHECK(cudaGetLastError());
      },
      [] {});
}

// One fed variant: its experts, an expert's row tiles of A, and its codes.
struct FedShape {
  const char* name;
  int experts, tiles_m;
  bool random;
};

template <bool kFp8, bool kNarrow = false>
void run_fed(const FedShape& shape, int sms, float* sink, DeviceArray<ConsumerTime>& times) {
  static_assert(kFp8 || !kNarrow, "narrow tiles are fp8's");
  constexpr int kN = 4096, kK = 7168, kDepth = kFp8 ? kFp8Block : kBox;  // kimi-k2's GEMM1
  constexpr int kColumns = kNarrow ? kTileN / 2 : kTileN, kTilesN = kN / kColumns;
  const long rows_a = long(shape.experts) * shape.tiles_m * kTileRows, rows_b = long(shape.experts) * kN;
  constexpr size_t kElementBytes = kFp8 ? 1 : 2;
  auto op = std::make_unique<FedOperands>();  // on the heap: CUtensorMap's alignment
  constexpr int kOne = 0x38;                  // E4M3 1.0 (the ones variant is fp8's)
  const DeviceArray<uint8_t> a = device_bytes(rows_a * kK * kElementBytes, shape.random, kFp8, kOne, sms);
  const DeviceArray<uint8_t> b = device_bytes(rows_b * kK * kElementBytes, shape.random, kFp8, kOne, sms);
  op->k_blocks = kK / kDepth;
  // Scale exponents 0, read by the fp8 chain only (none in bf16: null pointers).
  DeviceArray<int32_t> a_exp(kFp8 ? rows_a * op->k_blocks : 0), b_exp(kFp8 ? rows_b / kFp8Block * op->k_blocks : 0);
  a_exp.zero(), b_exp.zero();
  op->a_exp = a_exp.get(), op->b_exp = b_exp.get();
  op->tiles = ExpertTiles{shape.experts, shape.tiles_m, kTilesN, kColumns};
  const MapElement element = kFp8 ? MapElement::e4m3 : MapElement::bf16;
  encode_tensor_map(op->a, a.get(), rows_a, kK, element);
  encode_tensor_map(op->b, b.get(), rows_b, kK, element);
  DeviceArray<KernelError> error(1);
  error.zero();
  const GridBarrier barrier{nullptr, nullptr, error.get(), 2'000'000'000, {}, {}};  // a 2 s watchdog
  const auto kernel = fed_kernel<kFp8, kNarrow>;
  MOK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  report(
      shape.name, kColumns, kDepth, times,
      [&](bool) {
        kernel<<<sms, kThreads, kSmemBytes>>>(*op, barrier, sink, times.get());
        MOK_CUDA_CHECK(cudaGetLastError());
      },
      [&] {
        const KernelError e = error.download()[0];
        if (e.code != kNoError)
          throw std::runtime_error(std::string(shape.name) + ": a pipeline wait timed out (error " +
                                   std::to_string(e.code) + ", block " + std::to_string(e.detail) + ")");
      });
}

}  // namespace
}  // namespace mok::gpu

constexpr const char* kUsage = "usage: mok-fp8-chain [k_blocks >= 1, default 20000]\n";

int tool_main(int argc, char** argv) {
  using namespace mok::gpu;
  if (mok::printed_help(argc, argv, kUsage)) return 0;
  int k_blocks = 20000;  // parsed whole, before the GPU is looked for: atoi ran "5x" as 5
  if (argc > 2 || (argc > 1 && !(mok::tools::parse_int(argv[1], k_blocks) && k_blocks > 0))) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  if (!device_available()) {
    std::printf("mok-fp8-chain: no Hopper GPU, skipped\n");
    return 77;
  }
  try {
    int sms = 0;
    MOK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    DeviceArray<float> sink(1);
    DeviceArray<ConsumerTime> times(size_t(sms) * kConsumers);
    std::printf("mok-fp8-chain: %d SMs, %d K-blocks of %d per consumer, a consumer's tile 64 x %d (n128: 64 x 128)\n",
                sms, k_blocks, mok::kFp8Block, kTileN);
    run<Variant::chain>(k_blocks, sms, sink.get(), times);
    run<Variant::tensor_only>(k_blocks, sms, sink.get(), times);
    run<Variant::one_consumer>(k_blocks, sms, sink.get(), times);
    run<Variant::n128>(k_blocks, sms, sink.get(), times);
    run_fed<true>({"fed-ones", 1, 128, false}, sms, sink.get(), times);
    run_fed<true>({"fed-random", 1, 128, true}, sms, sink.get(), times);
    run_fed<true>({"fed-kimi-k2", 32, 16, true}, sms, sink.get(), times);
    run_fed<false>({"fed-kimi-k2-bf16", 32, 16, true}, sms, sink.get(), times);
    run_fed<true, true>({"fed-kimi-k2-n128", 32, 16, true}, sms, sink.get(), times);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mok-fp8-chain: %s\n", e.what());
    return 2;
  }
  return 0;
}

// A report lost to a full disk or a closed pipe is no success.
int main(int argc, char** argv) { return mok::tool_exit_status("mok-fp8-chain", tool_main(argc, argv)); }
