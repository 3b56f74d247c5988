// The router's per-token math, host and device: scores, top-k selection (ties toward the lower
// expert id), the routing weights, and the backward from d topk_w to d logits.
// Every array is the caller's: E entries each (n_group for the group scratch).
#pragma once

#include <memory>
#include <vector>

#include "mok/core/config.h"
#include "mok/core/scalar.h"

namespace mok {

// scores[e] = softmax(logits)[e] (max-subtracted, sequential sum) or sigmoid(logits[e]).
MOK_HD void router_scores(const LayerConfig& c, const float* logits, float* scores) {
  const int E = c.experts;
  if (c.score_mode == ScoreMode::sigmoid) {
    for (int e = 0; e < E; ++e) scores[e] = sigmoid_f32(logits[e]);
    return;
  }
  float m = logits[0];
  for (int e = 1; e < E; ++e) m = logits[e] > m ? logits[e] : m;
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) {
    scores[e] = exp_f32(logits[e] - m);
    sum += scores[e];
  }
  for (int e = 0; e < E; ++e) scores[e] = scores[e] / sum;
}

// Index of the largest key among [begin, end) with allowed[i]; the lower index wins ties.
MOK_HD int argmax_allowed(const float* key, const bool* allowed, int begin, int end) {
  int best = -1;
  for (int i = begin; i < end; ++i)
    if (allowed[i] && (best < 0 || key[i] > key[best])) best = i;
  return best;
}

// The expert groups router_select ranks: n_group in sigmoid mode with groups, else none (n_group is
// not read, nor checked, in softmax mode).
MOK_HD int selected_groups(const LayerConfig& c) {
  return c.score_mode == ScoreMode::sigmoid && c.n_group > 1 ? c.n_group : 0;
}

// router_select's scratch, the caller's memory: key and allowed of E entries, group_key and
// group_allowed of selected_groups(c). (On the GPU a thread's lies in
// shared memory, not in its stack frame: router_scratch.cuh.)
struct SelectScratch {
  float* key;
  bool* allowed;
  float* group_key;
  bool* group_allowed;
};

// router_select's scratch in host memory (the reference, the fuzzer, the tests): the arrays, and their view.
struct HostSelectScratch {
  explicit HostSelectScratch(const LayerConfig& c)
      : key(c.experts),
        group_key(selected_groups(c)),
        allowed(std::make_unique<bool[]>(c.experts)),
        group_allowed(std::make_unique<bool[]>(selected_groups(c))) {}
  SelectScratch view() { return {key.data(), allowed.get(), group_key.data(), group_allowed.get()}; }

  std::vector<float> key, group_key;
  std::unique_ptr<bool[]> allowed, group_allowed;
};

// Selection key: the score, plus the per-expert bias in sigmoid mode (bias may be null).
// Sigmoid mode is group-limited: a group's rank is the sum of its two best keys (its only key
// when groups have one expert); the topk_group best groups stay eligible.
MOK_HD void router_select(const LayerConfig& c, const float* scores, const float* bias, const SelectScratch& s,
                          int32_t* topk_idx) {
  const int E = c.experts;
  const bool sigmoid = c.score_mode == ScoreMode::sigmoid;
  float* const key = s.key;
  bool* const allowed = s.allowed;
  for (int e = 0; e < E; ++e) key[e] = sigmoid && bias ? scores[e] + bias[e] : scores[e];
  if (selected_groups(c) > 0) {
    const int per = E / c.n_group;
    float* const group_key = s.group_key;
    bool* const group_allowed = s.group_allowed;
    for (int g = 0; g < c.n_group; ++g) {
      for (int e = g * per; e < (g + 1) * per; ++e) allowed[e] = true;
      const int first = argmax_allowed(key, allowed, g * per, (g + 1) * per);
      allowed[first] = false;
      const int second = per > 1 ? argmax_allowed(key, allowed, g * per, (g + 1) * per) : -1;
      group_key[g] = second >= 0 ? key[first] + key[second] : key[first];
      group_allowed[g] = true;
    }
    for (int e = 0; e < E; ++e) allowed[e] = false;
    for (int kept = 0; kept < c.topk_group; ++kept) {
      const int g = argmax_allowed(group_key, group_allowed, 0, c.n_group);
      group_allowed[g] = false;
      for (int e = g * per; e < (g + 1) * per; ++e) allowed[e] = true;
    }
  } else {
    for (int e = 0; e < E; ++e) allowed[e] = true;
  }
  for (int j = 0; j < c.top_k; ++j) {
    const int e = argmax_allowed(key, allowed, 0, E);
    topk_idx[j] = e;
    allowed[e] = false;
  }
}

// The renormalisation's denominator S: the selected scores' sum (in slot order) plus 1e-20, as
// torchtitan and Megatron-Core write it, so that a token whose selected scores all underflow to zero
// (sigmoid logits below about -88.7; softmax scores of replayed ids about 104 below the largest) gets
// zero weights, not 0/0. The term changes no sum from 2^-42 (2.3e-13) up, where it is under half an ulp.
inline constexpr float kRenormalizeEpsilon = 1e-20f;
MOK_HD float renormalizer(const LayerConfig& c, const float* scores, const int32_t* topk_idx) {
  float sum = 0.0f;
  for (int j = 0; j < c.top_k; ++j) sum += scores[topk_idx[j]];
  return sum + kRenormalizeEpsilon;
}

// topk_w[j] = scores[e_j], divided by their renormalizer when renormalising, then times routed_scale in
// sigmoid mode.
MOK_HD void router_weights(const LayerConfig& c, const float* scores, const int32_t* topk_idx, float* topk_w) {
  const float sum = renormalizer(c, scores, topk_idx);
  for (int j = 0; j < c.top_k; ++j) {
    float w = scores[topk_idx[j]];
    if (c.renormalize) w = w / sum;
    if (c.score_mode == ScoreMode::sigmoid) w = w * c.routed_scale;
    topk_w[j] = w;
  }
}

// d logits from d topk_w, for one token. scores as router_scores gives them.
//   renormalised:  d s_j = (d w'_j - sum_i d w'_i w'_i) / S,  w'_j = s_j / S  (S the renormalizer)
//   softmax:       d logit = p * (d p - <d p, p>)
//   sigmoid:       d logit_e = d s_e * s_e * (1 - s_e)
// A NaN d logit (an Inf or overflowing d topk_w) is the canonical one, whichever side computed it.
MOK_HD void router_backward(const LayerConfig& c, const float* scores, const int32_t* topk_idx, const float* d_topk_w,
                            float* d_scores, float* d_logits) {
  const int E = c.experts, k = c.top_k;
  const bool sigmoid = c.score_mode == ScoreMode::sigmoid;
  for (int e = 0; e < E; ++e) d_scores[e] = 0.0f;
  const float sum = renormalizer(c, scores, topk_idx);
  float weighted = 0.0f;  // sum_i d w'_i w'_i
  if (c.renormalize)
    for (int j = 0; j < k; ++j) {
      const float dw = sigmoid ? d_topk_w[j] * c.routed_scale : d_topk_w[j];
      weighted = fma32(dw, scores[topk_idx[j]] / sum, weighted);
    }
  // A selected score of exactly zero passes nothing to its logit (s (1 - s) and p are 0): its d_score
  // is 0, where (dw - weighted) / S of a sum of zeros (S = 1e-20) would reach Inf for |dw| past 3.4e18,
  // and Inf times that zero is NaN.
  for (int j = 0; j < k; ++j) {
    const float dw = sigmoid ? d_topk_w[j] * c.routed_scale : d_topk_w[j];
    const bool zero = scores[topk_idx[j]] == 0.0f;
    d_scores[topk_idx[j]] = !c.renormalize ? dw : zero ? 0.0f : (dw - weighted) / sum;
  }
  if (sigmoid) {
    for (int e = 0; e < E; ++e) d_logits[e] = canonical_nan(d_scores[e] * (scores[e] * (1.0f - scores[e])));
    return;
  }
  float dot = 0.0f;  // <d p, p> over the selected experts, in slot order
  for (int j = 0; j < k; ++j) dot = fma32(d_scores[topk_idx[j]], scores[topk_idx[j]], dot);
  for (int e = 0; e < E; ++e) d_logits[e] = canonical_nan(scores[e] * (d_scores[e] - dot));
}

}  // namespace mok
