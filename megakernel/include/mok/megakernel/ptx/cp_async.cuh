// Thin wrappers of the per-thread asynchronous copies into shared memory (cp.async, sm_80 on): a
// thread's copies of 16 bytes each, grouped, waited for by group.
#pragma once

#include <cstdint>

namespace mok::gpu::ptx {

// 16 bytes from global into shared memory (both 16-byte aligned), cached in L2 only; part of this
// thread's open group (cp_async_commit closes it).
__device__ __forceinline__ void cp_async_16(void* smem, const void* global) {
  asm volatile(
      "cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem))),
      "l"(global)
      : "memory");
}

// Closes this thread's open group of copies.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most kPending of this thread's groups are still in flight; the others' bytes have
// landed and are visible to this thread.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace mok::gpu::ptx
