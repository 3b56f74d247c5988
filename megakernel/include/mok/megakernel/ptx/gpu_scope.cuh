// Thin wrappers of GPU-scope counter accesses: a count that one SM's warps raise as their stores land
// and another SM's thread waits on before it reads them.
#pragma once

namespace mok::gpu::ptx {

// Adds v; every write of this thread before it (and, after a warp barrier, of its warp) is visible to
// a GPU-scope acquire that reads the sum.
__device__ __forceinline__ void add_release_gpu(unsigned int* counter, unsigned int v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(counter), "r"(v) : "memory");
}

// Loads the counter; what the releasing threads wrote before their adds is visible to this thread's
// later reads.
__device__ __forceinline__ unsigned int load_acquire_gpu(const unsigned int* counter) {
  unsigned int v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
  return v;
}

}  // namespace mok::gpu::ptx
