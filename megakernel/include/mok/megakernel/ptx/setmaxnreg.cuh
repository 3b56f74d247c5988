// Thin wrappers of setmaxnreg (sm_90a): a warpgroup gives registers back to the block's pool or takes
// them from it. Warpgroup-aligned; the count is an immediate, a multiple of 8 in [24, 256].
#pragma once

namespace mok::gpu::ptx {

// Raises this warpgroup's registers per thread to kRegisters (waits until the pool holds them).
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// Lowers this warpgroup's registers per thread to kRegisters, releasing the rest to the pool.
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

}  // namespace mok::gpu::ptx
