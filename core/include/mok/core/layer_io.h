// The layer's inputs and results as plain host data: the one vocabulary of the reference, the
// megakernel's host API, the golden files and the verifier. Shapes in the margin; N = R * T.
#pragma once

#include <cstdint>
#include <vector>

#include "mok/core/bf16.h"

namespace mok {

// How the forward gets its routing (RL routing replay):
//   router      the router computes logits, selects top-k and weights them;
//   replay_ids  topk_idx is given (a rollout's expert selection); logits and topk_w are computed from
//               the live router, and the router's gradient flows (routing replay / R3);
//   given       topk_idx and topk_w are given (full replay); no logits; d topk_w is their gradient.
enum class RoutingMode : uint8_t { router = 0, replay_ids = 1, given = 2 };

struct LayerWeights {
  std::vector<float> router;       // [E, H] fp32
  std::vector<float> expert_bias;  // [E] sigmoid-mode selection bias, empty means zeros; none in softmax
  std::vector<bf16> w1;            // [E, 2I, H]  rows 0..I-1 gate, I..2I-1 up
  std::vector<bf16> w2;            // [E, H, I]
  std::vector<bf16> shared_w1;     // [2Is, H]    empty without a shared expert
  std::vector<bf16> shared_w2;     // [H, Is]
};

struct Routing {
  std::vector<int32_t> topk_idx;  // [N, k]
  std::vector<float> topk_w;      // [N, k]
};

struct DispatchLayout {
  std::vector<int32_t> counts;      // [E]
  std::vector<int32_t> offsets;     // [E + 1]
  std::vector<int32_t> row_source;  // [N * k] layout row -> g * k + j
  std::vector<int32_t> slot_row;    // [N * k] g * k + j -> layout row
};

struct Forward {
  Routing routing;
  std::vector<float> logits;  // [N, E]; empty when the routing was given (replay)
  DispatchLayout layout;
  std::vector<bf16> y;  // [N, H]
  // [N * k, 2I] layout order, bf16(x W1^T); empty in recompute mode. Its a = bf16(swiglu(h)) is not
  // kept: the backward makes it from h again (the same bits), so a saved buffer holds none.
  std::vector<bf16> h;
  std::vector<bf16> shared_h;  // [N, 2Is]; empty in recompute mode
  std::vector<bf16> shared_a;  // [N, Is];  empty in recompute mode
};

struct Gradients {
  std::vector<bf16> dx;            // [N, H]
  std::vector<float> d_topk_w;     // [N, k]
  std::vector<float> d_logits;     // [N, E]; empty for a given routing
  std::vector<float> d_router;     // [E, H]; empty for a given routing
  std::vector<float> d_w1;         // [E, 2I, H]
  std::vector<float> d_w2;         // [E, H, I]
  std::vector<float> d_shared_w1;  // [2Is, H]
  std::vector<float> d_shared_w2;  // [H, Is]
};

}  // namespace mok
