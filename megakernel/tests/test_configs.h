// Configs the GPU tests share.
#pragma once

#include "mok/core/config.h"

namespace mok::gpu {

// c with every routing and expert branch on at once: sigmoid, group-limited routing with a routed
// scale, a shared expert, the clamped SwiGLU (E must be a multiple of 4: 4 groups).
inline LayerConfig with_every_branch(LayerConfig c) {
  c.score_mode = ScoreMode::sigmoid;
  c.n_group = 4;
  c.topk_group = 2;
  c.routed_scale = 2.5f;
  c.shared_intermediate = 64;
  c.swiglu_limit = 0.75f;
  return c;
}

}  // namespace mok::gpu
