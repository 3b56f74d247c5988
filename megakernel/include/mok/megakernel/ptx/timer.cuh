// Thin wrapper of the global timer: nanoseconds, one clock for every SM of a GPU.
#pragma once

namespace mok::gpu::ptx {

// %globaltimer, in ns: the watchdog's clock and the phase stamps.
__device__ __forceinline__ long long global_timer_ns() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace mok::gpu::ptx
