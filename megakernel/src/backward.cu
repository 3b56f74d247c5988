// The persistent backward kernel: ring cycles of pull reverse-combine (dy), g = dy W2, the fused
// router-weight gradient d topk_w = <g, a> with the SwiGLU backward, dx_j = dh W1 pushed back to
// the source ranks; then the weight gradients as K-step chains over each expert's rows in global
// token order, the shared expert, the router backward, and the slot-ordered dx combine.
#include "kernels.cuh"
#include "mok/core/combine.h"
#include "mok/core/fma_chain.h"
#include "mok/core/routing.h"
#include "mok/core/swiglu.h"

namespace mok::gpu {
namespace {

// g = dy W2 for ring rows: items (rank, ring tile, kTileCols columns of I); g kept in fp32 per layout row.
__device__ void expert_down_grad(const Params& p, int cycle) {
  const int I = p.c.intermediate, H = p.c.hidden;
  for_each_ring_tile(p, cycle, I, [&](int r, int slot, int n0, const ExpertTile& t) {
    const bf16* ring = p.rank[r].ring + long(slot) * kTileRows * H;
    const bf16* w2t = p.w2t + long(t.expert) * I * H;
    ptx::FragC acc[kColBlocks] = {};
    mma_chain(
        acc, 0, H, [&](int m, int k) { return contiguous_pair(ring + long(m) * H, k); },
        [&](int k, int n) { return contiguous_pair(w2t + long(n0 + n) * H, k); });
    store_tile(acc, [&](int row, int col, float v) {
      if (row < t.rows) p.g[long(t.first_row + row) * I + n0 + col] = v;
    });
  });
}

// Per ring row (one warp): d topk_w = <g, a> pushed to the source rank, dh = bf16(swiglu_grad(w g)),
// dye = bf16(w dy).
__device__ void expert_row_grad(const Params& p, int cycle) {
  const int I = p.c.intermediate, H = p.c.hidden, k = p.c.top_k;
  for (long item = warp_id(); item < long(p.c.ranks) * p.ring_rows; item += warp_count()) {
    const int r = int(item / p.ring_rows), q = int(item % p.ring_rows);
    const int tile = ring_tile(p, r, cycle, q / kTileRows);
    if (tile < 0) continue;
    const ExpertTile t = expert_tile(p, tile);
    if (q % kTileRows >= t.rows) continue;
    const long row = t.first_row + q % kTileRows;
    const SlotSource s = slot_source(p, int(row));
    const RankBuffers& src = p.rank[token_rank(p, s.token)];
    const long slot = long(token_local(p, s.token)) * k + s.slot;
    const float w = src.topk_w[slot];
    const float* g = p.g + row * I;
    const bf16* a = p.a + row * I;
    const bf16* h = p.h + row * 2 * I;
    if (lane_id() == 0)
      src.d_topk_w[slot] = fma_chain(
          I, [&](int i) { return g[i]; }, [&](int i) { return to_float(a[i]); });
    for (int i = lane_id(); i < I; i += 32) {
      const SwigluGrad d = swiglu_grad(to_float(h[i]), to_float(h[I + i]), w * g[i], p.c.swiglu_limit);
      p.dh[row * 2 * I + i] = to_bf16(d.gate);
      p.dh[row * 2 * I + I + i] = to_bf16(d.up);
    }
    const bf16* dy = p.rank[r].ring + long(q) * H;
    for (int col = lane_id(); col < H; col += 32) p.dye[row * H + col] = weighted_dy(w, dy[col]);
  }
}

// dx_j = bf16(dh W1), pushed into the source rank's (token, slot) buffer.
__device__ void expert_dx_push(const Params& p, int cycle) {
  const int I = p.c.intermediate, H = p.c.hidden;
  for_each_ring_tile(p, cycle, H, [&](int, int, int n0, const ExpertTile& t) {
    const bf16* w1t = p.w1t + long(t.expert) * H * 2 * I;
    ptx::FragC acc[kColBlocks] = {};
    mma_chain(
        acc, 0, 2 * I,
        [&](int m, int kk) { return m < t.rows ? contiguous_pair(p.dh + long(t.first_row + m) * 2 * I, kk) : 0u; },
        [&](int kk, int n) { return contiguous_pair(w1t + long(n0 + n) * 2 * I, kk); });
    push_to_slots(p, t, n0, acc);
  });
}

// out[M, N] = chain over K rows of A^T B: a_col(row, m) and b_col(row, n) read row `row` of the
// row-major operands; rows >= k_rows are zero (the last chunk's padding). Items: 16 x kTileCols tiles.
template <class ACol, class BCol>
__device__ void weight_grad(int m_total, int n_total, int k_rows, ACol a_col, BCol b_col, float* out, long item) {
  const int tiles_n = n_total / kTileCols;
  const int m0 = int(item / tiles_n) * kTileRows, n0 = int(item % tiles_n) * kTileCols;
  ptx::FragC acc[kColBlocks] = {};
  const int k_end = (k_rows + kTileRows - 1) / kTileRows * kTileRows;
  mma_chain(
      acc, 0, k_end,
      [&](int m, int k) {
        return ptx::pack_bf16(k < k_rows ? a_col(k, m0 + m).bits : 0, k + 1 < k_rows ? a_col(k + 1, m0 + m).bits : 0);
      },
      [&](int k, int n) {
        return ptx::pack_bf16(k < k_rows ? b_col(k, n0 + n).bits : 0, k + 1 < k_rows ? b_col(k + 1, n0 + n).bits : 0);
      });
  store_tile(acc, [&](int row, int col, float v) { out[long(m0 + row) * n_total + n0 + col] = v; });
}

// dW1_e = dh^T x and dW2_e = dye^T a over expert e's rows; dW1_s, dW2_s over all tokens.
__device__ void weight_grads(const Params& p) {
  const int I = p.c.intermediate, H = p.c.hidden, E = p.c.experts, Is = p.c.shared_intermediate, N = p.c.tokens();
  const long w1_items = long(2 * I / kTileRows) * (H / kTileCols), w2_items = long(H / kTileRows) * (I / kTileCols);
  const long s1_items = long(2 * Is / kTileRows) * (H / kTileCols), s2_items = long(H / kTileRows) * (Is / kTileCols);
  const long expert_items = E * (w1_items + w2_items);
  for (long item = warp_id(); item < expert_items + s1_items + s2_items; item += warp_count()) {
    if (item < expert_items) {
      const int e = int(item / (w1_items + w2_items));
      const long sub = item % (w1_items + w2_items);
      const int first = p.offsets[e], rows = p.offsets[e + 1] - first;
      const auto x_row = [&](int row) { return p.x + long(slot_source(p, first + row).token) * H; };
      if (sub < w1_items)
        weight_grad(
            2 * I, H, rows, [&](int row, int m) { return p.dh[long(first + row) * 2 * I + m]; },
            [&](int row, int n) { return x_row(row)[n]; }, p.d_w1 + long(e) * 2 * I * H, sub);
      else
        weight_grad(
            H, I, rows, [&](int row, int m) { return p.dye[long(first + row) * H + m]; },
            [&](int row, int n) { return p.a[long(first + row) * I + n]; }, p.d_w2 + long(e) * H * I, sub - w1_items);
    } else if (item < expert_items + s1_items) {
      weight_grad(
          2 * Is, H, N, [&](int g, int m) { return p.shared_dh[long(g) * 2 * Is + m]; },
          [&](int g, int n) { return p.x[long(g) * H + n]; }, p.d_shared_w1, item - expert_items);
    } else {
      weight_grad(
          H, Is, N, [&](int g, int m) { return p.dy[long(g) * H + m]; },
          [&](int g, int n) { return p.shared_a[long(g) * Is + n]; }, p.d_shared_w2, item - expert_items - s1_items);
    }
  }
}

// Shared expert: g_s = dy W2_s, then dh_s = bf16(swiglu_grad(g_s)) elementwise (weight 1).
__device__ void shared_down_grad(const Params& p) {
  const int N = p.c.tokens(), Is = p.c.shared_intermediate, H = p.c.hidden;
  for_each_token_tile(p, Is, [&](int first, int n0) {
    ptx::FragC acc[kColBlocks] = {};
    mma_chain(
        acc, 0, H, [&](int m, int k) { return first + m < N ? contiguous_pair(p.dy + long(first + m) * H, k) : 0u; },
        [&](int k, int n) { return contiguous_pair(p.shared_w2t + long(n0 + n) * H, k); });
    store_tile(acc, [&](int row, int tile_col, float g_value) {
      const long g = first + row;
      if (g >= N) return;
      const int col = n0 + tile_col;
      const bf16* h = p.shared_h + g * 2 * Is;
      const SwigluGrad d = swiglu_grad(to_float(h[col]), to_float(h[Is + col]), g_value, p.c.swiglu_limit);
      p.shared_dh[g * 2 * Is + col] = to_bf16(d.gate);
      p.shared_dh[g * 2 * Is + Is + col] = to_bf16(d.up);
    });
  });
}

__device__ void router_grad(const Params& p) {
  const int E = p.c.experts, k = p.c.top_k;
  float scores[kMaxExperts], d_scores[kMaxExperts];
  for (long g = thread_id(); g < p.c.tokens(); g += thread_count()) {
    const RankBuffers& rb = p.rank[token_rank(p, int(g))];
    router_scores(p.c, p.logits + g * E, scores);
    router_backward(p.c, scores, p.topk_idx + g * k, rb.d_topk_w + long(token_local(p, int(g))) * k, d_scores,
                    p.d_logits + g * E);
  }
}

// dWr[e, h] over global tokens, and dx = slots + shared + router share, per element.
__device__ void router_weight_grad_and_combine(const Params& p) {
  const int N = p.c.tokens(), E = p.c.experts, H = p.c.hidden, k = p.c.top_k;
  if (p.router)
    for (long i = thread_id(); i < long(E) * H; i += thread_count()) {
      const int e = int(i / H), col = int(i % H);
      p.d_router[i] = fma_chain(
          N, [&](int g) { return p.d_logits[long(g) * E + e]; },
          [&](int g) { return to_float(p.x[long(g) * H + col]); });
    }
  for (long i = thread_id(); i < long(N) * H; i += thread_count()) {
    const int g = int(i / H), col = int(i % H);
    const RankBuffers& rb = p.rank[token_rank(p, g)];
    const bf16* slots = rb.slots + long(token_local(p, g)) * k * H + col;
    const float router = p.router ? fma_chain(
                                        E, [&](int e) { return p.d_logits[long(g) * E + e]; },
                                        [&](int e) { return p.router_w[long(e) * H + col]; })
                                  : 0.0f;
    const float shared = p.c.has_shared() ? to_float(p.shared_y[i]) : 0.0f;
    p.dx[i] = combine_dx(
        k, shared, [&](int j) { return slots[long(j) * H]; }, router);
  }
}

}  // namespace

__global__ void __launch_bounds__(kThreads) backward_kernel(const __grid_constant__ Params p) {
  const GridBarrier& b = p.barrier;
  const int cycles = ring_cycles(p);
  for (int cycle = 0; cycle < cycles; ++cycle) {
    pull_into_rings(p, cycle, [&](int r) { return p.rank[r].dy; });
    if (!grid_sync(b, kPull, cycle)) return;
    expert_down_grad(p, cycle);
    if (!grid_sync(b, kDownGrad, cycle)) return;
    expert_row_grad(p, cycle);
    if (!grid_sync(b, kRowGrad, cycle)) return;
    expert_dx_push(p, cycle);
    if (!grid_sync(b, kDxPush, cycle)) return;
  }
  if (p.c.has_shared()) shared_down_grad(p);
  if (p.router) router_grad(p);
  if (!grid_sync(b, kRouterGrad, 0)) return;
  weight_grads(p);
  // Shared dx = bf16(dh_s W1_s), into shared_y (free in the backward).
  if (p.c.has_shared())
    token_gemm_bf16(p, p.shared_dh, 2 * p.c.shared_intermediate, p.shared_w1t, p.c.hidden, p.shared_y);
  if (!grid_sync(b, kWeightGrad, 0)) return;
  router_weight_grad_and_combine(p);
}

}  // namespace mok::gpu
