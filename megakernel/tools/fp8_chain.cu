// mok-fp8-chain: the FP8 consumer's K-block chain alone, to find where its time goes (issue 19). Every
// SM runs one block shaped as the megakernel's (a producer warpgroup, here idle, and two consumer
// warpgroups at kConsumerRegisters); each consumer loops over one K-block's operands, resident in
// shared memory (no TMA, no pipeline waits, no epilogue), with the megakernel's own functions
// (fp8_half_block, fp8_half_done, promote of tile_gemm.cuh). Variants:
//   chain        the megakernel's chain: per half of B, four K-steps from +0, wait, promote;
//   tensor-only  both halves' K-steps accumulating across K-blocks in the tensor core, one group in
//                flight while the next is issued (bf16's pattern): the operands' peak rate here;
//   one-consumer the chain on consumer 0 alone: its latency without the other's K-steps;
//   n128         DeepGEMM's chain: a 64 x 128 consumer tile (half the products per K-block), one
//                group per K-block, waited, promoted into 64 totals.
// (Two partials with one group in flight while the other is promoted, which 64 totals would leave
// registers for, make ptxas serialize the wgmmas (C7514): the promotion reads accumulator registers
// while a group runs.)
// Prints per variant the consumer's cycles per K-block and the rate over all SMs (both consumers'
// products, or one's for one-consumer). Timing only: the operands are arbitrary E4M3 codes.
// Usage: mok-fp8-chain [k_blocks=20000]. Exit status: 0 ran, 2 error, 77 no GPU.
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "mok/megakernel/check.h"
#include "mok/megakernel/megakernel.h"
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
__device__ float consume(const uint8_t* st, Warpgroup consumer, int k_blocks, int s) {
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
__device__ float consume_n128(const uint8_t* st, Warpgroup consumer, int k_blocks, int s) {
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

template <Variant kVariant>
__global__ void __launch_bounds__(kThreads, 1) chain_kernel(int k_blocks, int s, float* sink, long long* cycles) {
  extern __shared__ uint8_t dynamic_smem[];
  uint8_t* st = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(dynamic_smem) + kSwizzleAlign - 1) &
                                           ~uintptr_t(kSwizzleAlign - 1));
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
  const long long start = clock64();
  constexpr Variant kChain = chain_of(kVariant);
  float v;
  if constexpr (tile_columns(kVariant) == kTileN)
    v = consume<kChain>(st, consumer, k_blocks, s);
  else
    v = consume_n128(st, consumer, k_blocks, s);
  const long long spent = clock64() - start;
  if (v == 12345.0f) *sink = v;  // never true for these operands: keeps the chain
  if (threadIdx.x % kWarpgroupThreads == 0) cycles[blockIdx.x * kConsumers + consumer_index(consumer)] = spent;
}

template <Variant kVariant>
void run(int k_blocks, int sms, float* sink, long long* cycles) {
  const auto kernel = chain_kernel<kVariant>;
  MOK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  cudaEvent_t begin, end;
  MOK_CUDA_CHECK(cudaEventCreate(&begin));
  MOK_CUDA_CHECK(cudaEventCreate(&end));
  MOK_CUDA_CHECK(cudaMemset(cycles, 0, sizeof(long long) * sms * kConsumers));
  kernel<<<sms, kThreads, kSmemBytes>>>(k_blocks / 10, 0, sink, cycles);  // warm-up
  MOK_CUDA_CHECK(cudaGetLastError());
  MOK_CUDA_CHECK(cudaEventRecord(begin));
  kernel<<<sms, kThreads, kSmemBytes>>>(k_blocks, 0, sink, cycles);
  MOK_CUDA_CHECK(cudaGetLastError());
  MOK_CUDA_CHECK(cudaEventRecord(end));
  MOK_CUDA_CHECK(cudaEventSynchronize(end));
  float ms = 0;
  MOK_CUDA_CHECK(cudaEventElapsedTime(&ms, begin, end));
  std::vector<long long> host(size_t(sms) * kConsumers);
  MOK_CUDA_CHECK(cudaMemcpy(host.data(), cycles, sizeof(long long) * host.size(), cudaMemcpyDeviceToHost));
  long long total = 0;
  int counted = 0;
  for (const long long c : host)
    if (c > 0) total += c, ++counted;
  if (counted == 0)
    throw std::runtime_error(std::string(kVariantNames[int(kVariant)]) + ": no consumer recorded its cycles");
  const double flops = 2.0 * kWgmmaM * tile_columns(kVariant) * kFp8Block * double(k_blocks) * counted;
  std::printf("%-13s %8.1f cycles per K-block per consumer  %7.1f TFLOP/s  (%.3f ms, %d consumers)\n",
              kVariantNames[int(kVariant)], double(total) / counted / k_blocks, flops / ms / 1e9, ms, counted);
  MOK_CUDA_CHECK(cudaEventDestroy(begin));
  MOK_CUDA_CHECK(cudaEventDestroy(end));
}

}  // namespace
}  // namespace mok::gpu

int main(int argc, char** argv) {
  using namespace mok::gpu;
  if (!device_available()) {
    std::printf("mok-fp8-chain: no Hopper GPU, skipped\n");
    return 77;
  }
  const int k_blocks = argc > 1 ? std::atoi(argv[1]) : 20000;
  if (k_blocks <= 0) {
    std::fprintf(stderr, "mok-fp8-chain: k_blocks must be positive, got '%s'\n", argv[1]);
    return 2;
  }
  try {
    int sms = 0;
    MOK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    float* sink;
    long long* cycles;
    MOK_CUDA_CHECK(cudaMalloc(&sink, sizeof(float)));
    MOK_CUDA_CHECK(cudaMalloc(&cycles, sizeof(long long) * sms * kConsumers));
    std::printf("mok-fp8-chain: %d SMs, %d K-blocks of %d per consumer, a consumer's tile 64 x %d (n128: 64 x 128)\n",
                sms, k_blocks, mok::kFp8Block, kTileN);
    run<Variant::chain>(k_blocks, sms, sink, cycles);
    run<Variant::tensor_only>(k_blocks, sms, sink, cycles);
    run<Variant::one_consumer>(k_blocks, sms, sink, cycles);
    run<Variant::n128>(k_blocks, sms, sink, cycles);
    MOK_CUDA_CHECK(cudaFree(sink));
    MOK_CUDA_CHECK(cudaFree(cycles));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mok-fp8-chain: %s\n", e.what());
    return 2;
  }
  return 0;
}
