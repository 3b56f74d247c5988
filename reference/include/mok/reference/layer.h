// The CPU reference of the MoE layer (DESIGN.md §2) over R simulated expert-parallel ranks.
// Every numerical step is the shared core's (mok/core); this file only moves data the way the
// megakernel does: pull dispatch into a ring of whole 16-row chunks, push combine into per-slot
// buffers on the source rank, slot-ordered sums there. docs/numerics.md lists every rounding point.
#pragma once

#include <cstdint>
#include <vector>

#include "mok/core/bf16.h"
#include "mok/core/config.h"
#include "mok/core/kstep.h"

namespace mok::ref {

struct LayerWeights {
  std::vector<float> router;       // [E, H] fp32
  std::vector<float> expert_bias;  // [E] sigmoid-mode selection bias; empty means zeros
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

struct Options {
  StepModel step = StepModel::hopper_tc;
  int ring_rows = 256;     // rows of the receive ring per minibatch: a positive multiple of 16
  bool recompute = false;  // the backward recomputes h and a instead of reading them saved
};

struct Forward {
  Routing routing;
  std::vector<float> logits;  // [N, E]; empty when the routing was given (replay)
  DispatchLayout layout;
  std::vector<bf16> y;         // [N, H]
  std::vector<bf16> h;         // [N * k, 2I] layout order, bf16(x W1^T); empty in recompute mode
  std::vector<bf16> a;         // [N * k, I]  layout order, bf16(swiglu(h)); empty in recompute mode
  std::vector<bf16> shared_h;  // [N, 2Is]
  std::vector<bf16> shared_a;  // [N, Is]
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

// Throws mok::Error naming the problem on bad shapes, non-finite values, bad expert ids.
void validate_inputs(const LayerConfig& c, const std::vector<bf16>& x, const LayerWeights& w, const Routing* given);

DispatchLayout build_dispatch_layout(const LayerConfig& c, const std::vector<int32_t>& topk_idx);

// Router alone: logits, then top-k ids and weights, per token.
Routing route(const LayerConfig& c, const std::vector<bf16>& x, const LayerWeights& w, std::vector<float>* logits);

// given: a routing to replay instead of the router (nullptr: run the router).
Forward forward(const LayerConfig& c, const std::vector<bf16>& x, const LayerWeights& w, const Routing* given,
                const Options& opt);

Gradients backward(const LayerConfig& c, const std::vector<bf16>& x, const LayerWeights& w, const Forward& fwd,
                   const std::vector<bf16>& dy, const Options& opt);

}  // namespace mok::ref
