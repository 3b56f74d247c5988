// Across GPUs: the gathers that fill this GPU's views of per-token buffers with other GPUs' tokens,
// read from their ranks' buffers (peer pointers in Params::rank).
#pragma once

#include "row_copy.cuh"
#include "schedule.cuh"

namespace mok::gpu {

// The following GPUs' first tokens that this GPU's shared expert computes too (its last K-step reaches
// them: Params::shared_tokens), copied from their ranks' buffers (token_row of `input`) into this GPU's view
// of a per-token [S, H] buffer (row 0: its first token). One GPU: none.
__device__ inline void gather_next_rows(const Params& p, bf16* view, const bf16* RankBuffers::*input) {
  const int H = p.c.hidden;
  for (long g = own_token_end(p) + warp_id(); g < p.shared_tokens.end; g += warp_count())
    copy_row(view + (g - p.shared_tokens.begin) * H, token_row(p, int(g), input), H);
}

// The other GPUs' tokens' values of a small per-token [N, width] buffer, element by element, into this
// GPU's global view of it.
template <class T, class Source>
__device__ void gather_token_values(const Params& p, T* view, int width, Source source) {
  const long per_rank = long(p.c.tokens_per_rank) * width;
  for (long i = thread_id(); i < p.c.tokens() * long(width); i += thread_count()) {
    const int r = int(i / per_rank);
    if (!executes(p, r)) view[i] = source(r)[i % per_rank];
  }
}

}  // namespace mok::gpu
