// Does racecheck see the ordering an mbarrier gives? The megakernel's fp8 chain hands B's scale
// exponents from the producer thread to the consumers through shared memory (GemmSmem::b_exps): the
// producer waits for the stage's empty barrier, stores, arrives on its full barrier; each consumer warp
// waits on full (try_wait.parity), reads, meets at __syncwarp and its lane 0 arrives on empty. Correct
// under PTX's memory model (the arrive releases, the wait acquires). This probe is that hand-over alone,
// with the megakernel's own wrappers (mok/megakernel/ptx/tma.cuh), one block of three warpgroups.
//   mbarrier_probe <mode> <rounds>: mode bits: 1 each consumer warpgroup passes a named barrier of its
//   own id every four rounds (as the epilogue's warpgroup_sync: uneven named barriers); 2 the producer
//   arrives with arrive.expect_tx (0 bytes), as produce() does, instead of a plain arrive; 4 every
//   consumer thread arrives on the empty barrier (256 arrivals) instead of each warp's lane 0 after the
//   warp's __syncwarp (8).
// Prints whether every consumer thread read every round's words.
#include <cstdio>
#include <cstdlib>
#include <mok/megakernel/ptx/tma.cuh>

namespace ptx = mok::gpu::ptx;
constexpr int kStages = 4, kConsumerWarps = 8;

__global__ void __launch_bounds__(384, 1) probe(int mode, int rounds, long long* out) {
  __shared__ uint64_t full[kStages], empty[kStages];
  __shared__ int2 words[kStages];
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(&full[s], 1);
      ptx::mbarrier_init(&empty[s], mode & 4 ? 32 * kConsumerWarps : kConsumerWarps);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();
  const int wg = __shfl_sync(~0u, int(threadIdx.x) / 128, 0);
  if (wg == 0) {
    if (threadIdx.x != 0) return;
    for (int j = 0; j < rounds; ++j) {
      const int s = j % kStages;
      while (!ptx::mbarrier_try_wait(&empty[s], (j / kStages & 1) ^ 1u)) {
      }
      words[s] = int2{j, 2 * j};
      if (mode & 2)
        ptx::mbarrier_arrive_expect_tx(&full[s], 0);
      else
        ptx::mbarrier_arrive(&full[s]);
    }
    return;
  }
  long long sum = 0;
  for (int j = 0; j < rounds; ++j) {
    const int s = j % kStages;
    while (!ptx::mbarrier_try_wait(&full[s], j / kStages & 1)) {
    }
    __syncwarp();
    const int2 w = words[s];
    sum += w.x + w.y;
    __syncwarp();
    ptx::mbarrier_arrive_if(&empty[s], (mode & 4) || threadIdx.x % 32 == 0);
    if ((mode & 1) && j % 4 == 3) {
      if (wg == 1)
        asm volatile("bar.sync 1, 128;\n" ::: "memory");
      else
        asm volatile("bar.sync 2, 128;\n" ::: "memory");
    }
  }
  out[threadIdx.x] = sum;
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? std::atoi(argv[1]) : 0, rounds = argc > 2 ? std::atoi(argv[2]) : 16;
  long long* out = nullptr;
  if (cudaMalloc(&out, 384 * sizeof(long long)) != cudaSuccess) return 2;
  probe<<<1, 384>>>(mode, rounds, out);
  long long host[384];
  const cudaError_t e = cudaMemcpy(host, out, sizeof host, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    std::printf("mode %d rounds %d: %s\n", mode, rounds, cudaGetErrorString(e));
    return 1;
  }
  const long long want = 3LL * rounds * (rounds - 1) / 2;
  int wrong = 0;
  for (int t = 128; t < 384; ++t) wrong += host[t] != want;
  std::printf("mode %d rounds %d: %d of 256 consumer threads read wrong words\n", mode, rounds, wrong);
  return wrong != 0;
}
