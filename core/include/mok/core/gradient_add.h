// Weight gradients added into what the caller's tensors hold (GradOutputs::accumulate: a training
// step's micro-batches, autograd's .grad), element by element, as the GPU adds them: d_w1, d_w2 and the
// shared expert's by the TMA's reduce-add (store_rows_by_tma; TmaReduceAdd checks it against these),
// d_router by add_f32_gradient itself (store_router_grad). A NaN sum is the GPU's canonical NaN,
// whatever NaN came in (x86's add would keep an input's payload): the bits autograd's CUDA adds write too.
#pragma once

#include "mok/core/bf16.h"

namespace mok {

inline constexpr uint16_t kCanonicalNanBf16 = 0x7fffu;

// held + gradient: one fp32 add, round to nearest even, subnormal inputs and results kept.
MOK_HD float add_f32_gradient(float held, float gradient) { return canonical_nan(held + gradient); }

// autograd's step for a bf16 .grad: the gradient rounded to bf16 (the op's output), then added to what
// is held in fp32 and rounded again. Rounding a sum of two bf16 values to fp32, then to bf16, is rounding
// it once to bf16 (fp32's 24 bits are at least 2 * 8 + 2), so this is also the correctly rounded bf16
// add of held and bf16(gradient) that the TMA performs under a bf16 map (docs/numerics.md, backward step 10).
MOK_HD bf16 add_bf16_gradient(bf16 held, float gradient) {
  const float sum = to_float(held) + to_float(to_bf16(gradient));
  return sum != sum ? bf16{kCanonicalNanBf16} : to_bf16(sum);
}

}  // namespace mok
