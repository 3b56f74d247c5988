#include "mok/reference/layer.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>

#include "mok/core/combine.h"
#include "mok/core/dispatch_layout.h"
#include "mok/core/fma_chain.h"
#include "mok/core/routing.h"
#include "mok/core/swiglu.h"
#include "mok/core/validate.h"
#include "mok/reference/matmul.h"

namespace mok::ref {
namespace {

size_t at(long a, long b) { return size_t(a) * size_t(b); }

// One simulated rank's memory as the other ranks reach it through the rank table: its tokens'
// inputs (pulled by expert ranks) and the per-slot buffers that expert ranks push results into.
struct RankMemory {
  const bf16* x;                // [T, H]
  const bf16* dy;               // [T, H] (backward only)
  const float* topk_w;          // [T, k]
  std::vector<bf16> slots;      // [T, k, H]: y_j (forward) or dx_j (backward)
  std::vector<float> d_topk_w;  // [T, k] (backward only)
};

std::vector<RankMemory> rank_table(const LayerConfig& c, const bf16* x, const bf16* dy, const float* topk_w) {
  const int T = c.tokens_per_rank, H = c.hidden, k = c.top_k;
  std::vector<RankMemory> ranks(c.ranks);
  for (int r = 0; r < c.ranks; ++r) {
    ranks[r].x = x + at(r, at(T, H));
    ranks[r].dy = dy ? dy + at(r, at(T, H)) : nullptr;
    ranks[r].topk_w = topk_w + at(r, at(T, k));
    ranks[r].slots.assign(at(T, at(k, H)), bf16{0});
    ranks[r].d_topk_w.assign(at(T, k), 0.0f);
  }
  return ranks;
}

// Where a layout row's (token, slot) lives: its source rank, local token and slot.
struct SlotHome {
  int rank, t, j;
};

SlotHome home_of(const LayerConfig& c, int32_t source) {
  const int g = source / c.top_k;
  return SlotHome{c.token_rank(g), g % c.tokens_per_rank, source % c.top_k};
}

// Visits every ring minibatch: expert e's rows [first, first + rows) in layout order, in whole
// 16-row chunks except an expert's last, expert by expert on each rank.
template <class Visit>
void for_each_minibatch(const LayerConfig& c, const DispatchLayout& l, int ring_rows, Visit visit) {
  for (int r = 0; r < c.ranks; ++r)
    for (int e = r * c.experts_per_rank(); e < (r + 1) * c.experts_per_rank(); ++e)
      for (int done = 0; done < l.counts[e]; done += ring_rows)
        visit(e, l.offsets[e] + done, std::min(ring_rows, l.counts[e] - done));
}

// a = bf16(swiglu(h)) for m rows of h (gate | up, [m, 2 inter]): the forward's, and the backward's
// again from the saved h (a Forward keeps no routed a).
void swiglu_rows(const LayerConfig& c, const bf16* h, int m, int inter, bf16* a) {
  for (int row = 0; row < m; ++row)
    for (int i = 0; i < inter; ++i) {
      const bf16* hr = h + at(row, 2 * inter);
      a[at(row, inter) + i] = to_bf16(swiglu(to_float(hr[i]), to_float(hr[inter + i]), c.swiglu_limit));
    }
}

// h = bf16(x W1^T) and a = bf16(swiglu(h)) for m rows.
void swiglu_mlp_up(const LayerConfig& c, StepModel step, const bf16* x, int m, const bf16* w1, int inter, bf16* h,
                   bf16* a) {
  const int H = c.hidden;
  std::vector<float> acc(at(m, 2 * inter));
  matmul(step, c.precision, x, m, w1, 2 * inter, H, acc.data());
  for (size_t i = 0; i < acc.size(); ++i) h[i] = to_bf16(acc[i]);
  swiglu_rows(c, h, m, inter, a);
}

// bf16(a b^T): the layer's GEMMs whose results are bf16 (y_e, dx_j), in the config's precision.
std::vector<bf16> matmul_bf16(const LayerConfig& c, StepModel step, const bf16* a, int m, const bf16* b, int n, int k) {
  std::vector<float> acc(at(m, n));
  matmul(step, c.precision, a, m, b, n, k, acc.data());
  std::vector<bf16> out(acc.size());
  for (size_t i = 0; i < acc.size(); ++i) out[i] = to_bf16(acc[i]);
  return out;
}

// [rows, cols] -> [cols, rows]
template <class V>
V transposed(const V& src, int rows, int cols) {
  V out(src.size());
  for (int r = 0; r < rows; ++r)
    for (int q = 0; q < cols; ++q) out[at(q, rows) + r] = src[at(r, cols) + q];
  return out;
}

// The SwiGLU backward of m rows: g = dy W2 (K-step chain over H), then for weight w per row
// (nullptr: 1): d_w = <g, a> as an fma chain over I, da = w * g, dh = bf16(swiglu_grad).
void swiglu_mlp_down_grad(const LayerConfig& c, StepModel step, const bf16* dy, int m, const bf16* w2t, int inter,
                          const bf16* h, const bf16* a, const float* w, float* d_w, bf16* dh) {
  std::vector<float> g(at(m, inter));
  matmul(step, c.precision, dy, m, w2t, inter, c.hidden, g.data());
  for (int row = 0; row < m; ++row) {
    const float* gr = g.data() + at(row, inter);
    const bf16* ar = a + at(row, inter);
    const bf16* hr = h + at(row, 2 * inter);
    if (d_w)
      d_w[row] = fma_chain(
          inter, [&](int i) { return gr[i]; }, [&](int i) { return to_float(ar[i]); });
    for (int i = 0; i < inter; ++i) {
      const float da = w ? w[row] * gr[i] : gr[i];
      const SwigluGrad d = swiglu_grad(to_float(hr[i]), to_float(hr[inter + i]), da, c.swiglu_limit);
      dh[at(row, 2 * inter) + i] = to_bf16(d.gate);
      dh[at(row, 2 * inter) + inter + i] = to_bf16(d.up);
    }
  }
}

// Fault::tie_higher_index: the selection run on the experts in reverse order, so ties go to the higher id.
void select_higher_wins(const LayerConfig& c, const float* scores, const float* bias, const SelectScratch& s,
                        int32_t* topk_idx) {
  const int E = c.experts;
  std::vector<float> rev_scores(scores, scores + E), rev_bias(E, 0.0f);
  if (bias) rev_bias.assign(bias, bias + E);
  std::reverse(rev_scores.begin(), rev_scores.end());
  std::reverse(rev_bias.begin(), rev_bias.end());
  router_select(c, rev_scores.data(), bias ? rev_bias.data() : nullptr, s, topk_idx);
  for (int j = 0; j < c.top_k; ++j) topk_idx[j] = E - 1 - topk_idx[j];
}

// Fault::layout_off_by_one: the first non-empty expert's last row is served by the next expert.
void shift_first_boundary(DispatchLayout& l) {
  for (size_t e = 0; e + 1 < l.counts.size(); ++e)
    if (l.counts[e] > 0) {
      --l.offsets[e + 1];
      --l.counts[e];
      ++l.counts[e + 1];
      return;
    }
}

// Fault::combine_order and its variants: whether token g of rank r sums its slots in reverse order
// (odd_call: this forward is the process's second, fourth, ...).
bool reverses_combine(const Options& opt, int r, long g, bool odd_call) {
  switch (opt.fault) {
    case Fault::combine_order:
      return true;
    case Fault::rank_combine_order:
      return r > 0;
    case Fault::ring_combine_order:
      return opt.ring_rows < 64;
    case Fault::call_combine_order:
      return odd_call;
    case Fault::position_combine_order:
      return g % 2 == 1;
    default:
      return false;
  }
}

// Fault::drop_overflow: the per-expert capacity beyond which rows are dropped.
int drop_capacity(const LayerConfig& c) { return 2 * ((c.routed_rows() + c.experts - 1) / c.experts); }

// Options::fp8_weight_gradients (off by default): expert e's dW1 = dh^T x and dW2 = bf16(w dy)^T a on
// E4M3 operands, 1 x 128 blocks along the expert's token rows (padded with zeros to whole blocks), over
// all its rows at once: its minibatches' rows are gathered (ExpertRows) and the gradients made after its
// last, so they do not depend on the ring.
struct ExpertRows {
  std::vector<bf16> dh, x, dye, a;
  int rows = 0;
  void append(int m, const std::vector<bf16>& dh_m, const std::vector<bf16>& x_m, const std::vector<bf16>& dye_m,
              const std::vector<bf16>& a_m) {
    dh.insert(dh.end(), dh_m.begin(), dh_m.end());
    x.insert(x.end(), x_m.begin(), x_m.end());
    dye.insert(dye.end(), dye_m.begin(), dye_m.end());
    a.insert(a.end(), a_m.begin(), a_m.end());
    rows += m;
  }
};
void fp8_weight_gradients(const LayerConfig& c, int e, const ExpertRows& r, Gradients& gr) {
  const int H = c.hidden, I = c.intermediate, m = r.rows;
  const int k = (m + kFp8Block - 1) / kFp8Block * kFp8Block;
  const auto t = [&](const std::vector<bf16>& v, int cols) { return transpose_padded(v.data(), m, cols, kFp8Block); };
  matmul_fp8(t(r.dh, 2 * I).data(), 2 * I, t(r.x, H).data(), H, k, 1, gr.d_w1.data() + at(e, at(2 * I, H)));
  matmul_fp8(t(r.dye, H).data(), H, t(r.a, I).data(), I, k, 1, gr.d_w2.data() + at(e, at(H, I)));
}

}  // namespace

DispatchLayout build_dispatch_layout(const LayerConfig& c, const std::vector<int32_t>& topk_idx) {
  const int N = c.tokens(), E = c.experts, k = c.top_k, chunks = layout_chunks(N);
  std::vector<uint32_t> masks(at(chunks, E));
  std::vector<int32_t> by_chunk(at(chunks, E)), base(at(chunks, E));
  DispatchLayout l;
  l.offsets.resize(E + 1);
  l.row_source.resize(at(N, k));
  l.slot_row.resize(at(N, k));
  for (int ch = 0; ch < chunks; ++ch) {
    route_masks(topk_idx.data(), k, ch, N, E, masks.data() + at(ch, E));
    for (int e = 0; e < E; ++e) by_chunk[at(ch, E) + e] = chunk_rows(masks[at(ch, E) + e]);
  }
  scan_chunks(by_chunk.data(), chunks, E, base.data(), l.offsets.data());
  for (int g = 0; g < N; ++g) {
    const size_t ch = at(g / kLayoutChunk, E);
    place_token(topk_idx.data(), k, g, masks.data() + ch, base.data() + ch, l.row_source.data(), l.slot_row.data());
  }
  l.counts.resize(E);
  for (int e = 0; e < E; ++e) l.counts[e] = l.offsets[e + 1] - l.offsets[e];
  return l;
}

Routing route(const LayerConfig& c, const std::vector<bf16>& x, const LayerWeights& w, std::vector<float>* logits_out,
              Fault fault, const std::vector<int32_t>* replay_ids) {
  const int N = c.tokens(), H = c.hidden, E = c.experts, k = c.top_k;
  Routing r;
  r.topk_idx.resize(at(N, k));
  r.topk_w.resize(at(N, k));
  std::vector<float> logits(at(N, E));
  std::vector<float> scores(E);
  HostSelectScratch scratch(c);
  for (int g = 0; g < N; ++g) {
    float* lg = logits.data() + at(g, E);
    const bf16* xg = x.data() + at(g, H);
    for (int e = 0; e < E; ++e) {
      const float* wr = w.router.data() + at(e, H);
      lg[e] = fma_chain(
          H, [&](int h) { return to_float(xg[h]); }, [&](int h) { return wr[h]; });
      require(lg[e] - lg[e] == 0.0f, "router logit of token " + std::to_string(g) + " overflows");
    }
    router_scores(c, lg, scores.data());
    if (replay_ids)
      std::copy_n(replay_ids->data() + at(g, k), k, r.topk_idx.data() + at(g, k));
    else
      (fault == Fault::tie_higher_index ? select_higher_wins : router_select)(
          c, scores.data(), w.expert_bias.empty() ? nullptr : w.expert_bias.data(), scratch.view(),
          r.topk_idx.data() + at(g, k));
    router_weights(c, scores.data(), r.topk_idx.data() + at(g, k), r.topk_w.data() + at(g, k));
  }
  if (logits_out) *logits_out = std::move(logits);
  return r;
}

Forward forward(const LayerConfig& c, const std::vector<bf16>& x, const LayerWeights& w, const Routing* given,
                const Options& opt) {
  validate_inputs(c, x, w, given, opt.replay_ids);
  validate_ring_rows(opt.ring_rows);
  const int N = c.tokens(), H = c.hidden, I = c.intermediate, k = c.top_k, T = c.tokens_per_rank;
  Forward f;
  if (given && !opt.replay_ids)
    f.routing = *given;
  else
    f.routing = route(c, x, w, &f.logits, opt.fault, given ? &given->topk_idx : nullptr);
  f.layout = build_dispatch_layout(c, f.routing.topk_idx);
  if (opt.fault == Fault::layout_off_by_one) shift_first_boundary(f.layout);
  std::vector<RankMemory> ranks = rank_table(c, x.data(), nullptr, f.routing.topk_w.data());
  if (!opt.recompute) f.h.resize(at(at(N, k), 2 * I));
  std::vector<bf16> ring_x, ring_h, ring_a;
  for_each_minibatch(c, f.layout, opt.ring_rows, [&](int e, int first, int m) {
    if (opt.fault == Fault::drop_overflow) m = std::clamp(drop_capacity(c) - (first - f.layout.offsets[e]), 0, m);
    ring_x.resize(at(m, H));
    ring_h.resize(at(m, 2 * I));
    ring_a.resize(at(m, I));
    for (int i = 0; i < m; ++i) {  // pull dispatch: read the token row from its source rank
      const SlotHome s = home_of(c, f.layout.row_source[first + i]);
      std::copy_n(ranks[s.rank].x + at(s.t, H), H, ring_x.begin() + at(i, H));
    }
    swiglu_mlp_up(c, opt.step, ring_x.data(), m, w.w1.data() + at(e, at(2 * I, H)), I, ring_h.data(), ring_a.data());
    if (!opt.recompute) std::copy(ring_h.begin(), ring_h.end(), f.h.begin() + at(first, 2 * I));
    const std::vector<bf16> ye = matmul_bf16(c, opt.step, ring_a.data(), m, w.w2.data() + at(e, at(H, I)), H, I);
    for (int i = 0; i < m; ++i) {  // push combine: into the (token, slot) buffer of the source rank
      const SlotHome s = home_of(c, f.layout.row_source[first + i]);
      std::copy_n(ye.begin() + at(i, H), H, ranks[s.rank].slots.begin() + at(at(s.t, k) + s.j, H));
    }
  });
  const int Is = c.shared_intermediate;
  std::vector<bf16> shared_h(at(N, 2 * Is)), shared_a(at(N, Is));  // kept unless the backward recomputes them
  f.y.resize(at(N, H));
  std::vector<float> reversed_w(k);          // Fault::combine_order and its variants
  static std::atomic<unsigned> forwards{0};  // Fault::call_combine_order's
  const bool odd_call = opt.fault == Fault::call_combine_order && forwards++ % 2 == 1;
  for (int r = 0; r < c.ranks; ++r) {
    std::vector<bf16> shared_y;
    const size_t base = at(r, T);
    if (c.has_shared()) {
      swiglu_mlp_up(c, opt.step, ranks[r].x, T, w.shared_w1.data(), Is, shared_h.data() + at(base, 2 * Is),
                    shared_a.data() + at(base, Is));
      shared_y = matmul_bf16(c, opt.step, shared_a.data() + at(base, Is), T, w.shared_w2.data(), H, Is);
    }
    for (int t = 0; t < T; ++t) {
      const float* wt = ranks[r].topk_w + at(t, k);
      const bool reversed = reverses_combine(opt, r, long(base) + t, odd_call);
      if (reversed) std::reverse_copy(wt, wt + k, reversed_w.begin());
      for (int hh = 0; hh < H; ++hh) {
        const float shared = c.has_shared() ? to_float(shared_y[at(t, H) + hh]) : 0.0f;
        const bf16* slots = ranks[r].slots.data() + at(at(t, k), H) + hh;
        f.y[at(base + t, H) + hh] =
            reversed ? combine_y(k, shared, reversed_w.data(), [&](int j) { return slots[at(k - 1 - j, H)]; })
                     : combine_y(k, shared, wt, [&](int j) { return slots[at(j, H)]; });
      }
    }
  }
  if (!opt.recompute) {
    f.shared_h = std::move(shared_h);
    f.shared_a = std::move(shared_a);
  }
  return f;
}

Gradients backward(const LayerConfig& c, const std::vector<bf16>& x, const LayerWeights& w, const Forward& fwd,
                   const std::vector<bf16>& dy, const Options& opt) {
  const int N = c.tokens(), H = c.hidden, I = c.intermediate, E = c.experts, k = c.top_k, T = c.tokens_per_rank;
  const int Is = c.shared_intermediate;
  validate_ring_rows(opt.ring_rows);
  validate_backward_inputs(c, x, w, fwd, dy, opt.recompute);
  const DispatchLayout& l = fwd.layout;
  std::vector<RankMemory> ranks = rank_table(c, x.data(), dy.data(), fwd.routing.topk_w.data());
  Gradients gr;
  gr.d_w1.assign(at(E, at(2 * I, H)), 0.0f);
  gr.d_w2.assign(at(E, at(H, I)), 0.0f);
  std::vector<std::vector<bf16>> w1t(E), w2t(E);  // per expert [H, 2I] and [I, H]
  for (int e = 0; e < E; ++e) {
    w1t[e] = transposed(std::vector<bf16>(w.w1.begin() + at(e, at(2 * I, H)), w.w1.begin() + at(e + 1, at(2 * I, H))),
                        2 * I, H);
    w2t[e] = transposed(std::vector<bf16>(w.w2.begin() + at(e, at(H, I)), w.w2.begin() + at(e + 1, at(H, I))), H, I);
  }
  std::vector<bf16> ring_x, ring_dy, ring_h, ring_a, dh, dye;
  std::vector<float> ring_w, d_w;
  ExpertRows expert_rows;  // Options::fp8_weight_gradients: the expert's rows so far
  for_each_minibatch(c, l, opt.ring_rows, [&](int e, int first, int m) {
    ring_x.resize(at(m, H));
    ring_dy.resize(at(m, H));
    ring_w.resize(m);
    for (int i = 0; i < m; ++i) {  // pull reverse-combine: dy and the weight from the source rank
      const SlotHome s = home_of(c, l.row_source[first + i]);
      std::copy_n(ranks[s.rank].x + at(s.t, H), H, ring_x.begin() + at(i, H));
      std::copy_n(ranks[s.rank].dy + at(s.t, H), H, ring_dy.begin() + at(i, H));
      ring_w[i] = ranks[s.rank].topk_w[at(s.t, k) + s.j];
    }
    if (opt.recompute) {
      ring_h.resize(at(m, 2 * I));
      ring_a.resize(at(m, I));
      swiglu_mlp_up(c, opt.step, ring_x.data(), m, w.w1.data() + at(e, at(2 * I, H)), I, ring_h.data(), ring_a.data());
    } else {
      ring_h.assign(fwd.h.begin() + at(first, 2 * I), fwd.h.begin() + at(first + m, 2 * I));
      ring_a.resize(at(m, I));
      swiglu_rows(c, ring_h.data(), m, I, ring_a.data());
    }
    dh.resize(at(m, 2 * I));
    d_w.resize(m);
    swiglu_mlp_down_grad(c, opt.step, ring_dy.data(), m, w2t[e].data(), I, ring_h.data(), ring_a.data(), ring_w.data(),
                         d_w.data(), dh.data());
    const std::vector<bf16> dxe = matmul_bf16(c, opt.step, dh.data(), m, w1t[e].data(), H, 2 * I);
    for (int i = 0; i < m; ++i) {  // push reverse-dispatch: dx_j and d topk_w_j to the source rank
      const SlotHome s = home_of(c, l.row_source[first + i]);
      std::copy_n(dxe.begin() + at(i, H), H, ranks[s.rank].slots.begin() + at(at(s.t, k) + s.j, H));
      ranks[s.rank].d_topk_w[at(s.t, k) + s.j] = d_w[i];
    }
    dye.resize(at(m, H));
    for (int i = 0; i < m; ++i)
      for (int hh = 0; hh < H; ++hh) dye[at(i, H) + hh] = weighted_dy(ring_w[i], ring_dy[at(i, H) + hh]);
    if (c.precision == Precision::fp8 && opt.fp8_weight_gradients) {
      expert_rows.append(m, dh, ring_x, dye, ring_a);
      if (first + m == l.offsets[e + 1]) {  // the expert's last minibatch
        fp8_weight_gradients(c, e, expert_rows, gr);
        expert_rows = {};
      }
      return;
    }
    // Weight gradients (bf16 operands in either precision) continue their K-step chains over this
    // minibatch's whole 16-row chunks.
    matmul(opt.step, transpose_padded(dh.data(), m, 2 * I).data(), 2 * I, transpose_padded(ring_x.data(), m, H).data(),
           H, round_up16(m), gr.d_w1.data() + at(e, at(2 * I, H)), true);
    matmul(opt.step, transpose_padded(dye.data(), m, H).data(), H, transpose_padded(ring_a.data(), m, I).data(), I,
           round_up16(m), gr.d_w2.data() + at(e, at(H, I)), true);
  });

  gr.d_topk_w.resize(at(N, k));
  for (int r = 0; r < c.ranks; ++r)
    std::copy(ranks[r].d_topk_w.begin(), ranks[r].d_topk_w.end(), gr.d_topk_w.begin() + at(r, at(T, k)));

  // Shared expert: on each token's own rank; its weight gradients chain over global token order.
  std::vector<bf16> shared_dh(at(N, 2 * Is)), shared_dx;
  if (c.has_shared()) {
    std::vector<bf16> recomputed_h, recomputed_a;
    if (opt.recompute) {  // row by row the forward's bits, whatever rows one call takes
      recomputed_h.resize(at(N, 2 * Is));
      recomputed_a.resize(at(N, Is));
      swiglu_mlp_up(c, opt.step, x.data(), N, w.shared_w1.data(), Is, recomputed_h.data(), recomputed_a.data());
    }
    const std::vector<bf16>& shared_h = opt.recompute ? recomputed_h : fwd.shared_h;
    const std::vector<bf16>& shared_a = opt.recompute ? recomputed_a : fwd.shared_a;
    const std::vector<bf16> w2st = transposed(w.shared_w2, H, Is);
    swiglu_mlp_down_grad(c, opt.step, dy.data(), N, w2st.data(), Is, shared_h.data(), shared_a.data(), nullptr, nullptr,
                         shared_dh.data());
    shared_dx = matmul_bf16(c, opt.step, shared_dh.data(), N, transposed(w.shared_w1, 2 * Is, H).data(), H, 2 * Is);
    gr.d_shared_w1.assign(at(2 * Is, H), 0.0f);
    gr.d_shared_w2.assign(at(H, Is), 0.0f);
    matmul(opt.step, transpose_padded(shared_dh.data(), N, 2 * Is).data(), 2 * Is,
           transpose_padded(x.data(), N, H).data(), H, round_up16(N), gr.d_shared_w1.data());
    matmul(opt.step, transpose_padded(dy.data(), N, H).data(), H, transpose_padded(shared_a.data(), N, Is).data(), Is,
           round_up16(N), gr.d_shared_w2.data());
  }

  // Router backward (not for a given routing, which has no router): per token, then dWr over global token order.
  const bool router = !fwd.logits.empty();
  std::vector<float> router_dx;
  if (router) {
    gr.d_logits.resize(at(N, E));
    std::vector<float> scores(E), d_scores(E);
    for (int g = 0; g < N; ++g) {
      router_scores(c, fwd.logits.data() + at(g, E), scores.data());
      router_backward(c, scores.data(), fwd.routing.topk_idx.data() + at(g, k), gr.d_topk_w.data() + at(g, k),
                      d_scores.data(), gr.d_logits.data() + at(g, E));
      if (opt.fault == Fault::router_grad_sign)
        for (int e = 0; e < E; ++e) gr.d_logits[at(g, E) + e] = -gr.d_logits[at(g, E) + e];
    }
    gr.d_router.resize(at(E, H));
    for (int e = 0; e < E; ++e)
      for (int hh = 0; hh < H; ++hh)
        gr.d_router[at(e, H) + hh] = fma_chain(
            N, [&](int g) { return gr.d_logits[at(g, E) + e]; }, [&](int g) { return to_float(x[at(g, H) + hh]); });
    router_dx.resize(at(N, H));
    for (int g = 0; g < N; ++g)
      for (int hh = 0; hh < H; ++hh)
        router_dx[at(g, H) + hh] = fma_chain(
            E, [&](int e) { return gr.d_logits[at(g, E) + e]; }, [&](int e) { return w.router[at(e, H) + hh]; });
  }

  gr.dx.resize(at(N, H));
  for (int r = 0; r < c.ranks; ++r)
    for (int t = 0; t < T; ++t) {
      const size_t g = at(r, T) + t;
      for (int hh = 0; hh < H; ++hh) {
        const bf16* slots = ranks[r].slots.data() + at(at(t, k), H) + hh;
        gr.dx[at(g, H) + hh] = combine_dx(
            k, c.has_shared() ? to_float(shared_dx[at(g, H) + hh]) : 0.0f, [&](int j) { return slots[at(j, H)]; },
            router ? router_dx[at(g, H) + hh] : 0.0f);
      }
    }
  return gr;
}

}  // namespace mok::ref
