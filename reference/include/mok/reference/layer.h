// The CPU reference of the MoE layer (docs/design.md) over R simulated expert-parallel ranks.
// Every numerical step is the shared core's (mok/core); this file only moves data the way the
// megakernel does: pull dispatch into a ring of whole 16-row chunks, push combine into per-slot
// buffers on the source rank, slot-ordered sums there. docs/numerics.md lists every rounding point.
#pragma once

#include <cstdint>
#include <vector>

#include "mok/core/bf16.h"
#include "mok/core/config.h"
#include "mok/core/kstep.h"
#include "mok/core/layer_io.h"
#include "mok/core/validate.h"

namespace mok::ref {

// Planted bugs, only for proving that the fuzzer catches each kind (fuzz/, docs/fuzzing.md). Never set
// outside fault-injection runs; Fault::none, the default, costs one untaken branch per step.
enum class Fault : uint8_t {
  none = 0,
  combine_order,      // forward combine sums the slots in reverse order
  layout_off_by_one,  // the first non-empty expert's last layout row goes to the next expert
  tie_higher_index,   // router ties break toward the higher expert index
  drop_overflow,      // forward rows beyond 2 * ceil(N k / E) per expert are silently dropped
  router_grad_sign,   // d logits with the wrong sign
  // combine_order only where a determinism property varies something (each property's planted fault):
  rank_combine_order,      // on ranks r > 0 (rank_invariance)
  ring_combine_order,      // with a ring of fewer than 64 rows (ring_invariance)
  call_combine_order,      // in every other forward of the process (repeat)
  position_combine_order,  // for odd global token ids (permutation, batch_invariance)
};

struct Options {
  // The K-step model of the bf16 GEMMs (in the fp8 mode: the weight gradients' only).
  StepModel step = StepModel::hopper_tc;
  int ring_rows = 256;      // rows of the receive ring per minibatch: a positive multiple of 16
  bool recompute = false;   // the backward recomputes h instead of reading it saved
  bool replay_ids = false;  // with a given routing: replay its expert ids only; weights (and logits, and the
                            // router's gradients) from the live router (RoutingMode::replay_ids)
  // The fp8 mode's E4M3 weight gradients (docs/accuracy.md, "FP8 weight gradients"; the GPU's
  // LaunchConfig::fp8_weight_gradients): the routed experts' weight gradients on E4M3 operands too (dh,
  // x, bf16(w dy), a in 1 x 128 blocks along each expert's token rows, over all its rows at once, so
  // whatever ring_rows is). The shared expert's stay bf16.
  bool fp8_weight_gradients = false;
  Fault fault = Fault::none;
};

// The shared data structs live in core (mok/core/layer_io.h); the reference names them here too.
using mok::DispatchLayout;
using mok::Forward;
using mok::Gradients;
using mok::LayerWeights;
using mok::Routing;

// Input checks (mok/core/validate.h): mok::Error naming the problem on bad shapes, non-finite values,
// bad expert ids.
using mok::validate_inputs;

DispatchLayout build_dispatch_layout(const LayerConfig& c, const std::vector<int32_t>& topk_idx);

// Router alone: logits, then top-k ids (replay_ids: these, not the router's choice) and weights, per token.
Routing route(const LayerConfig& c, const std::vector<bf16>& x, const LayerWeights& w, std::vector<float>* logits,
              Fault fault = Fault::none, const std::vector<int32_t>* replay_ids = nullptr);

// given: a routing to replay instead of the router (nullptr: run the router); with opt.replay_ids only
// its topk_idx is read.
Forward forward(const LayerConfig& c, const std::vector<bf16>& x, const LayerWeights& w, const Routing* given,
                const Options& opt);

Gradients backward(const LayerConfig& c, const std::vector<bf16>& x, const LayerWeights& w, const Forward& fwd,
                   const std::vector<bf16>& dy, const Options& opt);

}  // namespace mok::ref
