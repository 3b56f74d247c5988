// Per-element combines: the source rank sums what came back for its token, in slot order.
//   y[t]  = bf16( shared_y[t] + sum_j fma(w_j, y_j[t]) )           (fma per slot, from shared or +0)
//   dx[t] = bf16( shared_dx[t] + sum_j dx_j[t] + router_dx[t] )      (plain adds in that order)
// Per-slot expert results arrive as bf16; the router's share of dx is fp32.
#pragma once

#include "mok/core/bf16.h"

namespace mok {

template <class Slot>
MOK_HD bf16 combine_y(int k, float shared, const float* w, Slot slot) {
  float acc = shared;
  for (int j = 0; j < k; ++j) acc = fma32(w[j], to_float(slot(j)), acc);
  return to_bf16(acc);
}

template <class Slot>
MOK_HD bf16 combine_dx(int k, float shared, Slot slot, float router) {
  float acc = shared;
  for (int j = 0; j < k; ++j) acc = acc + to_float(slot(j));
  return to_bf16(acc + router);
}

// The gradient reaching expert e's output for (token, slot): w * dy, rounded to bf16 (dW2's operand).
MOK_HD bf16 weighted_dy(float w, bf16 dy) { return to_bf16(w * to_float(dy)); }

}  // namespace mok
