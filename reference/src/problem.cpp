#include "mok/reference/problem.h"

#include <algorithm>
#include <cmath>

namespace mok::ref {

uint64_t Rng::next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Rng::uniform() { return double(next() >> 11) * 0x1.0p-53; }

int Rng::below(int n) { return int(uniform() * n); }

float Rng::symmetric(float a) { return float((2.0 * uniform() - 1.0) * a); }

namespace {

constexpr const char* kKindNames[] = {"router", "router_ties", "uniform", "zipf", "one_hot", "all_to_one", "sparse"};

std::vector<bf16> bf16_fill(Rng& rng, size_t n, float a) {
  std::vector<bf16> v(n);
  for (auto& b : v) b = to_bf16(rng.symmetric(a));
  return v;
}

// k distinct experts, each drawn from the weights `p` among those not taken yet.
void draw_distinct(Rng& rng, const std::vector<double>& p, int k, int32_t* out) {
  std::vector<bool> taken(p.size(), false);
  for (int j = 0; j < k; ++j) {
    double total = 0;
    for (size_t e = 0; e < p.size(); ++e) total += taken[e] ? 0 : p[e];
    double u = rng.uniform() * total;
    int pick = -1;
    for (size_t e = 0; e < p.size(); ++e) {
      if (taken[e] || p[e] == 0) continue;
      pick = int(e);
      if (u < p[e]) break;
      u -= p[e];
    }
    taken[pick] = true;
    out[j] = pick;
  }
}

Routing given_routing(const LayerConfig& c, RoutingKind kind, Rng& rng, double zipf_s) {
  const int N = c.tokens(), E = c.experts, k = c.top_k;
  Routing r;
  r.topk_idx.resize(size_t(N) * k);
  r.topk_w.resize(size_t(N) * k);
  std::vector<double> p(E, 1.0);
  if (kind == RoutingKind::zipf)
    for (int e = 0; e < E; ++e) p[e] = 1.0 / std::pow(e + 1.0, zipf_s);
  if (kind == RoutingKind::sparse) {
    const int live = std::max(k, (E + 7) / 8);
    for (int e = 0; e < E; ++e) p[e] = e % (E / live) == 0 && e / (E / live) < live ? 1.0 : 0.0;
  }
  for (int g = 0; g < N; ++g) {
    int32_t* idx = r.topk_idx.data() + size_t(g) * k;
    if (kind == RoutingKind::all_to_one) {
      for (int j = 0; j < k; ++j) idx[j] = j;
    } else if (kind == RoutingKind::one_hot) {
      std::vector<double> rest(p);
      rest[0] = 0;
      idx[0] = 0;
      draw_distinct(rng, rest, k - 1, idx + 1);
    } else {
      draw_distinct(rng, p, k, idx);
    }
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += (r.topk_w[size_t(g) * k + j] = float(0.05 + rng.uniform()));
    for (int j = 0; j < k; ++j) r.topk_w[size_t(g) * k + j] /= sum;
  }
  return r;
}

}  // namespace

std::string to_string(RoutingKind kind) { return kKindNames[int(kind)]; }

RoutingKind routing_kind_from_string(const std::string& name) {
  for (int i = 0; i < int(std::size(kKindNames)); ++i)
    if (name == kKindNames[i]) return RoutingKind(i);
  throw Error("mok: unknown routing kind '" + name + "'");
}

Problem make_problem(const LayerConfig& c, uint64_t seed, RoutingKind kind, double zipf_s) {
  validate(c);
  Rng rng(seed);
  const int N = c.tokens(), H = c.hidden, I = c.intermediate, E = c.experts, Is = c.shared_intermediate;
  Problem p;
  p.config = c;
  p.x = bf16_fill(rng, size_t(N) * H, 1.0f);
  p.dy = bf16_fill(rng, size_t(N) * H, 1.0f);
  const auto bound = [](int fan_in) { return float(std::sqrt(3.0 / fan_in)); };
  p.weights.router.resize(size_t(E) * H);
  for (auto& v : p.weights.router) v = rng.symmetric(2.0f * bound(H));
  if (c.score_mode == ScoreMode::sigmoid) {
    p.weights.expert_bias.resize(E);
    for (auto& v : p.weights.expert_bias) v = rng.symmetric(0.1f);
  }
  if (kind == RoutingKind::router_ties)
    for (int e = 1; e < E; e += 2) {
      std::copy_n(p.weights.router.begin() + size_t(e - 1) * H, H, p.weights.router.begin() + size_t(e) * H);
      if (!p.weights.expert_bias.empty()) p.weights.expert_bias[e] = p.weights.expert_bias[e - 1];
    }
  p.weights.w1 = bf16_fill(rng, size_t(E) * 2 * I * H, bound(H));
  p.weights.w2 = bf16_fill(rng, size_t(E) * H * I, bound(I));
  p.weights.shared_w1 = bf16_fill(rng, size_t(2) * Is * H, bound(H));
  p.weights.shared_w2 = bf16_fill(rng, size_t(H) * Is, bound(std::max(Is, 1)));
  if (kind != RoutingKind::router && kind != RoutingKind::router_ties) p.routing = given_routing(c, kind, rng, zipf_s);
  return p;
}

}  // namespace mok::ref
