#include "mok/fuzz/properties.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>
#include <new>
#include <numeric>

#include "mok/core/combine.h"
#include "mok/core/fma_chain.h"
#include "mok/core/routing.h"
#include "mok/core/swiglu.h"
#include "mok/reference/matmul.h"
#include "mok/reference/oracle.h"

namespace mok::fuzz {
namespace {

size_t at(long a, long b) { return size_t(a) * size_t(b); }

struct Run {
  ref::Forward fwd;
  ref::Gradients grad;
};

const ref::Routing* given_of(const ref::Problem& p) { return p.routing ? &*p.routing : nullptr; }

Run run_layer(Backend& b, const ref::Problem& p, const ref::Options& o) {
  Run r;
  r.fwd = b.forward(p.config, p.x, p.weights, given_of(p), o);
  r.grad = b.backward(p.config, p.x, p.weights, r.fwd, p.dy, o);
  return r;
}

Verdict compare_runs(const LayerConfig& c, const Run& a, const Run& b, bool activations) {
  if (auto v = compare_forward(c, a.fwd, b.fwd, activations)) return v;
  return compare_gradients(c, a.grad, b.grad);
}

Verdict in_context(const std::string& context, Verdict v) {
  if (v) v = context + ": " + *v;
  return v;
}

std::vector<int> iota_rows(int n) {
  std::vector<int> rows(n);
  std::iota(rows.begin(), rows.end(), 0);
  return rows;
}

// Rank counts that split `tokens` tokens and `experts` experts evenly.
std::vector<int> rank_counts(int tokens, int experts) {
  std::vector<int> out;
  for (int r = 1; r <= std::min(tokens, experts); ++r)
    if (tokens % r == 0 && experts % r == 0) out.push_back(r);
  return out;
}

template <class T>
std::vector<T> gather_rows(const std::vector<T>& v, const std::vector<int>& rows, int width) {
  std::vector<T> out(at(rows.size(), width));
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy_n(v.begin() + at(rows[i], width), width, out.begin() + at(i, width));
  return out;
}

// The problem's tokens `tokens` (a subset, or a reordering) on `ranks` ranks, with the routing rows
// of `routing` given (nullptr: the router routes).
ref::Problem select_tokens(const ref::Problem& p, const std::vector<int>& tokens, int ranks,
                           const ref::Routing* routing) {
  ref::Problem q;
  q.config = p.config;
  q.config.ranks = ranks;
  q.config.tokens_per_rank = int(tokens.size()) / ranks;
  q.x = gather_rows(p.x, tokens, p.config.hidden);
  q.dy = gather_rows(p.dy, tokens, p.config.hidden);
  q.weights = p.weights;
  if (routing)
    q.routing = ref::Routing{gather_rows(routing->topk_idx, tokens, p.config.top_k),
                             gather_rows(routing->topk_w, tokens, p.config.top_k)};
  return q;
}

std::string show_options(const ref::Options& o) {
  return "ring_rows " + std::to_string(o.ring_rows) + (o.recompute ? " recompute" : " saved");
}

// ---- D1, D2, ring ----

Verdict repeat(Backend& b, const ref::Problem& p, const CaseParams& cp) {
  const Run first = run_layer(b, p, cp.options);
  return in_context("second run vs first",
                    compare_runs(p.config, run_layer(b, p, cp.options), first, !cp.options.recompute));
}

// The problem whose R rank_invariance varies: p, or where no R but 1 divides both N and E (N and E
// coprime: about a fifth of the drawn configs), p's first tokens cut to a multiple of E's smallest
// factor d > 1 (cycled up to d where N < d), on R = 1. E = 1 has no other R.
ref::Problem with_another_rank_count(const ref::Problem& p) {
  const LayerConfig& c = p.config;
  if (c.experts == 1 || rank_counts(c.tokens(), c.experts).size() > 1) return p;
  int d = 2;
  while (c.experts % d != 0) ++d;
  std::vector<int> tokens(c.tokens() >= d ? c.tokens() - c.tokens() % d : d);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int(i) % c.tokens();
  return select_tokens(p, tokens, 1, p.routing ? &*p.routing : nullptr);
}

Verdict rank_invariance(Backend& b, const ref::Problem& given, const CaseParams& cp) {
  const ref::Problem p = with_another_rank_count(given);
  const LayerConfig& c = p.config;
  const Run base = run_layer(b, p, cp.options);
  for (int ranks : rank_counts(c.tokens(), c.experts)) {
    if (ranks == c.ranks) continue;
    ref::Problem q = p;
    q.config.ranks = ranks;
    q.config.tokens_per_rank = c.tokens() / ranks;
    if (auto v = compare_runs(c, run_layer(b, q, cp.options), base, !cp.options.recompute)) {
      const std::string cut =
          c.tokens() == given.config.tokens() ? "" : "the batch cut to " + std::to_string(c.tokens()) + " tokens, ";
      return cut + "R = " + std::to_string(ranks) + " vs R = " + std::to_string(c.ranks) + ": " + *v;
    }
  }
  return std::nullopt;
}

Verdict ring_invariance(Backend& b, const ref::Problem& p, const CaseParams& cp) {
  ref::Rng rng(cp.aux_seed);
  const Run base = run_layer(b, p, cp.options);
  ref::Options others[2] = {cp.options, cp.options};
  others[0].ring_rows = kStepK;
  others[1].ring_rows = kStepK * (1 + rng.below(32));
  others[1].recompute = !cp.options.recompute;
  for (const ref::Options& o : others) {
    const bool activations = !cp.options.recompute && !o.recompute;
    if (auto v = compare_runs(p.config, run_layer(b, p, o), base, activations))
      return show_options(o) + " vs " + show_options(cp.options) + ": " + *v;
  }
  return std::nullopt;
}

// ---- RoutingMode::replay_ids ----

// Replaying the router's own expert ids (Options::replay_ids: the ids given, their weights, the logits
// and the router's gradients the live router's) is the router: every output and gradient the same
// bits. The problem runs routed by its router whatever its routing kind.
Verdict replay_own_ids(Backend& b, const ref::Problem& p, const CaseParams& cp) {
  ref::Problem routed = p;
  routed.routing.reset();
  const Run base = run_layer(b, routed, cp.options);
  ref::Problem replayed = routed;
  replayed.routing = ref::Routing{base.fwd.routing.topk_idx, {}};
  ref::Options o = cp.options;
  o.replay_ids = true;
  return in_context("replayed ids vs the router",
                    compare_runs(p.config, run_layer(b, replayed, o), base, !cp.options.recompute));
}

// ---- D4, permutation ----

Verdict batch_invariance(Backend& b, const ref::Problem& p, const CaseParams& cp) {
  const LayerConfig& c = p.config;
  const int N = c.tokens(), H = c.hidden, k = c.top_k;
  const ref::Forward full = b.forward(c, p.x, p.weights, given_of(p), cp.options);
  ref::Rng rng(cp.aux_seed);
  std::vector<int> subset;  // a random sub-batch in token order, and a single token
  for (int g = 0; g < N; ++g)
    if (rng.below(2)) subset.push_back(g);
  if (subset.empty()) subset.push_back(rng.below(N));
  for (const std::vector<int>& tokens : {subset, std::vector<int>{rng.below(N)}}) {
    const std::vector<int> counts = rank_counts(int(tokens.size()), c.experts);
    const int ranks = counts[rng.below(int(counts.size()))];
    const std::vector<int> rows = iota_rows(int(tokens.size()));
    const std::string context = "sub-batch of " + std::to_string(tokens.size()) +
                                " tokens on R = " + std::to_string(ranks) + " (sub-batch row / full row)";
    ref::Problem q = select_tokens(p, tokens, ranks, &full.routing);
    const ref::Forward sub = b.forward(q.config, q.x, q.weights, &*q.routing, cp.options);
    if (auto v = compare_rows("y", sub.y, full.y, H, rows, tokens)) return context + ", routing given: " + *v;
    if (p.routing) continue;
    const ref::Forward routed = b.forward(q.config, q.x, q.weights, nullptr, cp.options);
    Verdict v = compare_rows("topk_idx", routed.routing.topk_idx, full.routing.topk_idx, k, rows, tokens);
    if (!v) v = compare_rows("topk_w", routed.routing.topk_w, full.routing.topk_w, k, rows, tokens);
    if (!v) v = compare_rows("logits", routed.logits, full.logits, c.experts, rows, tokens);
    if (!v) v = compare_rows("y", routed.y, full.y, H, rows, tokens);
    if (v) return context + ", router: " + *v;
  }
  return std::nullopt;
}

Verdict permutation(Backend& b, const ref::Problem& p, const CaseParams& cp) {
  const LayerConfig& c = p.config;
  const int N = c.tokens(), H = c.hidden, k = c.top_k, E = c.experts;
  ref::Rng rng(cp.aux_seed);
  std::vector<int> perm = iota_rows(N);
  for (int i = N - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  const Run base = run_layer(b, p, cp.options);
  const Run permuted = run_layer(b, select_tokens(p, perm, c.ranks, given_of(p)), cp.options);
  const std::vector<int> rows = iota_rows(N);
  const auto rows_of = [&](const std::string& name, const auto& got, const auto& want, int width) {
    return compare_rows(name, got, want, width, rows, perm);
  };
  Verdict v = rows_of("topk_idx", permuted.fwd.routing.topk_idx, base.fwd.routing.topk_idx, k);
  if (!v) v = rows_of("topk_w", permuted.fwd.routing.topk_w, base.fwd.routing.topk_w, k);
  if (!v) v = rows_of("logits", permuted.fwd.logits, base.fwd.logits, E);
  if (!v) v = rows_of("y", permuted.fwd.y, base.fwd.y, H);
  if (!v) v = rows_of("dx", permuted.grad.dx, base.grad.dx, H);
  if (!v) v = rows_of("d_topk_w", permuted.grad.d_topk_w, base.grad.d_topk_w, k);
  if (!v) v = rows_of("d_logits", permuted.grad.d_logits, base.grad.d_logits, E);
  return in_context("tokens permuted (permuted row / original row)", v);
}

// ---- conservation ----

// The dispatch layout against the routing: counts, offsets, and every (token, slot) exactly once.
Verdict check_layout(const LayerConfig& c, const std::vector<int32_t>& idx, const ref::DispatchLayout& l) {
  const int E = c.experts, k = c.top_k, rows = c.routed_rows();
  const auto slot = [k](int s) { return "(token " + std::to_string(s / k) + ", slot " + std::to_string(s % k) + ")"; };
  if (int(idx.size()) != rows || int(l.counts.size()) != E || int(l.offsets.size()) != E + 1 ||
      int(l.row_source.size()) != rows || int(l.slot_row.size()) != rows)
    return std::string("routing or layout tensors of the wrong size");
  std::vector<int> routed(E, 0);
  for (int s = 0; s < rows; ++s) {
    if (idx[s] < 0 || idx[s] >= E) return "topk_idx of " + slot(s) + " = " + std::to_string(idx[s]);
    ++routed[idx[s]];
  }
  if (l.offsets[0] != 0) return "offsets[0] = " + std::to_string(l.offsets[0]);
  for (int e = 0; e < E; ++e) {
    if (l.counts[e] != routed[e])
      return "counts[" + std::to_string(e) + "] = " + std::to_string(l.counts[e]) + ", but the routing sends " +
             std::to_string(routed[e]) + " rows there";
    if (l.offsets[e + 1] != l.offsets[e] + l.counts[e])
      return "offsets[" + std::to_string(e + 1) + "] = " + std::to_string(l.offsets[e + 1]) +
             " is not offsets[e] + counts[e] = " + std::to_string(l.offsets[e] + l.counts[e]);
  }
  if (l.offsets[E] != rows)
    return "counts sum to " + std::to_string(l.offsets[E]) + ", not N k = " + std::to_string(rows);
  std::vector<int> landed(rows, 0);
  for (int e = 0; e < E; ++e)
    for (int row = l.offsets[e]; row < l.offsets[e + 1]; ++row) {
      const int s = l.row_source[row];
      const std::string where = "layout row " + std::to_string(row) + " of expert " + std::to_string(e);
      if (s < 0 || s >= rows) return where + " has row_source " + std::to_string(s);
      if (idx[s] != e) return where + " serves " + slot(s) + ", which is routed to expert " + std::to_string(idx[s]);
      if (row > l.offsets[e] && l.row_source[row - 1] / k >= s / k) return where + " breaks global token order";
      if (l.slot_row[s] != row)
        return "slot_row of " + slot(s) + " = " + std::to_string(l.slot_row[s]) + ", not " + where;
      ++landed[s];
    }
  for (int s = 0; s < rows; ++s)
    if (landed[s] != 1) return slot(s) + " lands in the layout " + std::to_string(landed[s]) + " times";
  return std::nullopt;
}

// One row through a SwiGLU MLP: h = bf16(x W1^T), a = bf16(swiglu(h)), y = bf16(a W2^T).
struct MlpRow {
  std::vector<bf16> h, a, y;
};

MlpRow mlp_row(const LayerConfig& c, StepModel step, const bf16* x, const bf16* w1, const bf16* w2, int inter) {
  const int H = c.hidden;
  MlpRow r{std::vector<bf16>(2 * inter), std::vector<bf16>(inter), std::vector<bf16>(H)};
  std::vector<float> acc(std::max(2 * inter, H));
  ref::matmul(step, c.precision, x, 1, w1, 2 * inter, H, acc.data());
  for (int i = 0; i < 2 * inter; ++i) r.h[i] = to_bf16(acc[i]);
  for (int i = 0; i < inter; ++i) r.a[i] = to_bf16(swiglu(to_float(r.h[i]), to_float(r.h[inter + i]), c.swiglu_limit));
  ref::matmul(step, c.precision, r.a.data(), 1, w2, H, inter, acc.data());
  for (int i = 0; i < H; ++i) r.y[i] = to_bf16(acc[i]);
  return r;
}

// Each token's y and d topk_w recomputed one (token, slot) at a time with no layout, ring or rank
// in between: what came back to each slot must be exactly its expert's result, summed in slot order.
Verdict check_direct(const ref::Problem& p, const ref::Options& o, const ref::Forward& fwd,
                     const ref::Gradients& grad) {
  const LayerConfig& c = p.config;
  const int N = c.tokens(), H = c.hidden, I = c.intermediate, k = c.top_k, Is = c.shared_intermediate;
  const ref::LayerWeights& w = p.weights;
  std::vector<bf16> h(at(c.routed_rows(), 2 * I)), y(at(N, H));
  std::vector<float> d_topk_w(c.routed_rows()), g(I);
  std::vector<bf16> w2t(at(c.experts, at(I, H)));  // per expert W2^T [I, H]
  for (int e = 0; e < c.experts; ++e)
    for (int hh = 0; hh < H; ++hh)
      for (int i = 0; i < I; ++i) w2t[at(e, at(I, H)) + at(i, H) + hh] = w.w2[at(e, at(H, I)) + at(hh, I) + i];
  std::vector<MlpRow> slots(k);
  for (int t = 0; t < N; ++t) {
    const bf16* xt = p.x.data() + at(t, H);
    for (int j = 0; j < k; ++j) {
      const int s = t * k + j, e = fwd.routing.topk_idx[s];
      slots[j] = mlp_row(c, o.step, xt, w.w1.data() + at(e, at(2 * I, H)), w.w2.data() + at(e, at(H, I)), I);
      std::copy(slots[j].h.begin(), slots[j].h.end(), h.begin() + at(fwd.layout.slot_row[s], 2 * I));
      ref::matmul(o.step, c.precision, p.dy.data() + at(t, H), 1, w2t.data() + at(e, at(I, H)), I, H, g.data());
      d_topk_w[s] = fma_chain(
          I, [&](int i) { return g[i]; }, [&](int i) { return to_float(slots[j].a[i]); });
    }
    const MlpRow shared = c.has_shared() ? mlp_row(c, o.step, xt, w.shared_w1.data(), w.shared_w2.data(), Is)
                                         : MlpRow{{}, {}, std::vector<bf16>(H, bf16{0})};
    for (int hh = 0; hh < H; ++hh)
      y[at(t, H) + hh] = combine_y(k, to_float(shared.y[hh]), fwd.routing.topk_w.data() + at(t, k),
                                   [&](int j) { return slots[j].y[hh]; });
  }
  Verdict v = compare_bits("y", fwd.y, y, H);
  if (!v) v = compare_bits("d_topk_w", grad.d_topk_w, d_topk_w, k);
  if (!v && !o.recompute) v = compare_bits("h (layout order)", fwd.h, h, 2 * I);
  return in_context("layer vs direct per-(token, slot) evaluation", v);
}

// The layout is checked before the backward runs, which refuses a layout that is not its routing's.
Verdict conservation(Backend& b, const ref::Problem& p, const CaseParams& cp) {
  const ref::Forward fwd = b.forward(p.config, p.x, p.weights, given_of(p), cp.options);
  if (auto v = check_layout(p.config, fwd.routing.topk_idx, fwd.layout)) return v;
  return check_direct(p, cp.options, fwd, b.backward(p.config, p.x, p.weights, fwd, p.dy, cp.options));
}

// ---- router backward ----

// With the router routing, the layer's d logits must be the shared per-token router backward of its
// own d topk_w, and dWr the fma chain of d logits x over global token order, bit for bit.
Verdict router_backward(Backend& b, const ref::Problem& p, const CaseParams& cp) {
  const LayerConfig& c = p.config;
  const int N = c.tokens(), E = c.experts, H = c.hidden, k = c.top_k;
  ref::Problem q = p;
  q.routing.reset();
  const Run r = run_layer(b, q, cp.options);
  if (r.fwd.logits.size() != at(N, E) || r.grad.d_topk_w.size() != at(N, k))
    return std::string("the router's logits or d topk_w are missing");
  std::vector<float> scores(E), d_scores(E), d_logits(at(N, E)), d_router(at(E, H));
  for (int t = 0; t < N; ++t) {
    router_scores(c, r.fwd.logits.data() + at(t, E), scores.data());
    mok::router_backward(c, scores.data(), r.fwd.routing.topk_idx.data() + at(t, k), r.grad.d_topk_w.data() + at(t, k),
                         d_scores.data(), d_logits.data() + at(t, E));
  }
  for (int e = 0; e < E; ++e)
    for (int h = 0; h < H; ++h)
      d_router[at(e, H) + h] = fma_chain(
          N, [&](int t) { return d_logits[at(t, E) + e]; }, [&](int t) { return to_float(p.x[at(t, H) + h]); });
  Verdict v = compare_bits("d_logits", r.grad.d_logits, d_logits, E);
  if (!v) v = compare_bits("d_router", r.grad.d_router, d_router, H);
  return in_context("layer vs per-token router backward", v);
}

// ---- top-k ----

std::string show_ids(const int32_t* ids, int k) {
  std::string s;
  for (int j = 0; j < k; ++j) {
    if (j) s += ' ';
    s += std::to_string(ids[j]);
  }
  return s;
}

Verdict topk(Backend& b, const ref::Problem& p, const CaseParams& cp) {
  const LayerConfig& c = p.config;
  const int N = c.tokens(), E = c.experts, k = c.top_k;
  const float* bias = p.weights.expert_bias.empty() ? nullptr : p.weights.expert_bias.data();
  const ref::Forward f = b.forward(c, p.x, p.weights, nullptr, cp.options);  // the router, whatever the routing kind
  if (f.logits.size() != at(N, E)) return std::string("the forward returned no router logits");
  std::vector<float> scores(E), weights(k);
  for (int t = 0; t < N; ++t) {
    router_scores(c, f.logits.data() + at(t, E), scores.data());
    const std::vector<int32_t> want = brute_force_topk(c, scores.data(), bias);
    const int32_t* got = f.routing.topk_idx.data() + at(t, k);
    if (!std::equal(want.begin(), want.end(), got))
      return "token " + std::to_string(t) + ": the router picks experts " + show_ids(got, k) + ", a sort picks " +
             show_ids(want.data(), k);
    router_weights(c, scores.data(), want.data(), weights.data());
    const std::vector<float> row(f.routing.topk_w.begin() + at(t, k), f.routing.topk_w.begin() + at(t + 1, k));
    if (auto v = compare_bits("topk_w of token " + std::to_string(t), row, weights, k)) return v;
  }
  // Tie-heavy score vectors straight into the shared selection (scores and bias from a few levels).
  ref::Rng rng(cp.aux_seed);
  std::vector<float> level_bias(E);
  HostSelectScratch scratch(c);
  std::vector<int32_t> got(k);
  for (int trial = 0; trial < 32; ++trial) {
    for (int e = 0; e < E; ++e) {
      scores[e] = float(rng.below(4)) * 0.25f;
      level_bias[e] = float(rng.below(3)) * 0.125f;
    }
    const float* trial_bias = bias ? level_bias.data() : nullptr;
    router_select(c, scores.data(), trial_bias, scratch.view(), got.data());
    const std::vector<int32_t> want = brute_force_topk(c, scores.data(), trial_bias);
    if (got != want)
      return "tie-heavy scores, trial " + std::to_string(trial) + ": router_select picks " + show_ids(got.data(), k) +
             ", a sort picks " + show_ids(want.data(), k);
  }
  return std::nullopt;
}

// ---- invalid inputs ----

// One attempted run: forward, then backward on the backward's own copies of x, the weights and the
// options, and on the forward's results after `tamper` (when set) has changed them.
struct Attempt {
  LayerConfig config;
  std::vector<bf16> x, dy;
  ref::LayerWeights weights;
  std::optional<ref::Routing> routing;
  ref::Options forward_options, backward_options;
  std::vector<bf16> backward_x;
  ref::LayerWeights backward_weights;
  void (*tamper)(ref::Forward& f) = nullptr;
};

enum class Stage : uint8_t { forward, backward };

// `says`: what the error must name, its own rule's words: another rule refusing the input would pass it
// otherwise (the size checks a config mutation trips anyway, the router's overflow that a NaN in x trips).
struct MutationDef {
  const char* name;
  Stage rejected_by;
  void (*apply)(Attempt& a, ref::Rng& rng);  // makes the attempt invalid
  bool (*applies)(const Attempt& a);         // nullptr: every problem can express the mutation
  const char* says;
};

constexpr bf16 kNaN{0x7fc0}, kInf{0x7f80}, kMaxBf16{0x7f7f};
constexpr float kNaNf = std::numeric_limits<float>::quiet_NaN(), kInff = std::numeric_limits<float>::infinity();

// One element of a non-empty tensor, at a random position, set to `value`.
template <class V, class T>
void poke(V& v, ref::Rng& rng, T value) {
  v[rng.below(int(v.size()))] = value;
}

LayerConfig& sigmoid_config(Attempt& a) {
  a.config.score_mode = ScoreMode::sigmoid;
  return a.config;
}

// Routing mutations (topk_*) act on a given routing; problems routed by the router get theirs as given.
const MutationDef kMutations[] = {
    {"ranks_zero", Stage::forward, [](Attempt& a, ref::Rng&) { a.config.ranks = 0; },
     nullptr, "ranks R = 0"},
    {"tokens_zero", Stage::forward, [](Attempt& a, ref::Rng&) { a.config.tokens_per_rank = 0; },
     nullptr, "tokens per rank T = 0"},
    {"ranks_not_dividing_experts", Stage::forward,
     [](Attempt& a, ref::Rng&) { a.config.ranks = a.config.experts + 1; },
     nullptr, "is not a multiple of ranks R"},
    {"experts_zero", Stage::forward, [](Attempt& a, ref::Rng&) { a.config.experts = 0; },
     nullptr, "experts E = 0"},
    {"experts_too_many", Stage::forward, [](Attempt& a, ref::Rng&) { a.config.experts = kMaxExperts + 1; },
     nullptr, "need 1 <= E <= "},
    {"top_k_zero", Stage::forward, [](Attempt& a, ref::Rng&) { a.config.top_k = 0; },
     nullptr, "top_k k = 0"},
    {"top_k_above_experts", Stage::forward, [](Attempt& a, ref::Rng&) { a.config.top_k = a.config.experts + 1; },
     nullptr, "need 1 <= k <= E"},
    {"hidden_not_multiple", Stage::forward, [](Attempt& a, ref::Rng&) { a.config.hidden += 32; },
     nullptr, "(need a positive multiple of 64)"},
    {"intermediate_zero", Stage::forward, [](Attempt& a, ref::Rng&) { a.config.intermediate = 0; },
     nullptr, "intermediate I = 0"},
    {"shared_not_multiple", Stage::forward, [](Attempt& a, ref::Rng&) { a.config.shared_intermediate = 32; },
     nullptr, "shared_intermediate = 32"},
    {"fp8_hidden_not_multiple_of_128", Stage::forward,
     [](Attempt& a, ref::Rng&) {
       a.config.precision = Precision::fp8;
       a.config.hidden = 3 * kShapeMultiple;
     },
     nullptr, "the fp8 mode's block size"},
    {"precision_unknown", Stage::forward, [](Attempt& a, ref::Rng&) { a.config.precision = Precision(2); },
     nullptr, "need 0 = bf16 or 1 = fp8"},
    {"swiglu_limit_negative", Stage::forward, [](Attempt& a, ref::Rng&) { a.config.swiglu_limit = -1; },
     nullptr, "swiglu_limit must be"},
    {"swiglu_limit_nan", Stage::forward, [](Attempt& a, ref::Rng&) { a.config.swiglu_limit = kNaNf; },
     nullptr, "swiglu_limit must be"},
    {"swiglu_limit_inf", Stage::forward, [](Attempt& a, ref::Rng&) { a.config.swiglu_limit = kInff; },
     nullptr, "swiglu_limit must be"},
    {"n_group_not_dividing", Stage::forward,
     [](Attempt& a, ref::Rng&) { sigmoid_config(a).n_group = a.config.experts + 1; },
     nullptr, "must divide E"},
    {"topk_group_above_n_group", Stage::forward,
     [](Attempt& a, ref::Rng&) { sigmoid_config(a).topk_group = a.config.n_group + 1; },
     nullptr, "need 1 <= topk_group <= n_group"},
    {"topk_group_zero", Stage::forward, [](Attempt& a, ref::Rng&) { sigmoid_config(a).topk_group = 0; },
     nullptr, "need 1 <= topk_group <= n_group"},
    {"top_k_beyond_kept_groups", Stage::forward,
     [](Attempt& a, ref::Rng&) {
       LayerConfig& c = sigmoid_config(a);
       c.n_group = c.experts;
       c.topk_group = 1;
       c.top_k = 2;
     },
     [](const Attempt& a) { return a.config.experts >= 2; }, "exceeds the experts in the kept groups"},
    {"n_group_in_softmax", Stage::forward,
     [](Attempt& a, ref::Rng&) {
       a.config.score_mode = ScoreMode::softmax;
       a.config.n_group = 2;
     },
     nullptr, "n_group = 2 is sigmoid mode's"},
    {"routed_scale_in_softmax", Stage::forward,
     [](Attempt& a, ref::Rng&) {
       a.config.score_mode = ScoreMode::softmax;
       a.config.n_group = a.config.topk_group = 1;
       a.config.routed_scale = 16.0f;
     },
     nullptr, "routed_scale is sigmoid mode's"},
    {"routed_scale_zero", Stage::forward, [](Attempt& a, ref::Rng&) { sigmoid_config(a).routed_scale = 0; },
     nullptr, "routed_scale must be positive and finite"},
    {"routed_scale_nan", Stage::forward, [](Attempt& a, ref::Rng&) { sigmoid_config(a).routed_scale = kNaNf; },
     nullptr, "routed_scale must be positive and finite"},
    {"x_short", Stage::forward, [](Attempt& a, ref::Rng&) { a.x.pop_back(); }, nullptr, "x [N, H] has "},
    {"x_nan", Stage::forward, [](Attempt& a, ref::Rng& rng) { poke(a.x, rng, kNaN); },
     nullptr, "x [N, H] holds NaN or Inf"},
    {"x_inf", Stage::forward, [](Attempt& a, ref::Rng& rng) { poke(a.x, rng, kInf); },
     nullptr, "x [N, H] holds NaN or Inf"},
    {"router_nan", Stage::forward, [](Attempt& a, ref::Rng& rng) { poke(a.weights.router, rng, kNaNf); },
     nullptr, "router weight holds NaN or Inf"},
    {"router_short", Stage::forward, [](Attempt& a, ref::Rng&) { a.weights.router.pop_back(); },
     nullptr, "router weight [E, H] has "},
    {"router_logit_overflow", Stage::forward,
     [](Attempt& a, ref::Rng&) {
       a.routing.reset();
       std::fill(a.x.begin(), a.x.end(), kMaxBf16);
       std::fill(a.weights.router.begin(), a.weights.router.end(), 1.0f);
     },
     nullptr, "router logit of token "},
    {"expert_bias_wrong_size", Stage::forward,
     [](Attempt& a, ref::Rng&) { a.weights.expert_bias.assign(a.config.experts + 1, 0.0f); },
      nullptr, "expert_bias [E] has "},
    {"expert_bias_inf", Stage::forward,
     [](Attempt& a, ref::Rng& rng) {
       a.weights.expert_bias.resize(a.config.experts);
       poke(a.weights.expert_bias, rng, kInff);
     },
     nullptr, "expert_bias holds NaN or Inf"},
    {"w1_inf", Stage::forward, [](Attempt& a, ref::Rng& rng) { poke(a.weights.w1, rng, kInf); },
     nullptr, "expert weights hold NaN or Inf"},
    {"w1_short", Stage::forward, [](Attempt& a, ref::Rng&) { a.weights.w1.pop_back(); }, nullptr, "w1 [E, 2I, H] has "},
    {"w2_nan", Stage::forward, [](Attempt& a, ref::Rng& rng) { poke(a.weights.w2, rng, kNaN); },
     nullptr, "expert weights hold NaN or Inf"},
    {"shared_w1_nan", Stage::forward, [](Attempt& a, ref::Rng& rng) { poke(a.weights.shared_w1, rng, kNaN); },
     [](const Attempt& a) { return a.config.has_shared(); }, "shared expert weights hold NaN or Inf"},
    {"shared_w2_extra", Stage::forward, [](Attempt& a, ref::Rng&) { a.weights.shared_w2.push_back(bf16{0}); },
     nullptr, "shared_w2 [H, Is] has "},
    {"topk_idx_negative", Stage::forward, [](Attempt& a, ref::Rng& rng) { poke(a.routing->topk_idx, rng, -1); },
     nullptr, "] = -1 is outside [0, "},
    {"topk_idx_too_big", Stage::forward,
     [](Attempt& a, ref::Rng& rng) { poke(a.routing->topk_idx, rng, a.config.experts); }, nullptr, " is outside [0, "},
    {"topk_idx_duplicate", Stage::forward,
     [](Attempt& a, ref::Rng& rng) {
       int32_t* row = a.routing->topk_idx.data() + at(rng.below(a.config.tokens()), a.config.top_k);
       row[1] = row[0];
     },
     [](const Attempt& a) { return a.config.top_k >= 2; }, " twice"},
    {"topk_idx_short", Stage::forward, [](Attempt& a, ref::Rng&) { a.routing->topk_idx.pop_back(); },
     nullptr, "given topk_idx [N, k] has "},
    {"topk_w_nan", Stage::forward, [](Attempt& a, ref::Rng& rng) { poke(a.routing->topk_w, rng, kNaNf); },
     nullptr, "given topk_w holds NaN or Inf"},
    {"topk_w_long", Stage::forward, [](Attempt& a, ref::Rng&) { a.routing->topk_w.push_back(0.5f); },
     nullptr, "given topk_w [N, k] has "},
    {"ring_rows_zero", Stage::forward, [](Attempt& a, ref::Rng&) { a.forward_options.ring_rows = 0; },
     nullptr, "ring_rows = 0 is not a positive multiple"},
    {"ring_rows_not_multiple", Stage::forward, [](Attempt& a, ref::Rng&) { a.forward_options.ring_rows = 24; },
     nullptr, "ring_rows = 24 is not a positive multiple"},
    {"ring_rows_negative", Stage::forward, [](Attempt& a, ref::Rng&) { a.forward_options.ring_rows = -16; },
     nullptr, "ring_rows = -16 is not a positive multiple"},
    {"dy_short", Stage::backward, [](Attempt& a, ref::Rng&) { a.dy.pop_back(); }, nullptr, "dy [N, H] has "},
    {"dy_nan", Stage::backward, [](Attempt& a, ref::Rng& rng) { poke(a.dy, rng, kNaN); },
     nullptr, "dy [N, H] holds NaN or Inf"},
    {"dy_inf", Stage::backward, [](Attempt& a, ref::Rng& rng) { poke(a.dy, rng, bf16{0xff80}); },
     nullptr, "dy [N, H] holds NaN or Inf"},
    {"backward_ring_rows_not_multiple", Stage::backward,
     [](Attempt& a, ref::Rng&) { a.backward_options.ring_rows = 8; },
      nullptr, "ring_rows = 8 is not a positive multiple"},
    {"backward_x_short", Stage::backward, [](Attempt& a, ref::Rng&) { a.backward_x.pop_back(); },
     nullptr, "x [N, H] has "},
    {"backward_x_nan", Stage::backward, [](Attempt& a, ref::Rng& rng) { poke(a.backward_x, rng, kNaN); },
     nullptr, "x [N, H] holds NaN or Inf"},
    {"backward_w1_short", Stage::backward, [](Attempt& a, ref::Rng&) { a.backward_weights.w1.pop_back(); },
     nullptr, "w1 [E, 2I, H] has "},
    {"backward_w2_inf", Stage::backward, [](Attempt& a, ref::Rng& rng) { poke(a.backward_weights.w2, rng, kInf); },
     nullptr, "expert weights hold NaN or Inf"},
    {"backward_forward_layout_short", Stage::backward,
     [](Attempt& a, ref::Rng&) { a.tamper = [](ref::Forward& f) { f.layout.row_source.pop_back(); }; },
      nullptr, "the forward's dispatch layout is no layout of this config"},
    {"backward_forward_layout_of_another_routing", Stage::backward,
     [](Attempt& a, ref::Rng&) {
       // The first and last layout rows trade slots: each then serves a slot of another expert, or within
       // one expert the token order breaks.
       a.tamper = [](ref::Forward& f) {
         std::vector<int32_t>& source = f.layout.row_source;
         std::swap(source.front(), source.back());
         f.layout.slot_row[source.front()] = 0;
         f.layout.slot_row[source.back()] = int32_t(source.size()) - 1;
       };
     },
     [](const Attempt& a) { return a.config.routed_rows() >= 2; },
      "is not this topk_idx's: its dispatch layout routes token"},
    {"backward_forward_routing_short", Stage::backward,
     [](Attempt& a, ref::Rng&) { a.tamper = [](ref::Forward& f) { f.routing.topk_w.pop_back(); }; },
      nullptr, "topk_w [N, k] has "},
    {"backward_without_saved_activations", Stage::backward,
     [](Attempt& a, ref::Rng&) {
       a.forward_options.recompute = true;
       a.backward_options.recompute = false;
     },
     nullptr, "forward saved no activations: use recompute"},
};

bool is_routing_mutation(const std::string& name) { return name.rfind("topk_", 0) == 0; }

Verdict invalid_inputs(Backend& b, const ref::Problem& p, const CaseParams& cp) {
  ref::Rng rng(cp.aux_seed);
  std::optional<ref::Routing> routed;  // the router's routing, given to the routing mutations
  for (const MutationDef& m : kMutations) {
    Attempt a{p.config, p.x, p.dy, p.weights, p.routing, cp.options, cp.options, p.x, p.weights};
    if (is_routing_mutation(m.name) && !a.routing) {
      if (!routed) routed = b.forward(p.config, p.x, p.weights, nullptr, cp.options).routing;
      a.routing = routed;
    }
    if (m.applies && !m.applies(a)) continue;
    m.apply(a, rng);
    const std::string what = std::string("invalid input ") + m.name;
    Stage stage = Stage::forward;
    try {
      ref::Forward f = b.forward(a.config, a.x, a.weights, a.routing ? &*a.routing : nullptr, a.forward_options);
      stage = Stage::backward;
      if (a.tamper) a.tamper(f);
      b.backward(a.config, a.backward_x, a.backward_weights, f, a.dy, a.backward_options);
    } catch (const Error& e) {
      if (stage == m.rejected_by && std::string(e.what()).find(m.says) == std::string::npos)
        return what + " was refused, but not by its rule (its error must say '" + m.says + "'): " + e.what();
      if (stage == m.rejected_by) continue;
      return what +
             (stage == Stage::backward ? " passed the forward; only the backward rejected it: "
                                       : " (a backward input) made the forward fail: ") +
             e.what();
    } catch (const std::bad_alloc&) {
      throw;
    } catch (const std::exception& e) {
      return what + " threw something other than mok::Error: " + e.what();
    }
    return what + " was accepted";
  }
  return std::nullopt;
}

// ---- fp64 oracle ----

Verdict oracle_bounds(Backend& b, const ref::Problem& p, const CaseParams& cp) {
  const Run r = run_layer(b, p, cp.options);
  // The oracle takes the SwiGLU clamp's branches from the layer's bf16 h (docs/accuracy.md). A
  // recompute-mode forward saves none: its backward recomputes the bits a saving forward keeps.
  ref::Forward decided;
  if (p.config.swiglu_limit > 0 && r.fwd.h.empty()) {
    ref::Options saving = cp.options;
    saving.recompute = false;
    decided = b.forward(p.config, p.x, p.weights, given_of(p), saving);
  }
  const ref::Forward& branches = decided.h.empty() ? r.fwd : decided;
  const ref::OracleResult want = ref::oracle(ref::oracle_inputs(p.config, p.x, p.weights, p.dy, branches));
  for (const ref::OracleCheck& check : ref::compare_with_oracle(r.fwd, r.grad, want))
    if (!check.passed()) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "%s: relative error %.3e, max_abs %.3e of max_ref %.3e, bound %.3e",
                    ref::to_string(check.tensor), check.error.relative, check.error.max_abs, check.error.max_ref,
                    check.bound);
      return std::string(buf);
    }
  return std::nullopt;
}

}  // namespace

std::vector<int32_t> brute_force_topk(const LayerConfig& c, const float* scores, const float* bias) {
  const int E = c.experts;
  const bool sigmoid = c.score_mode == ScoreMode::sigmoid;
  std::vector<float> key(E);
  for (int e = 0; e < E; ++e) key[e] = sigmoid && bias ? scores[e] + bias[e] : scores[e];
  const auto by_value = [](const std::vector<float>& v) {
    return [&v](int a, int b) { return v[a] > v[b] || (v[a] == v[b] && a < b); };
  };
  std::vector<int> candidates;
  if (sigmoid && c.n_group > 1) {
    const int per = E / c.n_group;
    std::vector<float> group_key(c.n_group);
    for (int g = 0; g < c.n_group; ++g) {
      std::vector<int> members = iota_rows(per);
      for (int& m : members) m += g * per;
      std::sort(members.begin(), members.end(), by_value(key));
      group_key[g] = per > 1 ? key[members[0]] + key[members[1]] : key[members[0]];
    }
    std::vector<int> groups = iota_rows(c.n_group);
    std::sort(groups.begin(), groups.end(), by_value(group_key));
    for (int i = 0; i < c.topk_group; ++i)
      for (int e = groups[i] * per; e < (groups[i] + 1) * per; ++e) candidates.push_back(e);
  } else {
    candidates = iota_rows(E);
  }
  std::sort(candidates.begin(), candidates.end(), by_value(key));
  return std::vector<int32_t>(candidates.begin(), candidates.begin() + c.top_k);
}

std::vector<std::string> mutation_names() {
  std::vector<std::string> names;
  for (const MutationDef& m : kMutations) names.push_back(m.name);
  return names;
}

const std::vector<Property>& all_properties() {
  static const std::vector<Property> properties = {
      {"repeat", "D1: the same inputs twice give the same bits in every output", repeat},
      {"rank_invariance", "D2: every R dividing N and E gives the same bits in every output", rank_invariance},
      {"ring_invariance", "ring_rows and recompute change no output bit", ring_invariance},
      {"replay_ids", "replaying the router's own expert ids gives the router's bits in every output", replay_own_ids},
      {"batch_invariance", "D4: a token's routing and y are the same bits inside any sub-batch", batch_invariance},
      {"permutation", "permuting the tokens (and a given routing) permutes every per-token output", permutation},
      {"conservation", "every routed (token, slot) lands once in the layout and comes back once, summed in slot order",
       conservation},
      {"router_backward", "d logits and dWr are the shared router backward of d topk_w, bit for bit", router_backward},
      {"topk", "the router's top-k is a brute-force sort with ties to the lower expert index", topk},
      {"invalid_inputs", "every invalid input is rejected with mok::Error at the right stage", invalid_inputs},
      {"oracle", "every output within its fp64-oracle bound", oracle_bounds},
  };
  return properties;
}

const Property* property_named(const std::string& name) {
  for (const Property& p : all_properties())
    if (p.name == name) return &p;
  return nullptr;
}

std::string unknown_property(const std::string& name) {
  std::string names;
  for (const Property& p : all_properties()) names += " " + p.name;
  return "unknown property " + quote_input(name) + " (one of:" + names + ")";
}

const Property& find_property(const std::string& name) {
  if (const Property* p = property_named(name)) return *p;
  throw Error("mok-fuzz: " + unknown_property(name));
}

Verdict run_check(const Property& p, Backend& backend, const ref::Problem& problem, const CaseParams& params) {
  try {
    return p.check(backend, problem, params);
  } catch (const std::bad_alloc&) {
    throw;  // the machine's failure, not the layer's answer
  } catch (const std::exception& e) {
    return std::string("unexpected exception: ") + e.what();
  }
}

}  // namespace mok::fuzz
