// Thin wrappers of Hopper's warpgroup matrix instruction (sm_90a), operands in shared memory.
//   wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16: D(64xN) = A(64x16) B(16xN) + D, issued by
//   the 128 threads of a warpgroup; one K-step of mok/core/kstep.h per output element.
// m64n8k16 on the unswizzled layout (the model's validation probe); m64n256k16 on the swizzled one
// (the megakernel). FP8: wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 (the FP8 model's probe) and
// m64n128k32 (the megakernel's FP8 GEMM; probed too, on the unswizzled layout).
// Shared-memory operands in the canonical K-major layout without swizzle: 8x8 bf16 "core matrices"
// of 128 contiguous bytes (8 rows of 16 bytes); the descriptor gives the byte distance between core
// matrices along K (leading, LBO) and along M/N (stride, SBO).
// Accumulator fragment, thread t = 32 w + 4 g + q: D[16w + g][2q..2q+1], D[16w + g + 8][2q..2q+1].
#pragma once

#include <cstdint>

namespace mok::gpu::ptx {

// The descriptor of an operand in the unswizzled K-major layout above.
__device__ __forceinline__ uint64_t smem_descriptor(const void* smem, uint32_t leading_bytes, uint32_t stride_bytes) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return uint64_t((addr & 0x3ffffu) >> 4) | (uint64_t(leading_bytes >> 4) << 16) | (uint64_t(stride_bytes >> 4) << 32);
}

// Ordinary stores to shared memory become visible to the tensor cores' (async) proxy.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Orders the warpgroup's earlier accesses to the accumulators and operands before the next wgmma.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// Closes the wgmma operations issued since the last commit into one group (see wgmma_wait).
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most `kPending` committed groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Pins accumulator registers: the compiler may not move their reads or writes across this point (an
// in-flight wgmma group owns them). An empty asm: no instruction.
template <int kCount>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The m64n8 forms' one body: `instruction` on D's four registers (the fragment above, the accumulator C
// in, scale-d = 1 through predicate p) and the two descriptors, then its immediates after scale-d.
#define MOK_WGMMA_M64N8(instruction, immediates, d, desc_a, desc_b)                     \
  asm volatile(                                                                         \
      "{\n"                                                                             \
      ".reg .pred p;\n"                                                                 \
      "setp.ne.b32 p, %6, 0;\n" instruction " {%0, %1, %2, %3}, %4, %5, p, " immediates \
      ";\n"                                                                             \
      "}\n"                                                                             \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                  \
      : "l"(desc_a), "l"(desc_b), "r"(1)                                                \
      : "memory")

// d += A B (scale-d = 1: the registers' values are the accumulator C); imm-scale-a/b 1, K-major A and B.
__device__ __forceinline__ void wgmma_bf16_m64n8k16(float (&d)[4], uint64_t desc_a, uint64_t desc_b) {
  MOK_WGMMA_M64N8("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16", "1, 1, 0, 0", d, desc_a, desc_b);
}

// d += A B for FP8 E4M3 (scale-d = 1): wgmma.mma_async m64n8k32.f32.e4m3.e4m3, A 64x32 and B 32x8 from
// shared memory, both K-major (the FP8 forms have no transpose: imm-scale-a/b only). A core matrix is still
// 8 rows of 16 bytes, here 16 E4M3 along K, so the unswizzled descriptors of m64n8k16 (LBO 128, SBO 256)
// describe the 64x32-byte A and 8x32-byte B alike; the accumulator fragment is m64n8k16's. One FP8 K-step
// of 32 per output element (mok/core/fp8_dot.h, the model under validation: mok-tc-validate ... wgmma-e4m3).
__device__ __forceinline__ void wgmma_e4m3_m64n8k32(float (&d)[4], uint64_t desc_a, uint64_t desc_b) {
  MOK_WGMMA_M64N8("wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3", "1, 1", d, desc_a, desc_b);
}

#undef MOK_WGMMA_M64N8

// The canonical layouts with the 128-byte swizzle, as the TMA writes them (CU_TENSOR_MAP_SWIZZLE_128B):
// rows of 64 bf16 (128 bytes), 16-byte chunks XOR-permuted by (row % 8), the tile 1024-byte aligned.
//   K-major (rows along M/N, 64 K per row): 8-row groups 1024 bytes apart (stride, SBO); the K-step
//     k of the tile starts 32 k bytes in.
//   MN-major (rows along K, 64 M/N per row): 8 K-rows form one 1024-byte group (SBO again), the
//     next 64 M/N columns start `leading_bytes` later (LBO); the K-step k starts 2048 k bytes in.
__device__ __forceinline__ uint64_t smem_descriptor_sw128(const void* smem, uint32_t leading_bytes = 0) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return uint64_t((addr & 0x3ffffu) >> 4) | (uint64_t(leading_bytes >> 4) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

// The accumulator operands of the wide forms' inline asm: `c` (the constraint, "+f") on d[i] .. d[i + 63];
// and the matching placeholders of the first 64 and of the next 64.
#define MOK_WGMMA_D8(c, i) \
  c(d[i]), c(d[i + 1]), c(d[i + 2]), c(d[i + 3]), c(d[i + 4]), c(d[i + 5]), c(d[i + 6]), c(d[i + 7])
#define MOK_WGMMA_D64(c, i)                                                                     \
  MOK_WGMMA_D8(c, i), MOK_WGMMA_D8(c, i + 8), MOK_WGMMA_D8(c, i + 16), MOK_WGMMA_D8(c, i + 24), \
      MOK_WGMMA_D8(c, i + 32), MOK_WGMMA_D8(c, i + 40), MOK_WGMMA_D8(c, i + 48), MOK_WGMMA_D8(c, i + 56)
#define MOK_WGMMA_OPERANDS_0_63                                                      \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define MOK_WGMMA_OPERANDS_64_127                                                                \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "             \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "             \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

// d += A B for a 64x256 tile (scale-d = 1): A 64x16 and B 16x256 from shared memory, K-major unless
// kMnMajorA / kMnMajorB (then MN-major: the instruction's imm-trans-a, imm-trans-b). Thread
// t = 32 w + 4 g + q of the warpgroup holds d[i] = D[16 w + g + 8 ((i / 2) % 2)][8 (i / 4) + 2 q + i % 2].
template <int kMnMajorA = 0, int kMnMajorB = 0>
__device__ __forceinline__ void wgmma_bf16_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" MOK_WGMMA_OPERANDS_0_63 ", " MOK_WGMMA_OPERANDS_64_127
      "}, %128, %129, p, 1, 1, %131, %132;\n"
      "}\n"
      : MOK_WGMMA_D64("+f", 0), MOK_WGMMA_D64("+f", 64)
      : "l"(desc_a), "l"(desc_b), "r"(1), "n"(kMnMajorA), "n"(kMnMajorB)
      : "memory");
}

// d = A B + (accumulate ? d : 0) for FP8 E4M3 on a 64x128 tile: wgmma.mma_async m64n128k32.f32.e4m3.e4m3
// (accumulate is its scale-d), A 64x32 and B 32x128 from shared memory, both K-major (the FP8 forms have
// no transpose), on any layout the descriptors give (the megakernel's: 128-byte swizzle, one K-step = 32
// bytes along the row). Without accumulate the instruction ignores d's values (the asm still names them
// as inputs): a group's first K-step needs no zeroed registers. The fragment is m64n256k16's first 64
// accumulators: thread t = 32 w + 4 g + q holds d[i] = D[16 w + g + 8 ((i / 2) % 2)][8 (i / 4) + 2 q + i % 2].
__device__ __forceinline__ void wgmma_e4m3_m64n128k32(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                      bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {" MOK_WGMMA_OPERANDS_0_63
      "}, %64, %65, p, 1, 1;\n"
      "}\n"
      : MOK_WGMMA_D64("+f", 0)
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate))
      : "memory");
}

#undef MOK_WGMMA_OPERANDS_64_127
#undef MOK_WGMMA_OPERANDS_0_63
#undef MOK_WGMMA_D64
#undef MOK_WGMMA_D8

}  // namespace mok::gpu::ptx
