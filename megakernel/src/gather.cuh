// Across GPUs: the gathers that fill this GPU's global-order views of per-token buffers with the
// other GPUs' tokens, read from their ranks' buffers (peer pointers in Params::rank).
#pragma once

#include "row_copy.cuh"
#include "schedule.cuh"

namespace mok::gpu {

// The other GPUs' tokens' rows of a per-token [N, H] buffer, copied from their ranks' buffers
// (`source(rank)`) into this GPU's global view.
template <class Source>
__device__ void gather_token_rows(const Params& p, bf16* view, Source source) {
  const int H = p.c.hidden;
  for (long g = warp_id(); g < p.c.tokens(); g += warp_count()) {
    const int r = token_rank(p, int(g));
    if (!executes(p, r)) copy_row(view + g * H, source(r) + long(token_local(p, int(g))) * H, H);
  }
}

// The same for a small per-token [N, width] buffer, element by element.
template <class T, class Source>
__device__ void gather_token_values(const Params& p, T* view, int width, Source source) {
  const long per_rank = long(p.c.tokens_per_rank) * width;
  for (long i = thread_id(); i < p.c.tokens() * long(width); i += thread_count()) {
    const int r = int(i / per_rank);
    if (!executes(p, r)) view[i] = source(r)[i % per_rank];
  }
}

}  // namespace mok::gpu
