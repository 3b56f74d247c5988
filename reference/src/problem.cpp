#include "mok/reference/problem.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "mok/core/validate.h"

namespace mok::ref {

uint64_t Rng::next() {
  uint64_t z = (state_ += kStep);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Rng::uniform() { return double(next() >> 11) * 0x1.0p-53; }

int Rng::below(int n) { return int(uniform() * n); }

float Rng::symmetric(float a) { return float((2.0 * uniform() - 1.0) * a); }

std::vector<bf16> bf16_symmetric(Rng& rng, size_t n, float a) {
  constexpr size_t kChunk = size_t(1) << 16;  // draws per thread's turn
  std::vector<bf16> v(n);
  const long chunks = long((n + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (long ch = 0; ch < chunks; ++ch) {
    const size_t begin = size_t(ch) * kChunk, end = std::min(n, begin + kChunk);
    Rng r = rng.ahead(begin);
    for (size_t i = begin; i < end; ++i) v[i] = to_bf16(r.symmetric(a));
  }
  rng = rng.ahead(n);
  return v;
}

namespace {

constexpr const char* kKindNames[] = {"router", "router_ties", "uniform", "zipf", "one_hot", "all_to_one", "sparse"};

// One expert not taken yet, drawn with probability p[e] / (the sum of p over those not taken).
int draw_one(Rng& rng, const std::vector<double>& p, const std::vector<bool>& taken) {
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
  if (pick < 0) fail_internal("draw_one: every expert left has weight 0");
  return pick;
}

// k distinct experts, each drawn from the weights `p` among those not taken yet.
void draw_distinct(Rng& rng, const std::vector<double>& p, int k, int32_t* out) {
  std::vector<bool> taken(p.size(), false);
  for (int j = 0; j < k; ++j) taken[out[j] = draw_one(rng, p, taken)] = true;
}

// Below this, the Zipf weights left are redrawn relative to the largest of them: weights down to 2^-62
// of it (below which a 53-bit uniform draw hardly picks them) are then still normal doubles.
constexpr double kZipfRescaleBelow = 0x1p-960;

// k distinct experts, expert e with weight (e + 1)^-s among those not taken yet. With a large s the
// weights of the later experts underflow to 0; once the largest weight left, that of the lowest expert
// m not taken, is that small, the weights left are taken relative to it, ((m + 1) / (e + 1))^s (at most
// 1, and 1 for m), so that any finite s >= 0 draws k experts. Where no weight left is that small (every
// committed golden and fuzz case) only the first form runs: their draws keep their bits.
void draw_zipf(Rng& rng, const std::vector<double>& zipf, double s, int k, int32_t* out) {
  std::vector<bool> taken(zipf.size(), false);
  std::vector<double> p = zipf;
  for (int j = 0; j < k; ++j) {
    const size_t m = size_t(std::find(taken.begin(), taken.end(), false) - taken.begin());
    if (p[m] < kZipfRescaleBelow)
      for (size_t e = 0; e < p.size(); ++e) p[e] = std::pow((m + 1.0) / (e + 1.0), s);
    taken[out[j] = draw_one(rng, p, taken)] = true;
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
    } else if (kind == RoutingKind::zipf) {
      draw_zipf(rng, p, zipf_s, k, idx);
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

std::string to_string(RoutingKind kind) {
  if (size_t(kind) >= std::size(kKindNames)) fail_internal("unknown routing kind " + std::to_string(int(kind)));
  return kKindNames[int(kind)];
}

RoutingKind routing_kind_from_string(const std::string& name) {
  for (int i = 0; i < int(std::size(kKindNames)); ++i)
    if (name == kKindNames[i]) return RoutingKind(i);
  throw Error("mok: unknown routing kind " + quote_input(name) +
              " (router, router_ties, uniform, zipf, one_hot, all_to_one or sparse)");
}

void validate_zipf_s(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", s);
  require(s >= 0 && s <= std::numeric_limits<double>::max(),
          "zipf_s = " + std::string(text) + " (need a finite Zipf exponent >= 0)");
}

Problem make_problem(const LayerConfig& c, uint64_t seed, RoutingKind kind, double zipf_s) {
  validate(c);
  require_fits_in_memory(c, kProblemCopies);
  if (kind == RoutingKind::zipf) validate_zipf_s(zipf_s);
  Rng rng(seed);
  const int N = c.tokens(), H = c.hidden, I = c.intermediate, E = c.experts, Is = c.shared_intermediate;
  Problem p;
  p.config = c;
  p.x = bf16_symmetric(rng, size_t(N) * H, 1.0f);
  p.dy = bf16_symmetric(rng, size_t(N) * H, 1.0f);
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
  p.weights.w1 = bf16_symmetric(rng, size_t(E) * 2 * I * H, bound(H));
  p.weights.w2 = bf16_symmetric(rng, size_t(E) * H * I, bound(I));
  p.weights.shared_w1 = bf16_symmetric(rng, size_t(2) * Is * H, bound(H));
  p.weights.shared_w2 = bf16_symmetric(rng, size_t(H) * Is, bound(std::max(Is, 1)));
  if (!routed_by_router(kind)) p.routing = given_routing(c, kind, rng, zipf_s);
  return p;
}

}  // namespace mok::ref
