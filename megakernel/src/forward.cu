// The persistent forward kernel: router, dispatch layout, then ring cycles of pull dispatch,
// GEMM1 + SwiGLU and GEMM2 + push combine, and the slot-ordered combine on the source ranks.
// Phases are separated by the watchdog grid barrier; every reduction is in the order of the shared
// core code, so the bits equal the CPU reference's (docs/architecture.md, docs/numerics.md).
#include "kernels.cuh"
#include "mok/core/combine.h"
#include "mok/core/fma_chain.h"
#include "mok/core/routing.h"
#include "mok/core/swiglu.h"

namespace mok::gpu {
namespace {

__device__ void router_logits(const Params& p) {
  const int N = p.c.tokens(), E = p.c.experts, H = p.c.hidden;
  for (long i = thread_id(); i < long(N) * E; i += thread_count()) {
    const bf16* x = p.x + (i / E) * H;
    const float* w = p.router_w + (i % E) * H;
    const float logit = fma_chain(
        H, [&](int h) { return to_float(x[h]); }, [&](int h) { return w[h]; });
    p.logits[i] = logit;
    if (logit - logit != 0.0f) record_error(p.barrier, kLogitOverflow, kRouterLogits, 0, int(i / E));
  }
}

__device__ void router_select_tokens(const Params& p) {
  const int E = p.c.experts, k = p.c.top_k;
  float scores[kMaxExperts], key[kMaxExperts];
  bool allowed[kMaxExperts];
  for (long g = thread_id(); g < p.c.tokens(); g += thread_count()) {
    router_scores(p.c, p.logits + g * E, scores);
    router_select(p.c, scores, p.expert_bias, key, allowed, p.topk_idx + g * k);
    router_weights(p.c, scores, p.topk_idx + g * k, p.topk_w + g * k);
  }
}

__device__ void layout_count(const Params& p) {
  for (long ch = thread_id(); ch < layout_chunks(p.c.tokens()); ch += thread_count())
    count_chunk(p.topk_idx, p.c.top_k, int(ch), p.c.tokens(), p.c.experts, p.chunk_counts + ch * p.c.experts);
}

__device__ void layout_scan(const Params& p) {
  if (thread_id() != 0) return;
  const int E = p.c.experts;
  scan_chunks(p.chunk_counts, layout_chunks(p.c.tokens()), E, p.chunk_base, p.offsets);
  p.tile_offsets[0] = 0;
  for (int e = 0; e < E; ++e)
    p.tile_offsets[e + 1] = p.tile_offsets[e] + (p.offsets[e + 1] - p.offsets[e] + kTileRows - 1) / kTileRows;
}

__device__ void layout_place(const Params& p) {
  for (long ch = thread_id(); ch < layout_chunks(p.c.tokens()); ch += thread_count())
    place_chunk(p.topk_idx, p.c.top_k, int(ch), p.c.tokens(), p.chunk_base + ch * p.c.experts, p.row_source,
                p.slot_row);
}

// h = bf16(A W1^T) for a 16-row tile, kTileCols gate and the matching up columns (one chain: each A
// fragment serves both), then a = bf16(swiglu(h)). rows(m) gives A's row m (nullptr past the valid
// rows); out_first is the layout/token row of row 0.
template <class Rows>
__device__ void swiglu_up_tile(const Params& p, Rows rows, int valid, int n0, const bf16* w1, int inter, bf16* h,
                               bf16* a, long out_first) {
  const int H = p.c.hidden;
  ptx::FragC acc[2 * kColBlocks] = {};  // gate blocks, then up blocks
  mma_chain(
      acc, 0, H, [&](int m, int k) { return rows(m) ? contiguous_pair(rows(m), k) : 0u; },
      [&](int k, int n) {
        const int w_row = n < kTileCols ? n0 + n : inter + n0 + n - kTileCols;
        return contiguous_pair(w1 + long(w_row) * H, k);
      });
  const LaneCoord l;
#pragma unroll
  for (int j = 0; j < kColBlocks; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (l.row(i) >= valid) continue;
      const long row = out_first + l.row(i);
      const int col = n0 + 8 * j + l.col(i);
      const bf16 hg = to_bf16(acc[j].v[i]), hu = to_bf16(acc[kColBlocks + j].v[i]);
      h[row * 2 * inter + col] = hg;
      h[row * 2 * inter + inter + col] = hu;
      a[row * inter + col] = to_bf16(swiglu(to_float(hg), to_float(hu), p.c.swiglu_limit));
    }
}

__device__ void shared_up(const Params& p) {
  const int N = p.c.tokens(), Is = p.c.shared_intermediate, H = p.c.hidden;
  for_each_token_tile(p, Is, [&](int first, int n0) {
    const auto rows = [&](int m) { return first + m < N ? p.x + long(first + m) * H : nullptr; };
    swiglu_up_tile(p, rows, min(kTileRows, N - first), n0, p.shared_w1, Is, p.shared_h, p.shared_a, first);
  });
}

// GEMM1 + SwiGLU on the rows in the rings: items (rank, ring tile, kTileCols columns of I).
__device__ void expert_up(const Params& p, int cycle) {
  const int I = p.c.intermediate, H = p.c.hidden;
  for_each_ring_tile(p, cycle, I, [&](int r, int slot, int n0, const ExpertTile& t) {
    const bf16* ring = p.rank[r].ring + long(slot) * kTileRows * H;
    const auto rows = [&](int m) { return ring + long(m) * H; };  // padding rows are zero in the ring
    swiglu_up_tile(p, rows, t.rows, n0, p.w1 + long(t.expert) * 2 * I * H, I, p.h, p.a, t.first_row);
  });
}

// GEMM2 and push combine: y_j = bf16(a W2^T) into the source rank's (token, slot) buffer.
__device__ void expert_down(const Params& p, int cycle) {
  const int I = p.c.intermediate, H = p.c.hidden;
  for_each_ring_tile(p, cycle, H, [&](int, int, int n0, const ExpertTile& t) {
    const bf16* w2 = p.w2 + long(t.expert) * H * I;
    ptx::FragC acc[kColBlocks] = {};
    mma_chain(
        acc, 0, I,
        [&](int m, int kk) { return m < t.rows ? contiguous_pair(p.a + long(t.first_row + m) * I, kk) : 0u; },
        [&](int kk, int n) { return contiguous_pair(w2 + long(n0 + n) * I, kk); });
    push_to_slots(p, t, n0, acc);
  });
}

__device__ void combine(const Params& p) {
  const int H = p.c.hidden, k = p.c.top_k;
  for (long i = thread_id(); i < long(p.c.tokens()) * H; i += thread_count()) {
    const int g = int(i / H), col = int(i % H);
    const RankBuffers& rb = p.rank[token_rank(p, g)];
    const int t = token_local(p, g);
    const float shared = p.c.has_shared() ? to_float(p.shared_y[i]) : 0.0f;
    const bf16* slots = rb.slots + long(t) * k * H + col;
    p.y[i] = combine_y(k, shared, rb.topk_w + long(t) * k, [&](int j) { return slots[long(j) * H]; });
  }
}

}  // namespace

__global__ void __launch_bounds__(kThreads) forward_kernel(const __grid_constant__ Params p) {
  const GridBarrier& b = p.barrier;
  if (p.router) {
    router_logits(p);
    if (!grid_sync(b, kRouterLogits, 0)) return;
    router_select_tokens(p);
    if (!grid_sync(b, kRouterSelect, 0)) return;
  }
  layout_count(p);
  if (!grid_sync(b, kLayoutCount, 0)) return;
  layout_scan(p);
  if (!grid_sync(b, kLayoutScan, 0)) return;
  layout_place(p);
  if (p.c.has_shared()) shared_up(p);
  if (!grid_sync(b, kLayoutPlace, 0)) return;
  if (p.c.has_shared()) token_gemm_bf16(p, p.shared_a, p.c.shared_intermediate, p.shared_w2, p.c.hidden, p.shared_y);
  const int cycles = ring_cycles(p);
  for (int cycle = 0; cycle < cycles; ++cycle) {
    pull_into_rings(p, cycle, [&](int r) { return p.rank[r].x; });
    if (!grid_sync(b, kPull, cycle)) return;
    expert_up(p, cycle);
    if (!grid_sync(b, kExpertUp, cycle)) return;
    expert_down(p, cycle);
    if (!grid_sync(b, kExpertDown, cycle)) return;
  }
  combine(p);
}

}  // namespace mok::gpu
