// A grid-wide barrier for the persistent kernels (launched cooperatively, so every block is
// resident), with a watchdog: a block that waits past the timeout records who waited where and
// every block leaves instead of hanging. Returns false once any error is recorded.
// Global stores before the barrier are visible after it to ordinary loads and to TMA copies.
#pragma once

#include "mok/megakernel/ptx/tma.cuh"
#include "params.cuh"

namespace mok::gpu {

__device__ __forceinline__ long long global_ns() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void record_error(const GridBarrier& b, int code, int phase, int cycle, int detail) {
  if (atomicCAS(&b.error->code, kNoError, code) == kNoError) {
    b.error->phase = phase;
    b.error->cycle = cycle;
    b.error->detail = detail;
    __threadfence();
  }
}

__device__ __forceinline__ bool error_recorded(const GridBarrier& b) {
  return *reinterpret_cast<volatile int*>(&b.error->code) != kNoError;
}

// Block 0's stamp (see PhaseClock); one writer, so a plain counter.
__device__ inline void stamp_phase(const GridBarrier& b, int phase) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const int i = *b.clock.count;
  if (i >= kClockEntries) return;
  b.clock.ns[i] = global_ns();
  b.clock.phase[i] = phase;
  *b.clock.count = i + 1;
}

__device__ inline bool grid_sync(const GridBarrier& b, int phase, int cycle) {
  ptx::fence_proxy_async_global();  // this phase's stores are visible to the next phase's TMA reads
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned int* generation = b.generation;
    const unsigned int seen = *generation;
    __threadfence();
    if (atomicAdd(b.arrived, 1u) == gridDim.x - 1) {
      *b.arrived = 0;
      __threadfence();
      atomicAdd(const_cast<unsigned int*>(generation), 1u);
    } else {
      const long long start = global_ns();
      while (*generation == seen) {
        if (error_recorded(b)) break;
        if (global_ns() - start > b.timeout_ns) {
          record_error(b, kBarrierTimeout, phase, cycle, int(blockIdx.x));
          break;
        }
        __nanosleep(64);
      }
    }
    __threadfence();
    stamp_phase(b, phase);
  }
  __syncthreads();
  return !error_recorded(b);
}

}  // namespace mok::gpu
