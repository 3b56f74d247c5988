// The router phases' per-token scratch (scores, the selection's keys and flags, d scores: E entries each)
// in the GEMM stages, idle in those phases, instead of arrays in each thread's stack frame: the driver
// reserves a kernel's frame beyond 1 KiB for every thread the device can hold, so a frame of
// kMaxExperts-sized arrays (7 KB a thread) cost 1,604 MiB of device memory a process (docs/benchmarks.md,
// session 31).
#pragma once

#include "mok/core/config.h"
#include "schedule.cuh"
#include "tile_gemm.cuh"

namespace mok::gpu {

// The most scratch a token takes: the forward's three float and two bool arrays of up to E entries.
inline constexpr int kMaxRouterScratch = 4 * 3 * kMaxExperts + 2 * kMaxExperts;
static_assert(4 * (kMaxRouterScratch / 4 + 1) <= sizeof(GemmSmem::stage), "the stages hold one thread's scratch");

// body(g, scratch) for each token g of this GPU, scratch being `bytes` (at most kMaxRouterScratch) of the
// calling thread's own in the stages. As many threads of each block take part as the stages hold (27 at
// the most scratch); their scratch lies an odd number of words apart, so the same element of a warp's
// threads falls in distinct banks. Every thread of the block must call it: the block meets first (after
// a GEMM phase the stages are free once every thread is past it); after an error none runs.
template <class Body>
__device__ void for_own_tokens_with_scratch(Pipeline& pipe, const Params& p, int bytes, Body body) {
  const int stride = 4 * ((bytes + 3) / 4 | 1);
  const int threads = min(int(kThreads), int(sizeof(pipe.smem->stage) / stride));
  if (__syncthreads_or(error_recorded(p.barrier)) || threadIdx.x >= threads) return;
  uint8_t* const scratch = &pipe.smem->stage[0][0] + long(threadIdx.x) * stride;
  for (long g = own_token_begin(p) + long(blockIdx.x) * threads + threadIdx.x; g < own_token_end(p);
       g += long(gridDim.x) * threads)
    body(g, scratch);
  ptx::fence_async_shared();  // these generic writes come before the next GEMM's TMA writes to the stages
}

}  // namespace mok::gpu
