// A stand-in for megakernel/src/tile_gemm.cuh with which a block-level device header runs on the host
// (chain_gemm_emulation_test.cpp, layout_scan_emulation_test.cpp): CUDA's builtins for one block's threads as
// std::threads,
// __syncthreads as a std::barrier, the GEMM stages as host memory (the build defines __host__, __device__
// and __forceinline__ away, for every header the one under test includes, and __shared__ as static: one
// variable for the block's threads, as blocks run one after another). The build copies the header under
// test beside this file, so that its #include "tile_gemm.cuh" finds this one.
#pragma once

#include <atomic>
#include <barrier>
#include <cstdint>
#include <thread>
#include <vector>

struct Dim3 {
  unsigned x = 0;
};
inline thread_local Dim3 threadIdx;
inline Dim3 blockIdx, gridDim;
struct float4 {
  float x, y, z, w;
};
struct int2 {
  int x, y;
};
struct int4 {
  int x, y, z, w;
};

namespace mok::gpu::emulation {
inline std::barrier<>* block_barrier = nullptr;  // the running block's
}  // namespace mok::gpu::emulation
inline void __syncthreads() { mok::gpu::emulation::block_barrier->arrive_and_wait(); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }

#include "gemm_geometry.cuh"

namespace mok::gpu::emulation {

// body() on each of a block's kThreads threads, for each of `blocks` blocks, one block after another.
template <class Body>
void run_blocks(int blocks, Body body) {
  gridDim.x = unsigned(blocks);
  for (int b = 0; b < blocks; ++b) {
    blockIdx.x = unsigned(b);
    std::barrier<> barrier(kThreads);
    block_barrier = &barrier;
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&body, t] {
        threadIdx.x = unsigned(t);
        body();
      });
  }
}

}  // namespace mok::gpu::emulation

namespace mok::gpu {

struct Pipeline {
  GemmSmem* smem;
};

namespace ptx {
inline void fence_async_shared() {}  // one block's threads on the host share one memory model
}  // namespace ptx

}  // namespace mok::gpu
