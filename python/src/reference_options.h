// The reference's options for an op call, one mapping for the CPU op and for the goldens mok.capture
// writes: the tensor-core step model (every bit the GPU's) and the call's ring, routing mode, recompute
// and fp8 weight gradients.
#pragma once

#include "mok/reference/layer.h"
#include "op_config.h"

namespace mok::py {

inline ref::Options reference_options(const Call& call) {
  ref::Options opt;
  opt.step = StepModel::hopper_tc;
  if (call.ring_rows) opt.ring_rows = call.ring_rows;  // else the reference's default: no bit depends on it
  opt.replay_ids = call.mode == RoutingMode::replay_ids;
  opt.recompute = call.recompute;
  opt.fp8_weight_gradients = call.fp8_weight_gradients;
  return opt;
}

}  // namespace mok::py
