// The launch that runs a CPU reference run's Options on the GPU, for the GPU backends of mok-fuzz and
// mok-verify (one mapping for both).
#pragma once

#include "mok/core/config.h"
#include "mok/megakernel/megakernel.h"
#include "mok/reference/layer.h"

namespace mok::tools {

// The ring rounded up to whole tiles (the bits do not depend on it, D3), the recompute mode, and the
// fp8 weight gradients where the mode is fp8 (the reference ignores the option in bf16).
inline gpu::LaunchConfig reference_launch(const LayerConfig& c, const ref::Options& opt) {
  gpu::LaunchConfig l;
  l.ring_rows = gpu::whole_tile_ring_rows(opt.ring_rows);
  l.recompute = opt.recompute;
  l.fp8_weight_gradients = opt.fp8_weight_gradients && c.precision == Precision::fp8;
  return l;
}

}  // namespace mok::tools
