// The fp64 oracle against central finite differences of its own forward, and the reference against
// the oracle within the bounds of oracle.h (docs/accuracy.md).
#include "mok/reference/oracle.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "mok/reference/problem.h"
#include "test_support.h"

namespace mok::ref::test {
namespace {

// ---- finite differences of the oracle (fp64) ----

struct Tiny {
  OracleInputs in;
  OracleResult grad;
};

Tiny tiny_problem(const LayerConfig& c, RoutingKind kind) {
  const Problem p = make_problem(c, 21, kind);
  Options opt;
  opt.step = StepModel::fp32_fma;  // only the routing is used
  const Forward f = forward(c, p.x, p.weights, p.routing ? &*p.routing : nullptr, opt);
  Tiny t{oracle_inputs(c, p.x, p.weights, p.dy, f), OracleResult()};
  t.grad = oracle(t.in);
  return t;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

std::vector<double> topk_w_of(const OracleInputs& in) {
  return in.routed_by_router() ? oracle_router_weights(in.config, oracle_logits(in), in.topk_idx) : in.given_topk_w;
}

// L = sum(dy * y), the loss whose gradients the oracle computes.
double loss(const OracleInputs& in) { return dot(in.dy, oracle_y(in, topk_w_of(in))); }

// Largest |central difference - gradient| over 24 sampled entries of `param`, relative to the
// largest |gradient| of the tensor. loss() reads param, which is perturbed in place and restored.
// With step 1e-6 in fp64: truncation ~1e-12 * L''', rounding ~1e-16 * |L| / 1e-6; both near 1e-9
// (measured: at most 5e-9), where a wrong derivative is off by O(1).
template <class Loss>
double finite_difference_mismatch(std::vector<double>& param, const std::vector<double>& grad, Loss loss_of) {
  EXPECT_EQ(param.size(), grad.size());
  const double max_grad = std::abs(
      *std::max_element(grad.begin(), grad.end(), [](double a, double b) { return std::abs(a) < std::abs(b); }));
  EXPECT_GT(max_grad, 0.0) << "the gradient is all zeros: nothing to check";
  Rng rng(99);
  double worst = 0;
  const double h = 1e-6;
  for (int s = 0; s < 24; ++s) {
    const size_t i = size_t(rng.uniform() * double(param.size()));
    const double saved = param[i];
    param[i] = saved + h;
    const double up = loss_of();
    param[i] = saved - h;
    const double down = loss_of();
    param[i] = saved;
    worst = std::max(worst, std::abs((up - down) / (2 * h) - grad[i]));
  }
  return worst / max_grad;
}

constexpr double kFiniteDifferenceTolerance = 2e-8;

void expect_gradients_match_differences(const LayerConfig& c, RoutingKind kind) {
  Tiny t = tiny_problem(c, kind);
  OracleInputs& in = t.in;
  const auto whole = [&] { return loss(in); };
  EXPECT_LT(finite_difference_mismatch(in.x, t.grad.dx, whole), kFiniteDifferenceTolerance) << "dx";
  EXPECT_LT(finite_difference_mismatch(in.w1, t.grad.d_w1, whole), kFiniteDifferenceTolerance) << "d_w1";
  EXPECT_LT(finite_difference_mismatch(in.w2, t.grad.d_w2, whole), kFiniteDifferenceTolerance) << "d_w2";
  if (c.has_shared()) {
    EXPECT_LT(finite_difference_mismatch(in.shared_w1, t.grad.d_shared_w1, whole), kFiniteDifferenceTolerance)
        << "d_shared_w1";
    EXPECT_LT(finite_difference_mismatch(in.shared_w2, t.grad.d_shared_w2, whole), kFiniteDifferenceTolerance)
        << "d_shared_w2";
  }
  // d topk_w: the weights perturbed directly, everything else fixed.
  std::vector<double> topk_w = topk_w_of(in);
  EXPECT_LT(finite_difference_mismatch(topk_w, t.grad.d_topk_w, [&] { return dot(in.dy, oracle_y(in, topk_w)); }),
            kFiniteDifferenceTolerance)
      << "d_topk_w";
  if (!in.routed_by_router()) return;
  EXPECT_LT(finite_difference_mismatch(in.router, t.grad.d_router, whole), kFiniteDifferenceTolerance) << "d_router";
  // d logits: the logits perturbed directly, the selection held fixed.
  std::vector<double> logits = oracle_logits(in);
  const auto through_logits = [&] {
    return dot(in.dy, oracle_y(in, oracle_router_weights(in.config, logits, in.topk_idx)));
  };
  EXPECT_LT(finite_difference_mismatch(logits, t.grad.d_logits, through_logits), kFiniteDifferenceTolerance)
      << "d_logits";
}

LayerConfig tiny_config() {
  LayerConfig c = make_config(2, 4, 64, 64, 4, 2);
  c.shared_intermediate = 64;
  return c;
}

TEST(OracleFiniteDifferences, SoftmaxRenormalisedSharedExpert) {
  expect_gradients_match_differences(tiny_config(), RoutingKind::router);
}

TEST(OracleFiniteDifferences, SoftmaxPlain) {
  LayerConfig c = tiny_config();
  c.renormalize = false;
  c.shared_intermediate = 0;
  expect_gradients_match_differences(c, RoutingKind::router);
}

TEST(OracleFiniteDifferences, SigmoidGroupedScaledClamped) {
  LayerConfig c = with_grouped_sigmoid(make_config(2, 4, 64, 64, 8, 3));
  c.swiglu_limit = 0.5f;
  c.shared_intermediate = 64;
  expect_gradients_match_differences(c, RoutingKind::router);
}

TEST(OracleFiniteDifferences, GivenRouting) { expect_gradients_match_differences(tiny_config(), RoutingKind::zipf); }

// ---- the reference against the oracle ----

struct AccuracyCase {
  std::string name;
  LayerConfig config;
  RoutingKind routing;
  StepModel step = StepModel::fp32_fma;
};

std::vector<AccuracyCase> accuracy_cases() {
  const LayerConfig base = make_config(2, 64, 128, 128, 8, 2);
  LayerConfig plain_shared = base, grouped = with_grouped_sigmoid(base), clamped = base;
  plain_shared.renormalize = false;
  plain_shared.shared_intermediate = 64;
  grouped.shared_intermediate = 64;
  clamped.swiglu_limit = 0.75f;
  clamped.shared_intermediate = 64;
  const std::vector<AccuracyCase> shapes = {
      {"softmax", base, RoutingKind::router},
      {"softmax_plain_shared", plain_shared, RoutingKind::router},
      {"sigmoid_grouped_shared", grouped, RoutingKind::router},
      {"clamped_shared", clamped, RoutingKind::router},
      {"router_ties", base, RoutingKind::router_ties},
      {"given_uniform", base, RoutingKind::uniform},
      {"given_zipf", base, RoutingKind::zipf},
      {"given_one_hot", base, RoutingKind::one_hot},
      {"given_all_to_one", base, RoutingKind::all_to_one},
      {"given_sparse", base, RoutingKind::sparse},
  };
  std::vector<AccuracyCase> out;
  for (StepModel step : {StepModel::fp32_fma, StepModel::hopper_tc})
    for (AccuracyCase cs : shapes) {
      cs.step = step;
      cs.name += step == StepModel::hopper_tc ? "_hopper_tc" : "_fp32_fma";
      out.push_back(cs);
    }
  return out;
}

class ReferenceVsOracle : public ::testing::TestWithParam<AccuracyCase> {};

TEST_P(ReferenceVsOracle, EveryTensorWithinItsBound) {
  const AccuracyCase& cs = GetParam();
  const Problem p = make_problem(cs.config, 7, cs.routing);
  Options opt;
  opt.step = cs.step;
  const Forward f = forward(cs.config, p.x, p.weights, p.routing ? &*p.routing : nullptr, opt);
  const Gradients g = backward(cs.config, p.x, p.weights, f, p.dy, opt);
  const std::vector<OracleCheck> checks =
      compare_with_oracle(f, g, oracle(oracle_inputs(cs.config, p.x, p.weights, p.dy, f)));
  const size_t want = (p.routing ? 6 : 9) + (cs.config.has_shared() ? 2 : 0);  // every tensor the layer makes
  EXPECT_EQ(checks.size(), want);
  for (const OracleCheck& ch : checks) {
    EXPECT_TRUE(ch.passed()) << to_string(ch.tensor) << ": relative " << ch.error.relative << ", max_abs "
                             << ch.error.max_abs << " of max_ref " << ch.error.max_ref << ", bound " << ch.bound;
    EXPECT_GT(ch.error.max_ref, 0.0) << to_string(ch.tensor) << " is all zeros in the oracle";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, ReferenceVsOracle, ::testing::ValuesIn(accuracy_cases()),
                         [](const ::testing::TestParamInfo<AccuracyCase>& info) { return info.param.name; });

// Runs the reference (fp32_fma) and the oracle on one problem and returns every check.
std::vector<OracleCheck> checks_of(const LayerConfig& c, const Problem& p) {
  Options opt;
  opt.step = StepModel::fp32_fma;
  const Forward f = forward(c, p.x, p.weights, p.routing ? &*p.routing : nullptr, opt);
  const Gradients g = backward(c, p.x, p.weights, f, p.dy, opt);
  return compare_with_oracle(f, g, oracle(oracle_inputs(c, p.x, p.weights, p.dy, f)));
}

const OracleCheck& check_of(const std::vector<OracleCheck>& checks, OracleTensor t) {
  const auto it = std::find_if(checks.begin(), checks.end(), [t](const OracleCheck& ch) { return ch.tensor == t; });
  EXPECT_NE(it, checks.end()) << to_string(t);
  return *it;
}

// The fp8 mode against the oracle on its unquantized inputs: within the fp8 bounds, and beyond the
// bf16 ones where the E4M3 quantization reaches (the fp8 bounds are not the bf16 ones in disguise, and
// the quantization really is in the results).
TEST(ReferenceVsOracleFp8, WithinTheFp8BoundsBeyondTheBf16Ones) {
  LayerConfig softmax = make_config(2, 64, 128, 128, 8, 2),
              grouped = with_grouped_sigmoid(make_config(2, 32, 256, 128, 8, 2));
  softmax.shared_intermediate = 128;
  grouped.swiglu_limit = 0.75f;
  for (LayerConfig c : {softmax, grouped}) {
    c.precision = Precision::fp8;
    const Problem p = make_problem(c, 7);
    Options opt;  // hopper_tc: the weight gradients' bf16 chains
    const Forward f = forward(c, p.x, p.weights, nullptr, opt);
    const Gradients g = backward(c, p.x, p.weights, f, p.dy, opt);
    const std::vector<OracleCheck> checks =
        compare_with_oracle(f, g, oracle(oracle_inputs(c, p.x, p.weights, p.dy, f)));
    EXPECT_EQ(checks.size(), c.has_shared() ? 11u : 9u);
    for (const OracleCheck& ch : checks) {
      EXPECT_EQ(ch.bound, oracle_bound(ch.tensor, Precision::fp8));
      EXPECT_TRUE(ch.passed()) << to_string(ch.tensor) << ": relative " << ch.error.relative << ", max_abs "
                               << ch.error.max_abs << " of max_ref " << ch.error.max_ref << ", bound " << ch.bound;
    }
    for (const OracleTensor t : {OracleTensor::y, OracleTensor::dx, OracleTensor::d_w1, OracleTensor::d_w2})
      EXPECT_GT(check_of(checks, t).error.relative, oracle_bound(t, Precision::bf16)) << to_string(t);
  }
}

// Options::fp8_weight_gradients (docs/accuracy.md): E4M3 operands change the routed experts' weight
// gradients alone, which stay within the fp8 bounds but further from the oracle than the bf16 ones; a
// ring that splits an expert's rows gives the same bits (each expert's gradients are made over all its
// rows at once).
TEST(ReferenceVsOracleFp8, Fp8WeightGradientsStayWithinTheFp8Bounds) {
  LayerConfig c = make_config(2, 64, 128, 128, 8, 2);
  c.precision = Precision::fp8;
  const Problem p = make_problem(c, 8);
  Options opt;
  opt.ring_rows = 1 << 16;
  const Forward f = forward(c, p.x, p.weights, nullptr, opt);
  const Gradients bf16_grads = backward(c, p.x, p.weights, f, p.dy, opt);
  opt.fp8_weight_gradients = true;
  const Gradients fp8_grads = backward(c, p.x, p.weights, f, p.dy, opt);
  EXPECT_EQ(first_bit_mismatch("dx", fp8_grads.dx, bf16_grads.dx), "");
  EXPECT_NE(first_bit_mismatch("d_w1", fp8_grads.d_w1, bf16_grads.d_w1), "");
  const OracleResult o = oracle(oracle_inputs(c, p.x, p.weights, p.dy, f));
  const std::vector<OracleCheck> ours = compare_with_oracle(f, bf16_grads, o),
                                 theirs = compare_with_oracle(f, fp8_grads, o);
  for (const OracleTensor t : {OracleTensor::d_w1, OracleTensor::d_w2}) {
    EXPECT_TRUE(check_of(theirs, t).passed()) << to_string(t);
    EXPECT_GT(check_of(theirs, t).error.relative, check_of(ours, t).error.relative) << to_string(t);
  }
  opt.ring_rows = 16;
  const Gradients split = backward(c, p.x, p.weights, f, p.dy, opt);
  EXPECT_EQ(first_bit_mismatch("d_w1", split.d_w1, fp8_grads.d_w1), "");
  EXPECT_EQ(first_bit_mismatch("d_w2", split.d_w2, fp8_grads.d_w2), "");
}

// Fuzzer false positive 1 (docs/fuzzing.md): at k = 1 with renormalisation the weight is the constant
// 1 (softmax) or routed_scale (sigmoid), so d logits and d router are exactly zero. The reference
// returns exact zeros; the oracle must too, and 0 against 0 is error 0.
TEST(ReferenceVsOracleEdges, TopOneRenormalisedRouterGradientsAreExactlyZero) {
  for (ScoreMode mode : {ScoreMode::softmax, ScoreMode::sigmoid}) {
    LayerConfig c = make_config(2, 8, 64, 64, 8, 1);
    c.renormalize = true;
    c.score_mode = mode;
    if (mode == ScoreMode::sigmoid) c.routed_scale = 2.5f;
    const Problem p = make_problem(c, 5, RoutingKind::router);
    Options opt;
    opt.step = StepModel::fp32_fma;
    const Forward f = forward(c, p.x, p.weights, nullptr, opt);
    const OracleResult o = oracle(oracle_inputs(c, p.x, p.weights, p.dy, f));
    ASSERT_FALSE(o.d_logits.empty() || o.d_router.empty() || o.d_logits_scale.empty());
    for (double v : o.d_logits) ASSERT_EQ(v, 0.0) << "d_logits";
    for (double v : o.d_router) ASSERT_EQ(v, 0.0) << "d_router";
    for (double v : o.d_logits_scale) ASSERT_EQ(v, 0.0) << "d_logits_scale";
    int router_checks = 0;  // d_logits and d_router: both must be among the checks
    for (const OracleCheck& ch : checks_of(c, p)) {
      EXPECT_TRUE(ch.passed()) << to_string(ch.tensor) << ": relative " << ch.error.relative << ", bound " << ch.bound;
      if (ch.tensor == OracleTensor::d_logits || ch.tensor == OracleTensor::d_router) {
        ++router_checks;
        EXPECT_EQ(ch.error.relative, 0.0) << to_string(ch.tensor);
        EXPECT_EQ(ch.error.max_abs, 0.0) << to_string(ch.tensor);
      }
    }
    EXPECT_EQ(router_checks, 2);
  }
}

// Fuzzer false positive 2: a one-element d topk_w = <g, a> whose terms cancel. dy is tuned so that
// <dy, y_e> = <dy W2, a> nearly vanishes; the reference's bf16 a then leaves an error of the size u
// times the terms, which is O(1) of the cancelled value but well inside the bound against the
// condition scale ||g .* a||_2. d logits (softmax, not renormalised) inherits the cancellation.
TEST(ReferenceVsOracleEdges, CancellingSingleElementTopkWeightGradientPasses) {
  LayerConfig c = make_config(1, 1, 64, 64, 4, 1);
  c.renormalize = false;
  Problem p = make_problem(c, 3, RoutingKind::router);
  Options opt;
  opt.step = StepModel::fp32_fma;
  const Forward f = forward(c, p.x, p.weights, nullptr, opt);
  // y_e, the expert's output before its weight: the oracle's y at weight 1.
  const std::vector<double> ye = oracle_y(oracle_inputs(c, p.x, p.weights, p.dy, f), {1.0});
  std::vector<size_t> order(ye.size());
  for (size_t h = 0; h < order.size(); ++h) order[h] = h;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return std::abs(ye[a]) > std::abs(ye[b]); });
  for (int pass = 0; pass < 3; ++pass)
    for (size_t h : order) {
      double dot = 0;
      for (size_t i = 0; i < ye.size(); ++i) dot += double(to_float(p.dy[i])) * ye[i];
      const double step = dot / ye[h];
      if (std::abs(step) < 4.0) p.dy[h] = to_bf16(float(double(to_float(p.dy[h])) - step));
    }
  const OracleResult o = oracle(oracle_inputs(c, p.x, p.weights, p.dy, f));
  ASSERT_EQ(o.d_topk_w.size(), 1u);
  EXPECT_LT(std::abs(o.d_topk_w[0]), 1e-3 * o.d_topk_w_scale[0]) << "the dot product did not cancel";
  const Gradients g = backward(c, p.x, p.weights, f, p.dy, opt);
  // Against the value, the error is far beyond the bound: the old metric's false positive.
  EXPECT_GT(tensor_error(g.d_topk_w, o.d_topk_w).relative, oracle_bound(OracleTensor::d_topk_w));
  const std::vector<OracleCheck> checks = compare_with_oracle(f, g, o);
  for (const OracleCheck& ch : checks)
    EXPECT_TRUE(ch.passed()) << to_string(ch.tensor) << ": relative " << ch.error.relative << ", max_abs "
                             << ch.error.max_abs << " of max_ref " << ch.error.max_ref << ", bound " << ch.bound;
  EXPECT_GT(check_of(checks, OracleTensor::d_topk_w).error.relative, 0.0);
}

// Fuzzer false positive 3 (issue 16; mok-fuzz --seed 1796121451 --property oracle --cases 658 --backend
// gpu, case 658): the SwiGLU clamp's branch decided apart from the layer. Token 30's slot 6 (expert 6,
// gate column 298) has the fp64 h 0.751953218, 9.3e-8 above the bf16 midpoint 0.751953125 between the
// limit 0.75 and 0.75390625. The layer's fp32 h (hopper_tc truncates) rounds to bf16 0.75, which is
// not beyond the limit: that gate passes its gradient. bf16 of the fp64 h is 0.75390625: an oracle
// that decides there clamps the gate and drops the gradient, and d_w1[6, 298, 400] is off by 4.3e-2
// of a largest 0.72 (the elementwise check allows 1.1e-2). The oracle takes the branch from the
// layer's bf16 h, as it takes topk_idx.
TEST(ReferenceVsOracleEdges, ClampBranchFollowsTheLayersBf16H) {
  LayerConfig c = make_config(4, 16, 448, 320, 8, 7);
  c.score_mode = ScoreMode::sigmoid;
  c.renormalize = true;
  c.swiglu_limit = 0.75f;
  const Problem p = make_problem(c, 17442508406817426815ull, RoutingKind::uniform);
  for (bool recompute : {false, true}) {
    Options opt;
    opt.step = StepModel::hopper_tc;
    opt.recompute = recompute;
    const Forward f = forward(c, p.x, p.weights, &*p.routing, opt);
    const Gradients g = backward(c, p.x, p.weights, f, p.dy, opt);
    // In recompute mode the forward keeps no h: the branch comes from a forward that saves it (the
    // backward recomputes the same bits).
    Options saving = opt;
    saving.recompute = false;
    const Forward saved = recompute ? forward(c, p.x, p.weights, &*p.routing, saving) : f;
    ASSERT_EQ(saved.h.size(), size_t(c.tokens()) * c.top_k * 2 * c.intermediate);
    // The operand of the issue: the layer's h at the limit, unclamped.
    const size_t row = size_t(saved.layout.slot_row[30 * c.top_k + 6]);
    ASSERT_EQ(p.routing->topk_idx[30 * c.top_k + 6], 6);
    EXPECT_EQ(to_float(saved.h[row * 2 * c.intermediate + 298]), 0.75f);
    for (const OracleCheck& ch : compare_with_oracle(f, g, oracle(oracle_inputs(c, p.x, p.weights, p.dy, saved))))
      EXPECT_TRUE(ch.passed()) << to_string(ch.tensor) << " (recompute " << recompute << "): relative "
                               << ch.error.relative << ", max_abs " << ch.error.max_abs << " of max_ref "
                               << ch.error.max_ref << ", bound " << ch.bound;
    if (recompute) continue;
    // The previous rule, the branch on bf16 of the oracle's fp64 h, clamps that gate: d_w1 fails.
    OracleInputs own = oracle_inputs(c, p.x, p.weights, p.dy, f);
    own.clamped.clear();
    const OracleCheck d_w1 = check_of(compare_with_oracle(f, g, oracle(own)), OracleTensor::d_w1);
    EXPECT_FALSE(d_w1.passed()) << "max_abs " << d_w1.error.max_abs << " of max_ref " << d_w1.error.max_ref;
  }
}

TEST(TensorError, ExactZeroIsErrorZeroAndADifferenceFromZeroFails) {
  const TensorError same = tensor_error(std::vector<float>{0.0f, 0.0f}, std::vector<double>{0.0, 0.0});
  EXPECT_EQ(same.relative, 0.0);
  EXPECT_TRUE((OracleCheck{OracleTensor::d_logits, same, 1e-2}).passed());
  const TensorError off = tensor_error(std::vector<float>{0.0f, 1e-30f}, std::vector<double>{0.0, 0.0});
  EXPECT_TRUE(std::isinf(off.relative));
  EXPECT_FALSE((OracleCheck{OracleTensor::d_logits, off, 1e-2}).passed());
}

TEST(TensorError, MeasuresAgainstAConditionScale) {
  const TensorError e =
      tensor_error(std::vector<float>{1.0f, 0.5f}, std::vector<double>{1.0, 0.0}, std::vector<double>{3.0, 4.0});
  EXPECT_DOUBLE_EQ(e.relative, 0.5 / 5.0);
  EXPECT_DOUBLE_EQ(e.max_abs, 0.5);
  EXPECT_DOUBLE_EQ(e.max_ref, 4.0);
  EXPECT_THROW(tensor_error(std::vector<float>(2), std::vector<double>(2), std::vector<double>(1)), InternalError);
}

TEST(TensorError, MeasuresRelativeFrobeniusAndMaxAbs) {
  const TensorError e = tensor_error(std::vector<float>{3.0f, 4.5f}, std::vector<double>{3.0, 4.0});
  EXPECT_DOUBLE_EQ(e.relative, 0.5 / 5.0);
  EXPECT_DOUBLE_EQ(e.max_abs, 0.5);
  EXPECT_DOUBLE_EQ(e.max_ref, 4.0);
  EXPECT_THROW(tensor_error(std::vector<bf16>(3), std::vector<double>(2)), InternalError);
}

}  // namespace
}  // namespace mok::ref::test
