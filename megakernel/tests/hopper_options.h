// The reference's options for the GPU's bits, which the megakernel's GPU tests share.
#pragma once

#include "mok/reference/layer.h"

namespace mok::gpu {

// Its K-steps those of Hopper's tensor cores; recompute: the backward recomputes h and a.
inline ref::Options hopper_options(bool recompute = false) {
  ref::Options opt;
  opt.step = StepModel::hopper_tc;
  opt.recompute = recompute;
  return opt;
}

}  // namespace mok::gpu
