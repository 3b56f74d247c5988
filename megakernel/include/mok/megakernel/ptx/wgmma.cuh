// Thin wrappers of Hopper's warpgroup matrix instruction (sm_90a), operands in shared memory.
//   wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16: D(64x8) = A(64x16) B(16x8) + D, issued by
//   the 128 threads of a warpgroup; one K-step of mok/core/kstep.h per output element.
// Shared-memory operands in the canonical K-major layout without swizzle: 8x8 bf16 "core matrices"
// of 128 contiguous bytes (8 rows of 16 bytes); the descriptor gives the byte distance between core
// matrices along K (leading, LBO) and along M/N (stride, SBO).
// Accumulator fragment, thread t = 32 w + 4 g + q: D[16w + g][2q..2q+1], D[16w + g + 8][2q..2q+1].
#pragma once

#include <cstdint>

namespace mok::gpu::ptx {

__device__ __forceinline__ uint64_t smem_descriptor(const void* smem, uint32_t leading_bytes, uint32_t stride_bytes) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return uint64_t((addr & 0x3ffffu) >> 4) | (uint64_t(leading_bytes >> 4) << 16) | (uint64_t(stride_bytes >> 4) << 32);
}

// Ordinary stores to shared memory become visible to the tensor cores' (async) proxy.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

// d += A B (scale-d = 1: the registers' values are the accumulator C).
__device__ __forceinline__ void wgmma_bf16_m64n8k16(float (&d)[4], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(desc_a), "l"(desc_b), "r"(1)
      : "memory");
}

}  // namespace mok::gpu::ptx
