// Thin wrapper of the L2 prefetch hint.
#pragma once

namespace mok::gpu::ptx {

// Asks L2 to bring the line holding p from memory now; a hint, so it changes no value. A host build (the
// block emulation of megakernel/tests) makes it a no-op.
__device__ __forceinline__ void prefetch_l2(const void* p) {
#ifdef __CUDA_ARCH__
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}

}  // namespace mok::gpu::ptx
