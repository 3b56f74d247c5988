// The layer's configuration: a plain struct that travels to the device as it is.
#pragma once

#include <stdexcept>
#include <string>

#include "mok/core/host_device.h"

namespace mok {

// Any bad input (shape, value, file) is reported as this, with a message naming the problem.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class ScoreMode : uint8_t { softmax = 0, sigmoid = 1 };

inline constexpr int kMaxExperts = 512;    // router scratch is sized by this on the device
inline constexpr int kShapeMultiple = 64;  // H, I and the shared expert's I are multiples of this

struct LayerConfig {
  int32_t ranks = 1;            // R, simulated or real expert-parallel ranks
  int32_t tokens_per_rank = 1;  // T
  int32_t experts = 1;          // E, E / R on each rank
  int32_t hidden = 64;          // H
  int32_t intermediate = 64;    // I
  int32_t top_k = 1;            // k
  ScoreMode score_mode = ScoreMode::softmax;
  bool renormalize = true;          // divide the selected weights by their sum
  int32_t n_group = 1;              // sigmoid mode: expert groups (DeepSeek-V3 n_group)
  int32_t topk_group = 1;           // sigmoid mode: groups kept (DeepSeek-V3 topk_group)
  float routed_scale = 1.0f;        // sigmoid mode: weights times this
  float swiglu_limit = 0.0f;        // > 0: gate clamped above, up clamped to [-limit, limit]
  int32_t shared_intermediate = 0;  // > 0: a shared SwiGLU expert of this intermediate size

  MOK_HD int tokens() const { return ranks * tokens_per_rank; }
  MOK_HD int experts_per_rank() const { return experts / ranks; }
  MOK_HD int expert_rank(int e) const { return e / experts_per_rank(); }
  MOK_HD int token_rank(int g) const { return g / tokens_per_rank; }
  MOK_HD int routed_rows() const { return tokens() * top_k; }
  MOK_HD bool has_shared() const { return shared_intermediate > 0; }
};

// A config from its shapes, everything else at its default.
inline LayerConfig make_config(int ranks, int tokens_per_rank, int hidden, int intermediate, int experts, int top_k) {
  LayerConfig c;
  c.ranks = ranks;
  c.tokens_per_rank = tokens_per_rank;
  c.hidden = hidden;
  c.intermediate = intermediate;
  c.experts = experts;
  c.top_k = top_k;
  return c;
}

inline void require(bool ok, const std::string& what) {
  if (!ok) throw Error("mok: invalid input: " + what);
}

inline void validate(const LayerConfig& c) {
  const auto n = [](const char* name, long v) { return std::string(name) + " = " + std::to_string(v); };
  require(c.ranks >= 1, n("ranks R", c.ranks) + " (need R >= 1)");
  require(c.tokens_per_rank >= 1, n("tokens per rank T", c.tokens_per_rank) + " (need T >= 1)");
  require(c.experts >= 1 && c.experts <= kMaxExperts,
          n("experts E", c.experts) + " (need 1 <= E <= " + std::to_string(kMaxExperts) + ")");
  require(c.experts % c.ranks == 0, n("experts E", c.experts) + " is not a multiple of " + n("ranks R", c.ranks));
  require(c.top_k >= 1 && c.top_k <= c.experts,
          n("top_k k", c.top_k) + " (need 1 <= k <= E = " + std::to_string(c.experts) + ")");
  require(c.hidden > 0 && c.hidden % kShapeMultiple == 0,
          n("hidden H", c.hidden) + " (need a positive multiple of 64)");
  require(c.intermediate > 0 && c.intermediate % kShapeMultiple == 0,
          n("intermediate I", c.intermediate) + " (need a positive multiple of 64)");
  require(c.shared_intermediate >= 0 && c.shared_intermediate % kShapeMultiple == 0,
          n("shared_intermediate", c.shared_intermediate) + " (need 0 or a multiple of 64)");
  require(c.swiglu_limit >= 0.0f && c.swiglu_limit < 3.0e38f, "swiglu_limit must be >= 0 and finite");
  require(long(c.tokens()) * c.top_k < (1l << 31) && long(c.tokens()) * c.hidden < (1l << 40),
          "problem too large for 32-bit row indices");
  if (c.score_mode == ScoreMode::sigmoid) {
    require(c.n_group >= 1 && c.experts % c.n_group == 0,
            n("n_group", c.n_group) + " must divide " + n("E", c.experts));
    require(c.topk_group >= 1 && c.topk_group <= c.n_group,
            n("topk_group", c.topk_group) + " (need 1 <= topk_group <= n_group)");
    require(c.top_k <= c.topk_group * (c.experts / c.n_group),
            n("top_k", c.top_k) + " exceeds the experts in the kept groups");
    require(c.routed_scale > 0.0f && c.routed_scale < 3.0e38f, "routed_scale must be positive and finite");
  }
}

}  // namespace mok
