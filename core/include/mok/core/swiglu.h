// SwiGLU and its backward, elementwise, optionally clamped (gpt-oss style limit on gate and up).
// Operands are the bf16-rounded h = [gate | up]; the result a is rounded to bf16 by the caller.
#pragma once

#include "mok/core/scalar.h"

namespace mok {

MOK_HD float clamp_gate(float gate, float limit) { return limit > 0.0f && gate > limit ? limit : gate; }

MOK_HD float clamp_up(float up, float limit) {
  if (limit <= 0.0f) return up;
  return up > limit ? limit : (up < -limit ? -limit : up);
}

// Each function also comes with the sigmoid of the clamped gate given, s = sigmoid_f32(clamp_gate(gate,
// limit)), so a GPU can take many sigmoids at once (sigmoids_f32).
MOK_HD float swiglu_given_sigmoid(float gate, float up, float limit, float s) {
  return silu_with_grad_given_sigmoid(clamp_gate(gate, limit), s).value * clamp_up(up, limit);
}
MOK_HD float swiglu(float gate, float up, float limit) {
  return swiglu_given_sigmoid(gate, up, limit, sigmoid_f32(clamp_gate(gate, limit)));
}

struct SwigluGrad {
  float gate;
  float up;
};

// da: the gradient reaching a. A clamped operand (beyond the limit, where there is one) passes no
// gradient; a NaN operand is not clamped: its NaN reaches the gradients that depend on it, as it reached a.
MOK_HD SwigluGrad swiglu_grad_given_sigmoid(float gate, float up, float da, float limit, float s) {
  const float g = clamp_gate(gate, limit);
  const float u = clamp_up(up, limit);
  const bool gate_clamped = limit > 0.0f && gate > limit;
  const bool up_clamped = limit > 0.0f && (up > limit || up < -limit);
  const SiluWithGrad silu = silu_with_grad_given_sigmoid(g, s);
  return SwigluGrad{gate_clamped ? 0.0f : (da * u) * silu.grad, up_clamped ? 0.0f : da * silu.value};
}
MOK_HD SwigluGrad swiglu_grad(float gate, float up, float da, float limit) {
  return swiglu_grad_given_sigmoid(gate, up, da, limit, sigmoid_f32(clamp_gate(gate, limit)));
}

}  // namespace mok
