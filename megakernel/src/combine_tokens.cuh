// The combines on the source ranks: each token's slot rows (y_j or dx_j, pushed by the expert ranks)
// summed in slot order, 8 columns per thread.
#pragma once

#include "row_copy.cuh"
#include "schedule.cuh"

namespace mok::gpu {

// The combine of 8 columns of an own token (vector i of [N, H/8]): start(i, acc) sets the 8 columns'
// sums, step(slot, value, acc) continues one column's sum over one slot, in slot order, and finish(i,
// token, acc) writes the vector. Eight slots' 16-byte vectors are loaded before they are summed: the
// loads are what the combine waits for.
template <class Start, class Step, class Finish>
__device__ __forceinline__ void combine_token_vector(const Params& p, long i, Start start, Step step, Finish finish) {
  constexpr int kBatch = 8;
  const int H = p.c.hidden, k = p.c.top_k, chunks = H / 8;
  const int g = int(i / chunks);
  const RankBuffers& rb = p.rank[token_rank(p, g)];
  const long t = token_local(p, g);
  const Bf16x8* slots = reinterpret_cast<const Bf16x8*>(rb.slots + t * k * H) + i % chunks;
  float acc[8];
  start(i, acc);
  for (int j0 = 0; j0 < k; j0 += kBatch) {
    Bf16x8 v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (j0 + j < k) v[j] = slots[long(j0 + j) * chunks];
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (j0 + j < k) {
#pragma unroll
        for (int col = 0; col < 8; ++col) acc[col] = step(rb, t, j0 + j, v[j].e[col], acc[col]);
      }
  }
  finish(i, g, acc);
}

// combine_token_vector for each of this GPU's tokens and 8 columns, a thread each.
template <class Start, class Step, class Finish>
__device__ void combine_tokens(const Params& p, Start start, Step step, Finish finish) {
  const int chunks = p.c.hidden / 8;
  for (long i = own_token_begin(p) * chunks + thread_id(); i < own_token_end(p) * chunks; i += thread_count())
    combine_token_vector(p, i, start, step, finish);
}

// Vector i of [N, H/8] (an own token's) in the caller's per-token [N/G, H] tensors (y, dx), which
// hold this GPU's tokens only.
__device__ __forceinline__ long own_vector(const Params& p, long i) {
  return i - own_token_begin(p) * (p.c.hidden / 8);
}

// The 8 columns' starting sums: the shared expert's vector i of `shared` ([S, H] bf16 from this GPU's
// first token, Params::shared_tokens), or +0.
__device__ __forceinline__ void start_from_shared(const Params& p, const bf16* shared, long i, float (&acc)[8]) {
  const Bf16x8 s = p.c.has_shared() ? reinterpret_cast<const Bf16x8*>(shared)[own_vector(p, i)] : Bf16x8{};
#pragma unroll
  for (int col = 0; col < 8; ++col) acc[col] = to_float(s.e[col]);
}

}  // namespace mok::gpu
