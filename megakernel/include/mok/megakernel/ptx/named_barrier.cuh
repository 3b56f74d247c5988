// Thin wrappers of the named barriers (16 per block; barrier 0 is __syncthreads). Ids and thread
// counts are immediates, so ptxas reserves only the barriers a kernel names.
#pragma once

#include <cstdint>

namespace mok::gpu::ptx {

// The warps wait at barrier kId until kCount threads arrived; aligned: every thread of a warp
// executes this same instruction.
template <int kId, int kCount>
__device__ __forceinline__ void bar_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kCount) : "memory");
}

// The same wait, not aligned: the threads may reach the barrier from different instructions.
template <int kId, int kCount>
__device__ __forceinline__ void barrier_sync() {
  asm volatile("barrier.sync %0, %1;\n" ::"n"(kId), "n"(kCount) : "memory");
}

// Arrives at barrier kId without waiting (the waiters' bar_sync completes it).
template <int kId, int kCount>
__device__ __forceinline__ void bar_arrive() {
  asm volatile("bar.arrive %0, %1;\n" ::"n"(kId), "n"(kCount) : "memory");
}

// bar_sync, and true when `v` holds in every arriving thread (bar.red.and).
template <int kId, int kCount>
__device__ __forceinline__ bool bar_red_and(bool v) {
  uint32_t all;
  asm volatile(
      "{\n"
      ".reg .pred p, q;\n"
      "setp.ne.u32 p, %1, 0;\n"
      "bar.red.and.pred q, %2, %3, p;\n"
      "selp.u32 %0, 1, 0, q;\n"
      "}\n"
      : "=r"(all)
      : "r"(uint32_t(v)), "n"(kId), "n"(kCount)
      : "memory");
  return all != 0;
}

}  // namespace mok::gpu::ptx
