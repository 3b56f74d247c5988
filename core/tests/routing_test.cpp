// The router's per-token steps (scores, top-k selection, weights, backward): hand-computed cases, fp64
// and finite differences.
#include "mok/core/routing.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "core_test_support.h"

namespace mok::test {
namespace {

LayerConfig router_config(ScoreMode mode, int experts, int top_k) {
  LayerConfig c = make_config(1, 1, 64, 64, experts, top_k);
  c.score_mode = mode;
  return c;
}

std::vector<float> scores_of(const LayerConfig& c, const std::vector<float>& logits) {
  std::vector<float> s(logits.size());
  router_scores(c, logits.data(), s.data());
  return s;
}

std::vector<int32_t> select(const LayerConfig& c, const std::vector<float>& scores, const float* bias = nullptr) {
  HostSelectScratch scratch(c);
  std::vector<int32_t> idx(c.top_k);
  router_select(c, scores.data(), bias, scratch.view(), idx.data());
  return idx;
}

std::vector<float> weights_of(const LayerConfig& c, const std::vector<float>& scores, const std::vector<int32_t>& idx) {
  std::vector<float> w(c.top_k);
  router_weights(c, scores.data(), idx.data(), w.data());
  return w;
}

// ---- scores ----

TEST(Softmax, EqualLogitsGiveExactlyEqualShares) {
  const LayerConfig c = router_config(ScoreMode::softmax, 4, 1);
  EXPECT_EQ(scores_of(c, {3.0f, 3.0f, 3.0f, 3.0f}), (std::vector<float>{0.25f, 0.25f, 0.25f, 0.25f}));
}

TEST(Softmax, SubtractsTheMaximumBeforeExp) {
  // exp(1000) overflows; after subtracting the maximum the scores are exp(0) / 2 and exp(-1000) / 2.
  const LayerConfig c = router_config(ScoreMode::softmax, 3, 1);
  EXPECT_EQ(scores_of(c, {1000.0f, 1000.0f, 0.0f}), (std::vector<float>{0.5f, 0.5f, 0.0f}));
}

// Error of the fp32 softmax: the max subtraction (u |l - m|), exp (2 ulp), E additions, one division.
TEST(Softmax, MatchesFp64WithinItsOperationCount) {
  const LayerConfig c = router_config(ScoreMode::softmax, 16, 1);
  TestRng rng(3);
  for (int trial = 0; trial < 1000; ++trial) {
    std::vector<float> logits(c.experts);
    for (float& l : logits) l = rng.symmetric(6.0f);
    const std::vector<float> s = scores_of(c, logits);
    double m = logits[0], sum = 0;
    for (float l : logits) m = std::max(m, double(l));
    for (float l : logits) sum += std::exp(l - m);
    for (int e = 0; e < c.experts; ++e) {
      const double want = std::exp(logits[e] - m) / sum;
      const double budget = (std::abs(logits[e] - m) + 2 + c.experts + 1) * 0x1p-24 * want * 2;
      ASSERT_LE(std::abs(s[e] - want), budget) << "trial " << trial << " expert " << e;
    }
  }
}

TEST(SigmoidScores, AreElementwise) {
  const LayerConfig c = router_config(ScoreMode::sigmoid, 3, 1);
  EXPECT_EQ(scores_of(c, {0.0f, 100.0f, -100.0f}), (std::vector<float>{0.5f, 1.0f, 0.0f}));
}

// ---- selection ----

TEST(TopK, TiesGoToTheLowerExpertIndex) {
  const LayerConfig k2 = router_config(ScoreMode::softmax, 5, 2), k3 = router_config(ScoreMode::softmax, 5, 3);
  const std::vector<float> s = {0.125f, 0.25f, 0.25f, 0.125f, 0.25f};
  EXPECT_EQ(select(k2, s), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(select(k3, s), (std::vector<int32_t>{1, 2, 4}));
  const LayerConfig all = router_config(ScoreMode::softmax, 4, 4);
  EXPECT_EQ(select(all, {0.25f, 0.25f, 0.25f, 0.25f}), (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(TopK, SelectsInDescendingOrder) {
  const LayerConfig c = router_config(ScoreMode::softmax, 6, 3);
  EXPECT_EQ(select(c, {0.0625f, 0.5f, 0.03125f, 0.125f, 0.25f, 0.03125f}), (std::vector<int32_t>{1, 4, 3}));
}

TEST(TopK, SigmoidSelectsOnScorePlusBias) {
  const LayerConfig c = router_config(ScoreMode::sigmoid, 3, 2);
  const std::vector<float> s = {0.5f, 0.625f, 0.75f};
  EXPECT_EQ(select(c, s), (std::vector<int32_t>{2, 1}));
  const float bias[3] = {0.375f, 0.0f, 0.0f};  // keys 0.875, 0.625, 0.75
  EXPECT_EQ(select(c, s, bias), (std::vector<int32_t>{0, 2}));
  const float tie[3] = {0.25f, 0.0f, 0.0f};  // keys 0.75, 0.625, 0.75: expert 0 wins the tie
  EXPECT_EQ(select(c, s, tie), (std::vector<int32_t>{0, 2}));
}

TEST(TopK, SigmoidGroupLimitedSelection) {
  // 8 experts in 4 groups of 2; a group ranks by the sum of its two keys; 2 groups are kept.
  //   group 0: 0.875 + 0     = 0.875     group 1: 0.5 + 0.5   = 1.0
  //   group 2: 0.4375 * 2    = 0.875     group 3: 0.125 + 0.25 = 0.375
  // Kept: group 1, then group 0 (ties group 2, lower index wins). Experts 4 and 5 (0.4375) beat
  // expert 1 (0) on score but sit in a dropped group.
  LayerConfig c = router_config(ScoreMode::sigmoid, 8, 3);
  c.n_group = 4;
  c.topk_group = 2;
  const std::vector<float> s = {0.875f, 0.0f, 0.5f, 0.5f, 0.4375f, 0.4375f, 0.125f, 0.25f};
  EXPECT_EQ(select(c, s), (std::vector<int32_t>{0, 2, 3}));
  c.top_k = 4;
  EXPECT_EQ(select(c, s), (std::vector<int32_t>{0, 2, 3, 1}));
  c.topk_group = 3;  // group 2 joins
  EXPECT_EQ(select(c, s), (std::vector<int32_t>{0, 2, 3, 4}));
}

TEST(TopK, SigmoidGroupsOfOneRankByTheirOnlyKey) {
  LayerConfig c = router_config(ScoreMode::sigmoid, 4, 2);
  c.n_group = 4;
  c.topk_group = 2;
  const float bias[4] = {0.0f, 0.5f, 0.0f, 0.0f};
  EXPECT_EQ(select(c, {0.75f, 0.5f, 0.25f, 0.875f}, bias), (std::vector<int32_t>{1, 3}));  // keys .75 1 .25 .875
}

// ---- weights ----

TEST(RouterWeights, RenormaliseAndScale) {
  const std::vector<float> s = {0.375f, 0.125f, 0.25f, 0.25f};
  const std::vector<int32_t> idx = {0, 1};
  LayerConfig c = router_config(ScoreMode::softmax, 4, 2);
  EXPECT_EQ(weights_of(c, s, idx), (std::vector<float>{0.75f, 0.25f}));  // divided by 0.5
  c.renormalize = false;
  EXPECT_EQ(weights_of(c, s, idx), (std::vector<float>{0.375f, 0.125f}));
  c.routed_scale = 2.5f;  // softmax mode ignores the scale
  EXPECT_EQ(weights_of(c, s, idx), (std::vector<float>{0.375f, 0.125f}));
  c.score_mode = ScoreMode::sigmoid;
  EXPECT_EQ(weights_of(c, s, idx), (std::vector<float>{0.9375f, 0.3125f}));
  c.renormalize = true;
  EXPECT_EQ(weights_of(c, s, idx), (std::vector<float>{1.875f, 0.625f}));
}

// Selected scores that all underflow to zero (sigmoid logits of -128; softmax scores of replayed
// experts far below the largest) renormalise to zero weights, and their gradients are zero: the
// denominator's 1e-20 (torchtitan's, Megatron-Core's) instead of 0/0 = NaN, however large d topk_w (a
// zero score's d_score is 0: (dw - ...) / 1e-20 would reach Inf, and Inf times the zero NaN). From 2^-42
// up a sum keeps its bits (the term is under half its ulp); just below, it does not.
TEST(RouterWeights, ScoresThatUnderflowToZeroGiveZeroWeights) {
  LayerConfig c = router_config(ScoreMode::sigmoid, 4, 2);
  c.routed_scale = 2.5f;
  const std::vector<float> s = scores_of(c, {-128.0f, -128.0f, -128.0f, -128.0f});
  ASSERT_EQ(s, (std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f}));
  const std::vector<int32_t> idx = {0, 1};
  EXPECT_EQ(weights_of(c, s, idx), (std::vector<float>{0.0f, 0.0f}));
  const float dw[2] = {4e18f, -0.5f};
  std::vector<float> d_scores(4), d_logits(4);
  router_backward(c, s.data(), idx.data(), dw, d_scores.data(), d_logits.data());
  EXPECT_EQ(d_logits, (std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f}));
  c.score_mode = ScoreMode::softmax;  // replayed ids 2 and 3, 200 below the largest logits
  const std::vector<float> p = scores_of(c, {0.0f, 0.0f, -200.0f, -200.0f});
  ASSERT_EQ(p, (std::vector<float>{0.5f, 0.5f, 0.0f, 0.0f}));
  const std::vector<int32_t> replayed = {2, 3};
  EXPECT_EQ(weights_of(c, p, replayed), (std::vector<float>{0.0f, 0.0f}));
  router_backward(c, p.data(), replayed.data(), dw, d_scores.data(), d_logits.data());
  EXPECT_EQ(d_logits, (std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f}));
  const int32_t first_two[2] = {0, 1};
  const auto sum_of = [&](float s0) { return renormalizer(c, std::vector<float>{s0, 0.0f}.data(), first_two); };
  EXPECT_EQ(sum_of(0x1p-42f), 0x1p-42f);
  EXPECT_EQ(sum_of(0x1.fffffep-42f), 0x1.fffffep-42f);
  EXPECT_NE(sum_of(0x1.8p-43f), 0x1.8p-43f);  // half its ulp (2^-67) is under 1e-20
}

// ---- backward ----

// An Inf d topk_w (an overflowed chain) makes d logits NaN through Inf - Inf or Inf * 0: the GPU's
// canonical NaN on the CPU too, in each score mode.
TEST(RouterBackward, NanDLogitsAreTheCanonicalNan) {
  const float dw[2] = {std::numeric_limits<float>::infinity(), 1.0f};
  const std::vector<int32_t> idx = {0, 1};
  for (const ScoreMode mode : {ScoreMode::softmax, ScoreMode::sigmoid}) {
    const LayerConfig c = router_config(mode, 4, 2);
    const std::vector<float> s = scores_of(c, {1.0f, 0.5f, -1.0f, -2.0f});
    std::vector<float> d_scores(4), d_logits(4);
    router_backward(c, s.data(), idx.data(), dw, d_scores.data(), d_logits.data());
    EXPECT_GT(canonical_nans("d_logits", d_logits), 0u) << (mode == ScoreMode::softmax ? "softmax" : "sigmoid");
  }
}

// router_backward against central differences of L(logits) = sum_j dw_j * topk_w_j(logits) with
// the selection held fixed, all in fp32. Step 2^-7 on logits of size ~2: truncation h^2/6 * L'''
// ~ 1e-5, rounding noise ~ 4 ulp * sum|dw w| / 2h ~ 2e-5, both times the scale (measured: at most
// 6e-6 times the scale); a wrong formula is off by O(1).
void expect_router_backward_matches_differences(LayerConfig c) {
  TestRng rng(11);
  const int E = c.experts, k = c.top_k;
  const float h = 0x1p-7f;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> logits(E), dw(k);
    for (float& l : logits) l = rng.symmetric(2.0f);
    for (float& d : dw) d = rng.symmetric(1.0f);
    const std::vector<int32_t> idx = select(c, scores_of(c, logits));
    const auto loss = [&](const std::vector<float>& l) {
      const std::vector<float> w = weights_of(c, scores_of(c, l), idx);
      double sum = 0;
      for (int j = 0; j < k; ++j) sum += double(dw[j]) * w[j];
      return sum;
    };
    std::vector<float> d_scores(E), d_logits(E);
    router_backward(c, scores_of(c, logits).data(), idx.data(), dw.data(), d_scores.data(), d_logits.data());
    for (int e = 0; e < E; ++e) {
      std::vector<float> up = logits, down = logits;
      up[e] += h;
      down[e] -= h;
      const double fd = (loss(up) - loss(down)) / (2 * h);
      EXPECT_NEAR(d_logits[e], fd, 5e-5 * c.routed_scale) << "trial " << trial << " expert " << e;
    }
  }
}

TEST(RouterBackward, SoftmaxRenormalisedMatchesFiniteDifferences) {
  expect_router_backward_matches_differences(router_config(ScoreMode::softmax, 8, 3));
}

TEST(RouterBackward, SoftmaxPlainMatchesFiniteDifferences) {
  LayerConfig c = router_config(ScoreMode::softmax, 8, 3);
  c.renormalize = false;
  expect_router_backward_matches_differences(c);
}

TEST(RouterBackward, SigmoidRenormalisedScaledMatchesFiniteDifferences) {
  LayerConfig c = router_config(ScoreMode::sigmoid, 8, 3);
  c.routed_scale = 2.5f;
  expect_router_backward_matches_differences(c);
}

TEST(RouterBackward, SigmoidPlainScaledMatchesFiniteDifferences) {
  LayerConfig c = router_config(ScoreMode::sigmoid, 8, 3);
  c.renormalize = false;
  c.routed_scale = 2.5f;
  expect_router_backward_matches_differences(c);
}

}  // namespace
}  // namespace mok::test
