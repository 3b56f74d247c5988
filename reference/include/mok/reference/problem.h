// Problem instances from a seed: inputs, weights and routings of every shape the tests, goldens and
// fuzzer need. The generator is our own (splitmix64), so a seed means the same data everywhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mok/reference/layer.h"

namespace mok::ref {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  double uniform();          // [0, 1)
  int below(int n);          // [0, n)
  float symmetric(float a);  // [-a, a)
  // The generator `draws` draws on: splitmix64's state is a counter (each draw adds one step), so a long
  // fill can be split over threads and give the values of one stream.
  Rng ahead(uint64_t draws) const { return Rng(state_ + draws * kStep); }

 private:
  static constexpr uint64_t kStep = 0x9e3779b97f4a7c15ull;
  uint64_t state_;
};

// The stream's next n draws of symmetric(a), rounded to bf16, filled in parallel (Rng::ahead: the
// values one thread would draw); rng is left past them. make_problem's tensors.
std::vector<bf16> bf16_symmetric(Rng& rng, size_t n, float a);

// How the tokens are routed: by the router itself, or a given routing of one of these kinds.
enum class RoutingKind : uint8_t {
  router,       // the layer's router on the random weights
  router_ties,  // the router, with expert pairs sharing router rows (and bias): exact score ties
  uniform,      // given: k distinct experts uniformly
  zipf,         // given: expert e drawn with probability ~ 1 / (e + 1)^zipf_s
  one_hot,      // given: every token's slot 0 is expert 0, the rest uniform
  all_to_one,   // given: every token to experts 0..k-1 (with k = 1, all to one expert)
  sparse,       // given: only ceil(E / 8) experts (at least k) receive tokens
};

// router and router_ties: no given routing (the layer's router routes).
inline bool routed_by_router(RoutingKind kind) {
  return kind == RoutingKind::router || kind == RoutingKind::router_ties;
}

std::string to_string(RoutingKind kind);
RoutingKind routing_kind_from_string(const std::string& name);  // throws mok::Error

struct Problem {
  LayerConfig config;
  std::vector<bf16> x;   // [N, H]
  std::vector<bf16> dy;  // [N, H]
  LayerWeights weights;
  std::optional<Routing> routing;  // set for the given kinds
};

// The multiple of its tensors (problem_bytes) a problem's users hold at once, which make_problem checks
// against the memory this process may take: a problem and the reference's run of it (mok-reference-timing:
// 1.35 measured); mok-bench holds the problem and its input sets (mok-bench --same-bits checks for its two
// steps' results apart).
inline constexpr double kProblemCopies = 1.5;

// The Zipf exponent of RoutingKind::zipf: finite and >= 0 (mok::Error otherwise).
void validate_zipf_s(double s);

// Values: x, dy uniform in [-1, 1); expert weights uniform with variance 1/K; router rows uniform
// with variance 1/H (times 4 for sharper scores); bias uniform in [-0.1, 0.1) in sigmoid mode.
// Validates the config, the Zipf exponent (for the zipf kind) and that the problem fits in this
// machine's memory (mok/core/validate.h) before allocating anything.
Problem make_problem(const LayerConfig& c, uint64_t seed, RoutingKind kind = RoutingKind::router, double zipf_s = 1.2);

}  // namespace mok::ref
