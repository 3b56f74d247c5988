// The forward's layout scan in one block (block 0 while the grid waits at the scan's barrier, so its
// time is the phase's): from each chunk's rows per expert, the experts' offsets and tile offsets and
// chunk_base, the values core's scan_chunks gives. Apart from the kernel's Params, so that the host
// runs it (layout_scan_emulation_test.cpp).
#pragma once

#include "mok/core/config.h"
#include "mok/core/dispatch_layout.h"
#include "mok/core/saved_layout.h"
#include "tile_gemm.cuh"

namespace mok::gpu {

// The chunks are cut into runs, a warp a run of 32 experts (a lane an expert): each run's rows
// (expert_rows), then in shared memory the experts' totals, offsets and tile counts, then each run's
// column of chunk_base from its first row (scan_expert). A thread per expert over all chunks took 2-4%
// of the small shapes' forward (docs/benchmarks.md, session 39). The stages are scratch: no copy is in
// flight. chunk_counts: [chunks, E]; offsets, tile_offsets: [E + 1]; chunk_base: [chunks, E].
__device__ inline void scan_layout_block(Pipeline& pipe, int E, int chunks, const int32_t* chunk_counts,
                                         int32_t* offsets_out, int32_t* tile_offsets_out, int32_t* chunk_base) {
  constexpr int kWarps = kThreads / 32;
  const int lane = int(threadIdx.x % 32), groups = (E + 31) / 32, runs = groups < kWarps ? kWarps / groups : 1;
  int32_t* const run_rows = reinterpret_cast<int32_t*>(&pipe.smem->stage[0][0]);  // [runs][E]
  int32_t* const offsets = run_rows + runs * E;                                   // [E + 1]
  int32_t* const tile_offsets = offsets + E + 1;                                  // [E + 1]
  // runs E <= 32 max(kWarps, groups) <= 32 kWarps + kMaxExperts
  static_assert(sizeof(int32_t) * (32 * kWarps + kMaxExperts + 2 * (kMaxExperts + 1)) <= sizeof(pipe.smem->stage));
  const auto for_each_run = [&](auto body) {  // body(run, expert, first chunk, end chunk)
    for (int job = int(threadIdx.x / 32); job < runs * groups; job += kWarps) {
      const int run = job / groups, e = 32 * (job % groups) + lane;
      if (e < E) body(run, e, chunks * run / runs, chunks * (run + 1) / runs);
    }
  };
  for_each_run(
      [&](int run, int e, int begin, int end) { run_rows[run * E + e] = expert_rows(chunk_counts, begin, end, E, e); });
  __syncthreads();
  for (int e = int(threadIdx.x); e < E; e += kThreads) {
    int32_t rows = 0;
    for (int run = 0; run < runs; ++run) rows += run_rows[run * E + e];
    offsets[e + 1] = rows;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    prefix_offsets(E, offsets);
    prefix_tile_offsets(E, offsets, tile_offsets);
  }
  __syncthreads();
  for (int e = int(threadIdx.x); e <= E; e += kThreads)
    offsets_out[e] = offsets[e], tile_offsets_out[e] = tile_offsets[e];
  for_each_run([&](int run, int e, int begin, int end) {
    int32_t first = offsets[e];
    for (int earlier = 0; earlier < run; ++earlier) first += run_rows[earlier * E + e];
    scan_expert(chunk_counts, begin, end, E, e, first, chunk_base);
  });
  __syncthreads();  // the outputs written, for the block's next reads
}

}  // namespace mok::gpu
