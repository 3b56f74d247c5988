// One GPU's (or colocated share's) device tensors of Layer calls, in three tables: weights, forward,
// gradients. Each lists its tensors once, allocates them (DeviceTensor), gives the device API's views
// and poisons what a call writes. The host programs share them: the host-vector wrapper, the GPU tests,
// mok-procs and mok-host-cost. Share g of `shares` holds its tokens' rows and its experts' weights and
// gradients; the router and the shared expert are whole (docs/multi-gpu.md).
#pragma once

#include "mok/core/layer_io.h"
#include "mok/megakernel/device_tensor.h"
#include "mok/megakernel/layer.h"

namespace mok::gpu {

// Share g's weights, uploaded: its experts' w1 and w2, the router and the shared expert whole.
struct WeightTensors {
  DeviceTensor router, expert_bias, w1, w2, shared_w1, shared_w2;

  WeightTensors(const LayerConfig& c, const LayerWeights& w, int g, int shares);
  WeightViews views() const;
};

// A share's forward tensors: its tokens' x and results (saved holds the share's layout and rows).
struct ForwardTensors {
  DeviceTensor x, y, topk_idx, topk_w, logits, saved;

  ForwardTensors(const LayerConfig& c, size_t saved_bytes, int shares);
  ForwardOutputs views(RoutingMode mode) const;  // logits absent in mode given
  // What the forward writes (the given parts of the routing are inputs).
  void poison(RoutingMode mode);
};

// A share's dy and gradients: its tokens', its experts', and the router's and shared expert's whole (fp32).
struct GradTensors {
  DeviceTensor dy, dx, d_topk_w, d_logits, d_router, d_w1, d_w2, d_shared_w1, d_shared_w2;

  GradTensors(const LayerConfig& c, int shares);
  // d_logits, d_router absent in mode given
  GradOutputs views(RoutingMode mode, bool accumulate, BackwardScratch scratch = {}) const;
  // What the backward writes; accumulated weight gradients keep their sums.
  void poison(bool accumulate);
};

}  // namespace mok::gpu
