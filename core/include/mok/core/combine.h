// Per-element combines: the source rank sums what came back for its token, in slot order.
//   y[t]  = bf16( shared_y[t] + sum_j fma(w_j, y_j[t]) )           (fma per slot, from shared or +0)
//   dx[t] = bf16( shared_dx[t] + sum_j dx_j[t] + router_dx[t] )      (plain adds in that order)
// Per-slot expert results arrive as bf16; the router's share of dx is fp32.
#pragma once

#include "mok/core/bf16.h"

namespace mok {

// The sums run in pieces: a *_chain call continues acc over slots [first, first + n); the GPU steps
// one slot at a time through vectors it loaded in batches. A whole combine is one piece.
template <class Slot>
MOK_HD float combine_y_chain(int first, int n, const float* w, Slot slot, float acc) {
  for (int j = first; j < first + n; ++j) acc = fma32(w[j], to_float(slot(j)), acc);
  return acc;
}

template <class Slot>
MOK_HD bf16 combine_y(int k, float shared, const float* w, Slot slot) {
  return to_bf16(combine_y_chain(0, k, w, slot, shared));
}

template <class Slot>
MOK_HD float combine_dx_chain(int first, int n, Slot slot, float acc) {
  for (int j = first; j < first + n; ++j) acc = acc + to_float(slot(j));
  return acc;
}

// dx from the slots' sum (shared first) and the router's share.
MOK_HD bf16 combine_dx_round(float slots_sum, float router) { return to_bf16(slots_sum + router); }

template <class Slot>
MOK_HD bf16 combine_dx(int k, float shared, Slot slot, float router) {
  return combine_dx_round(combine_dx_chain(0, k, slot, shared), router);
}

// The gradient reaching expert e's output for (token, slot): w * dy, rounded to bf16 (dW2's operand),
// for two adjacent elements as one word (as the GPU's pull moves them; to_bf16x2) ...
MOK_HD uint32_t weighted_dy_words(float w, uint32_t dy) { return to_bf16x2(w * low_float(dy), w * high_float(dy)); }
// ... and for one element (the CPU's): its low half.
MOK_HD bf16 weighted_dy(float w, bf16 dy) { return bf16{uint16_t(weighted_dy_words(w, dy.bits) & 0xffffu)}; }

}  // namespace mok
