// Thin wrappers of system-scope flag accesses: a peer GPU's memory is reached over NVLink, so the
// barrier across GPUs orders its flags at .sys scope.
#pragma once

namespace mok::gpu::ptx {

// Stores v; every write of this thread before it is visible to a system-scope acquire that reads v.
__device__ __forceinline__ void store_release_sys(unsigned int* flag, unsigned int v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(flag), "r"(v) : "memory");
}

// Loads the flag; what the releasing thread wrote before it is visible to this thread's later reads.
__device__ __forceinline__ unsigned int load_acquire_sys(const unsigned int* flag) {
  unsigned int v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
  return v;
}

// The 64-bit words (the abort word of the barrier across GPUs).
__device__ __forceinline__ void store_release_sys(unsigned long long* word, unsigned long long v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(word), "l"(v) : "memory");
}

__device__ __forceinline__ unsigned long long load_acquire_sys(const unsigned long long* word) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(word) : "memory");
  return v;
}

}  // namespace mok::gpu::ptx
