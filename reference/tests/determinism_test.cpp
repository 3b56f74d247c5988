// The determinism contract on the reference (docs/design.md): D1 run to run, D2 rank-count
// invariance, and invariance to the ring's minibatch size and to the recompute mode.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "mok/reference/layer.h"
#include "mok/reference/problem.h"
#include "test_support.h"

namespace mok::ref::test {
namespace {

struct Outputs {
  Forward f;
  Gradients g;
};

Outputs run(const LayerConfig& c, const Problem& p, const Options& opt) {
  const Routing* given = p.routing ? &*p.routing : nullptr;
  Outputs r{forward(c, p.x, p.weights, given, opt), Gradients()};
  r.g = backward(c, p.x, p.weights, r.f, p.dy, opt);
  return r;
}

// Every output of the layer, bit for bit. The problems below have a router and a shared expert,
// or a given routing (no router outputs).
void expect_same_outputs(const Outputs& a, const Outputs& b, bool router, bool shared) {
  EXPECT_PRED_FORMAT2(same_bits, a.f.routing.topk_idx, b.f.routing.topk_idx);
  EXPECT_PRED_FORMAT2(same_bits, a.f.routing.topk_w, b.f.routing.topk_w);
  EXPECT_PRED_FORMAT2(same_bits, a.f.y, b.f.y);
  if (router) {
    EXPECT_PRED_FORMAT2(same_bits, a.f.logits, b.f.logits);
  }
  expect_same_gradients(a.g, b.g, router, shared);
}

// 128 tokens in all, 8 experts (so R up to 8 divides them), router and shared expert.
LayerConfig global_batch(int ranks) {
  LayerConfig c = make_config(ranks, 128 / ranks, 128, 64, 8, 3);
  c.shared_intermediate = 64;
  return c;
}

LayerConfig sigmoid_batch(int ranks) {
  LayerConfig c = with_grouped_sigmoid(global_batch(ranks));
  c.swiglu_limit = 0.75f;
  return c;
}

class Determinism : public ::testing::TestWithParam<StepModel> {
 protected:
  Options options() const {
    Options opt;
    opt.step = GetParam();
    return opt;
  }
};

// Run to run, and over 1, 3 or this machine's threads: the reference's GEMMs run their rows in parallel where
// the work is large enough (this problem's experts' GEMMs are), each output element's chain in one thread.
TEST_P(Determinism, D1SameInputsSameBits) {
  const LayerConfig c = global_batch(4);
  const Problem p = make_problem(c, 31);
  const Outputs first = run(c, p, options());
  expect_same_outputs(first, run(c, p, options()), true, true);
  const int threads = omp_get_max_threads();
  for (const int n : {1, 3}) {
    SCOPED_TRACE(std::to_string(n) + " threads");
    omp_set_num_threads(n);
    expect_same_outputs(first, run(c, p, options()), true, true);
  }
  omp_set_num_threads(threads);
}

// The same global batch (same x, weights, dy: make_problem draws them from N = R * T) split over
// R = 1, 2, 4, 8 ranks.
TEST_P(Determinism, D2RankCountInvariantWithRouter) {
  const Outputs one = run(global_batch(1), make_problem(global_batch(1), 32), options());
  for (int ranks : {2, 4, 8}) {
    SCOPED_TRACE("R = " + std::to_string(ranks));
    const LayerConfig c = global_batch(ranks);
    expect_same_outputs(one, run(c, make_problem(c, 32), options()), true, true);
  }
}

TEST_P(Determinism, D2RankCountInvariantSigmoidClamped) {
  const Outputs one = run(sigmoid_batch(1), make_problem(sigmoid_batch(1), 33), options());
  for (int ranks : {2, 4, 8}) {
    SCOPED_TRACE("R = " + std::to_string(ranks));
    const LayerConfig c = sigmoid_batch(ranks);
    expect_same_outputs(one, run(c, make_problem(c, 33), options()), true, true);
  }
}

TEST_P(Determinism, D2RankCountInvariantWithImbalancedGivenRouting) {
  LayerConfig base = global_batch(1);
  base.shared_intermediate = 0;
  const Outputs one = run(base, make_problem(base, 34, RoutingKind::zipf, 2.0), options());
  for (int ranks : {2, 4, 8}) {
    SCOPED_TRACE("R = " + std::to_string(ranks));
    LayerConfig c = base;
    c.ranks = ranks;
    c.tokens_per_rank = 128 / ranks;
    expect_same_outputs(one, run(c, make_problem(c, 34, RoutingKind::zipf, 2.0), options()), false, false);
  }
}

// About 128 rows per expert (256 tokens, k = 2, 4 experts): a 16-row ring splits an expert into
// many minibatches, a 64-row ring into a few, and the check below makes sure one expert ends in a
// partial chunk; 4096 rows take each expert whole.
TEST_P(Determinism, RingRowsDoNotChangeAnyBit) {
  LayerConfig c = make_config(2, 128, 128, 64, 4, 2);
  c.shared_intermediate = 64;
  const Problem p = make_problem(c, 35);
  Options opt = options();
  opt.ring_rows = 4096;
  const Outputs whole = run(c, p, opt);
  bool partial_tail = false;
  for (int count : whole.f.layout.counts) partial_tail = partial_tail || (count > 64 && count % 16 != 0);
  EXPECT_TRUE(partial_tail) << "no expert has several minibatches and a partial last chunk";
  for (int ring : {16, 64}) {
    SCOPED_TRACE("ring_rows = " + std::to_string(ring));
    opt.ring_rows = ring;
    expect_same_outputs(whole, run(c, p, opt), true, true);
  }
}

TEST_P(Determinism, RecomputeModeEqualsSavedMode) {
  const LayerConfig c = global_batch(2);
  const Problem p = make_problem(c, 36);
  Options opt = options();
  const Outputs saved = run(c, p, opt);
  opt.recompute = true;
  const Outputs recomputed = run(c, p, opt);
  EXPECT_TRUE(recomputed.f.h.empty() && recomputed.f.shared_h.empty()) << "recompute mode saved activations";
  expect_same_outputs(saved, recomputed, true, true);
}

// The fp8 mode keeps the contract: its scale blocks are rows of one token (1 x 128) or squares of a
// weight (128 x 128), never a ring minibatch or a rank's share, so R, the ring and recompute change no bit.
TEST(DeterminismFp8, RanksRingsAndRecomputeChangeNoBit) {
  const auto config = [](int ranks) {
    LayerConfig c = make_config(ranks, 64 / ranks, 128, 128, 8, 2);
    c.shared_intermediate = 128;
    c.precision = Precision::fp8;
    return c;
  };
  const Problem p = make_problem(config(1), 37);
  const Outputs one = run(config(1), p, Options{});
  const struct {
    int ranks, ring_rows;
    bool recompute;
  } variants[] = {{2, 16, false}, {4, 48, true}, {8, 256, false}};
  for (const auto& v : variants) {
    Options opt;
    opt.ring_rows = v.ring_rows;
    opt.recompute = v.recompute;
    Problem q = p;
    q.config = config(v.ranks);
    expect_same_outputs(one, run(q.config, q, opt), true, true);
  }
}

// fp8 changes the expert GEMMs alone: the router's logits and weights keep their bits, y does not.
TEST(DeterminismFp8, OnlyTheExpertGemmsChange) {
  LayerConfig c = make_config(2, 16, 128, 128, 4, 2);
  const Problem p = make_problem(c, 38);
  const Outputs bf16_run = run(c, p, Options{});
  c.precision = Precision::fp8;
  const Outputs fp8_run = run(c, p, Options{});
  EXPECT_PRED_FORMAT2(same_bits, bf16_run.f.logits, fp8_run.f.logits);
  EXPECT_PRED_FORMAT2(same_bits, bf16_run.f.routing.topk_w, fp8_run.f.routing.topk_w);
  EXPECT_NE(bf16_run.f.y.size(), 0u);
  size_t differing = 0;
  for (size_t i = 0; i < bf16_run.f.y.size(); ++i) differing += bf16_run.f.y[i].bits != fp8_run.f.y[i].bits;
  EXPECT_GT(differing, bf16_run.f.y.size() / 2) << "the fp8 GEMMs leave y as bf16 computed it";
}

// A dy of the largest finite bf16s overflows g to +-Inf, and d topk_w's chains then add +Inf and -Inf:
// every fp32 output's NaNs are the GPU's canonical NaN, not x86's (0xffc00000), so that the two sides' bits
// can agree. d topk_w, d logits and d_router hold some in each step model; d_w1 and d_w2 too where the fp8
// weight gradients' 128-row blocks (an expert of 512 rows) overflow to +Inf and -Inf.
TEST(OverflowingGradients, HoldOnlyTheCanonicalNan) {
  LayerConfig fp8 = make_config(1, 512, 128, 128, 2, 1);
  fp8.precision = Precision::fp8;
  const struct {
    const char* name;
    LayerConfig config;
    Options options;
    std::vector<std::string> with_nans;
  } cases[] = {
      {"fp32_fma",
       make_config(2, 40, 128, 64, 8, 2),
       Options{.step = StepModel::fp32_fma},
       {"d_topk_w", "d_logits", "d_router"}},
      {"hopper_tc",
       make_config(2, 40, 128, 64, 8, 2),
       Options{.step = StepModel::hopper_tc},
       {"d_topk_w", "d_logits", "d_router"}},
      {"fp8_weight_gradients",
       fp8,
       Options{.step = StepModel::hopper_tc, .fp8_weight_gradients = true},
       {"d_topk_w", "d_logits", "d_router", "d_w1", "d_w2"}},
  };
  for (const auto& cs : cases) {
    SCOPED_TRACE(cs.name);
    Problem p = make_problem(cs.config, 1234);
    p.dy = mok::test::saturated(p.dy);
    const Outputs out = run(cs.config, p, cs.options);
    for_each_field(out.g, [&](const char* name, const auto& v) {
      if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::vector<float>>) {
        const size_t nans = mok::test::canonical_nans(name, v);
        const bool expected = std::ranges::find(cs.with_nans, name) != cs.with_nans.end();
        EXPECT_TRUE(!expected || nans > 0) << name << " holds no NaN: the case does not reach it";
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(StepModels, Determinism, ::testing::Values(StepModel::fp32_fma, StepModel::hopper_tc),
                         [](const ::testing::TestParamInfo<StepModel>& info) {
                           return std::string(info.param == StepModel::hopper_tc ? "hopper_tc" : "fp32_fma");
                         });

}  // namespace
}  // namespace mok::ref::test
