// Bad inputs: each gives a mok::Error whose message names the problem, never a crash or garbage.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "mok/reference/layer.h"
#include "mok/reference/problem.h"
#include "test_support.h"

namespace mok::ref::test {
namespace {

const float kNan = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

class BadInputs : public ::testing::Test {
 protected:
  BadInputs()
      : c_(make_config(2, 8, 64, 64, 4, 2)),
        p_(make_problem(c_, 41)),
        given_(make_problem(c_, 41, RoutingKind::uniform)) {}

  void expect_forward_error(const LayerConfig& c, const Problem& p, const std::string& names,
                            const Options& opt = Options()) {
    expect_error([&] { forward(c, p.x, p.weights, p.routing ? &*p.routing : nullptr, opt); }, names);
  }

  LayerConfig c_;
  Problem p_;
  Problem given_;  // with a given (uniform) routing
};

TEST_F(BadInputs, MismatchedShapes) {
  Problem p = p_;
  p.x.pop_back();
  expect_forward_error(c_, p, "x [N, H] has 1023 elements, expected 1024");
  p = p_;
  p.weights.w1.resize(p.weights.w1.size() / 2);
  expect_forward_error(c_, p, "w1 [E, 2I, H]");
  p = p_;
  p.weights.w2.push_back(bf16{0});
  expect_forward_error(c_, p, "w2 [E, H, I]");
  p = p_;
  p.weights.router.clear();
  expect_forward_error(c_, p, "router weight [E, H]");
  p = p_;
  p.weights.shared_w1.assign(128 * 64, bf16{0});  // the config has no shared expert
  expect_forward_error(c_, p, "shared_w1 [2Is, H]");
  p = p_;
  p.weights.expert_bias.assign(3, 0.0f);
  expect_forward_error(c_, p, "expert_bias [E]");
  Problem g = given_;
  g.routing->topk_idx.pop_back();
  expect_forward_error(c_, g, "given topk_idx [N, k]");
  const Forward f = forward(c_, p_.x, p_.weights, nullptr, Options());
  std::vector<bf16> dy = p_.dy;
  dy.pop_back();
  expect_error([&] { backward(c_, p_.x, p_.weights, f, dy, Options()); }, "dy [N, H]");
}

TEST_F(BadInputs, BackwardChecksItsInputsToo) {
  const Forward f = forward(c_, p_.x, p_.weights, nullptr, Options());
  std::vector<bf16> x = p_.x;
  x.resize(x.size() / 2);
  expect_error([&] { backward(c_, x, p_.weights, f, p_.dy, Options()); }, "x [N, H]");
  LayerWeights w = p_.weights;
  w.w2.pop_back();
  expect_error([&] { backward(c_, p_.x, w, f, p_.dy, Options()); }, "w2 [E, H, I]");
  LayerConfig other = c_;  // a Forward made for another batch
  other.tokens_per_rank = 4;
  const Problem q = make_problem(other, 41);
  const Forward wrong = forward(other, q.x, q.weights, nullptr, Options());
  expect_error([&] { backward(c_, p_.x, p_.weights, wrong, p_.dy, Options()); }, "the forward's topk_idx [N, k]");
}

TEST_F(BadInputs, BadConfig) {
  LayerConfig c = c_;
  c.top_k = 5;
  expect_forward_error(c, p_, "top_k k = 5 (need 1 <= k <= E = 4)");
  c = c_;
  c.tokens_per_rank = 0;
  expect_forward_error(c, p_, "tokens per rank T = 0");
  c = c_;
  c.hidden = 96;
  expect_forward_error(c, p_, "hidden H = 96 (need a positive multiple of 64)");
  c = c_;
  c.intermediate = 32;
  expect_forward_error(c, p_, "intermediate I = 32");
  c = c_;
  c.ranks = 3;
  expect_forward_error(c, p_, "experts E = 4 is not a multiple of ranks R = 3");
  c = c_;
  c.score_mode = ScoreMode::sigmoid;
  c.n_group = 3;
  expect_forward_error(c, p_, "n_group = 3 must divide E = 4");
  c.n_group = 2;
  c.topk_group = 3;
  expect_forward_error(c, p_, "topk_group = 3");
  c.topk_group = 1;
  c.top_k = 3;
  expect_forward_error(c, p_, "top_k = 3 exceeds the experts in the kept groups");
  // Softmax mode has no groups and no scale: a DeepSeek-V2-like config (groups, scale 16) ran as plain
  // softmax top-k.
  c = c_;
  c.n_group = 2;
  expect_forward_error(c, p_, "n_group = 2 is sigmoid mode's (softmax mode takes 1)");
  c = c_;
  c.topk_group = 2;
  expect_forward_error(c, p_, "topk_group = 2 is sigmoid mode's (softmax mode takes 1)");
  c = c_;
  c.routed_scale = 16.0f;
  expect_forward_error(c, p_, "routed_scale is sigmoid mode's (softmax mode takes 1)");
}

TEST_F(BadInputs, ExpertIdsOutOfRangeOrDuplicated) {
  Problem g = given_;
  g.routing->topk_idx[5] = 4;
  expect_forward_error(c_, g, "topk_idx[2, 1] = 4 is outside [0, 4)");
  g = given_;
  g.routing->topk_idx[0] = -1;
  expect_forward_error(c_, g, "topk_idx[0, 0] = -1 is outside [0, 4)");
  g = given_;
  g.routing->topk_idx[7] = g.routing->topk_idx[6];
  expect_forward_error(c_, g, "token 3 is routed to expert " + std::to_string(g.routing->topk_idx[6]) + " twice");
}

TEST_F(BadInputs, NanOrInfInInputs) {
  Problem p = p_;
  p.x[17] = to_bf16(kNan);
  expect_forward_error(c_, p, "x [N, H] holds NaN or Inf");
  p = p_;
  p.x[0] = to_bf16(-kInf);
  expect_forward_error(c_, p, "x [N, H] holds NaN or Inf");
  p = p_;
  p.weights.w1[100] = to_bf16(kInf);
  expect_forward_error(c_, p, "expert weights hold NaN or Inf");
  p = p_;
  p.weights.router[3] = kNan;
  expect_forward_error(c_, p, "router weight holds NaN or Inf");
  Problem g = given_;
  g.routing->topk_w[2] = kInf;
  expect_forward_error(c_, g, "given topk_w holds NaN or Inf");
  const Forward f = forward(c_, p_.x, p_.weights, nullptr, Options());
  std::vector<bf16> dy = p_.dy;
  dy[9] = to_bf16(kNan);
  expect_error([&] { backward(c_, p_.x, p_.weights, f, dy, Options()); }, "dy [N, H] holds NaN or Inf");
  Forward nan_logits = f;
  nan_logits.logits[4] = kNan;
  expect_error([&] { backward(c_, p_.x, p_.weights, nan_logits, p_.dy, Options()); },
               "the forward's logits hold NaN or Inf");
}

TEST_F(BadInputs, NanInSharedWeightsOrBias) {
  LayerConfig c = c_;
  c.shared_intermediate = 64;
  c.score_mode = ScoreMode::sigmoid;
  const Problem base = make_problem(c, 42);
  Problem p = base;
  p.weights.shared_w2[5] = to_bf16(kNan);
  expect_forward_error(c, p, "shared expert weights hold NaN or Inf");
  p = base;
  p.weights.expert_bias[1] = kInf;
  expect_forward_error(c, p, "expert_bias holds NaN or Inf");
}

// Softmax mode adds no bias to the selection key: a bias given there, zeros included, is refused (it was
// ignored), in the forward and the backward; sigmoid mode takes it.
TEST_F(BadInputs, ExpertBiasInSoftmaxMode) {
  ASSERT_EQ(c_.score_mode, ScoreMode::softmax);
  const std::string message = "expert_bias is given, but the config's score_mode is softmax";
  const Forward f = forward(c_, p_.x, p_.weights, nullptr, Options());
  Problem p = p_;
  p.weights.expert_bias.assign(size_t(c_.experts), 0.0f);
  expect_forward_error(c_, p, message);
  expect_error([&] { backward(c_, p.x, p.weights, f, p.dy, Options()); }, message);
  EXPECT_NO_THROW(forward(with_grouped_sigmoid(c_), p.x, p.weights, nullptr, Options()));
}

TEST_F(BadInputs, RingRowsAndSavedActivations) {
  Options opt;
  opt.ring_rows = 24;
  expect_forward_error(c_, p_, "ring_rows = 24 is not a positive multiple of 16", opt);
  opt.ring_rows = 0;
  expect_forward_error(c_, p_, "ring_rows = 0 is not a positive multiple of 16", opt);
  Options recompute;
  recompute.recompute = true;
  const Forward f = forward(c_, p_.x, p_.weights, nullptr, recompute);
  expect_error([&] { backward(c_, p_.x, p_.weights, f, p_.dy, Options()); },
               "forward saved no activations: use recompute");
  expect_error([&] { backward(c_, p_.x, p_.weights, f, p_.dy, opt); },
               "ring_rows = 0 is not a positive multiple of 16");
}

}  // namespace
}  // namespace mok::ref::test
