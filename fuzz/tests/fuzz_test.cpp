#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <sstream>
#include <thread>

#include "mok/core/dispatch_layout.h"
#include "mok/fuzz/driver.h"
#include "mok/fuzz/generators.h"
#include "mok/fuzz/properties.h"
#include "mok/fuzz/repro.h"

namespace mok::fuzz {
namespace {

// Checks `body` on `cases` generated cases with a fixed seed.
template <class Body>
void check_cases(int cases, Body body) {
  rc::detail::TestParams params;
  params.seed = 7;
  params.maxSuccess = cases;
  params.disableShrinking = true;
  struct Silent final : rc::detail::TestListener {
    void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
    void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
    void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
  } silent;
  const rc::detail::TestResult result = rc::detail::checkProperty(rc::detail::toProperty(body), {}, params, silent, {});
  std::ostringstream what;
  rc::detail::printResultMessage(result, what);
  EXPECT_TRUE(result.is<rc::detail::SuccessResult>()) << what.str();
}

TEST(Generators, CasesAreValidAndCoverTheEdges) {
  int one_token = 0, odd = 0, sigmoid_groups = 0, shared = 0, clamped = 0, hopper = 0, chunks = 0, wide = 0;
  std::vector<int> kinds(7, 0);
  check_cases(400, [&] {
    const FuzzCase fc = *gen_fuzz_case();
    validate(fc.config);
    const ref::Problem p = make_problem(fc);
    RC_ASSERT(p.x.size() == size_t(fc.config.tokens()) * fc.config.hidden);
    RC_ASSERT(fc.params.options.ring_rows > 0 && fc.params.options.ring_rows % 16 == 0);
    one_token += fc.config.tokens_per_rank == 1;
    odd += fc.config.tokens_per_rank % 2;
    sigmoid_groups += fc.config.score_mode == ScoreMode::sigmoid && fc.config.n_group > 1;
    shared += fc.config.has_shared();
    clamped += fc.config.swiglu_limit > 0;
    hopper += fc.params.options.step == StepModel::hopper_tc;
    chunks += fc.config.tokens() > kLayoutChunk;
    wide += fc.config.hidden > 256 && fc.config.intermediate > 256;  // past one GPU tile both ways
    ++kinds[int(fc.routing)];
  });
  for (int n : {one_token, odd, sigmoid_groups, shared, clamped, hopper, chunks, wide}) EXPECT_GT(n, 10);
  for (int n : kinds) EXPECT_GT(n, 20);
}

TEST(BruteForceTopk, TiesGoToTheLowerIndex) {
  LayerConfig c;
  c.experts = 4;
  c.top_k = 2;
  const float scores[4] = {0.25f, 0.5f, 0.5f, 0.25f};
  EXPECT_EQ(brute_force_topk(c, scores, nullptr), (std::vector<int32_t>{1, 2}));
  c.top_k = 3;
  EXPECT_EQ(brute_force_topk(c, scores, nullptr), (std::vector<int32_t>{1, 2, 0}));
}

TEST(BruteForceTopk, GroupsRankByTheirTwoBestKeys) {
  LayerConfig c;
  c.experts = 6;
  c.top_k = 2;
  c.score_mode = ScoreMode::sigmoid;
  c.n_group = 3;
  c.topk_group = 1;
  // Groups {0,1} {2,3} {4,5}: sums 0.75, 0.75, 0.875; group 2 wins alone, then the tie goes to group 0.
  const float scores[6] = {0.5f, 0.25f, 0.125f, 0.625f, 0.4375f, 0.4375f};
  EXPECT_EQ(brute_force_topk(c, scores, nullptr), (std::vector<int32_t>{4, 5}));
  c.topk_group = 2;
  c.top_k = 3;
  EXPECT_EQ(brute_force_topk(c, scores, nullptr), (std::vector<int32_t>{0, 4, 5}));
}

TEST(Backends, GpuIsReportedUnavailable) {
  EXPECT_EQ(make_backend("reference")->name(), "reference");
  EXPECT_THROW(make_backend("gpu"), Error);
  EXPECT_THROW(make_backend("cuda"), Error);
}

struct PlantedFault {
  ref::Fault fault;
  const char* property;
  long bound;  // cases within which the seed-1 run must catch it (docs/fuzzing.md lists the counts)
};

void PrintTo(const PlantedFault& pf, std::ostream* os) {
  *os << to_string(pf.fault) << " by " << pf.property << " within " << pf.bound << " cases";
}

class FaultInjection : public testing::TestWithParam<PlantedFault> {};

// Each planted fault is caught within its bound, shrinks to a repro file, and that file fails on
// replay with the fault and passes without it.
TEST_P(FaultInjection, IsCaughtAndReplays) {
  const PlantedFault pf = GetParam();
  FuzzOptions o;
  o.seed = 1;
  o.cases = pf.bound;
  o.properties = {pf.property};
  o.fault = pf.fault;
  o.repro_dir = std::filesystem::path(testing::TempDir()) / "mok_fuzz_repros";
  ReferenceBackend backend;
  std::ostringstream log;
  const std::vector<PropertyReport> reports = run_fuzz(backend, o, log);
  ASSERT_EQ(reports.size(), 1u);
  const PropertyReport& r = reports[0];
  ASSERT_TRUE(r.failed) << to_string(pf.fault) << " not caught by " << pf.property << " in " << pf.bound << " cases\n"
                        << log.str();
  std::cout << to_string(pf.fault) << ": caught by " << pf.property << " at case " << r.cases << " (" << r.shrink_steps
            << " shrink steps): " << r.failure << "\n";
  ASSERT_FALSE(r.repro.empty()) << log.str();
  Repro repro = read_repro(r.repro);
  EXPECT_EQ(repro.property, pf.property);
  EXPECT_EQ(repro.params.options.fault, pf.fault);
  EXPECT_TRUE(replay(backend, repro).has_value()) << "the repro does not reproduce " << to_string(pf.fault);
  repro.params.options.fault = ref::Fault::none;
  const Verdict clean = replay(backend, repro);
  EXPECT_FALSE(clean.has_value()) << *clean;
}

INSTANTIATE_TEST_SUITE_P(Planted, FaultInjection,
                         testing::Values(PlantedFault{ref::Fault::combine_order, "conservation", 20},
                                         PlantedFault{ref::Fault::layout_off_by_one, "conservation", 20},
                                         PlantedFault{ref::Fault::tie_higher_index, "topk", 40},
                                         PlantedFault{ref::Fault::drop_overflow, "conservation", 20},
                                         PlantedFault{ref::Fault::router_grad_sign, "router_backward", 20}),
                         [](const testing::TestParamInfo<PlantedFault>& info) { return to_string(info.param.fault); });

TEST(Driver, SameSeedSameRun) {
  FuzzOptions o;
  o.seed = 42;
  o.cases = 30;
  o.properties = {"conservation"};
  o.fault = ref::Fault::combine_order;
  o.repro_dir = std::filesystem::path(testing::TempDir()) / "mok_fuzz_determinism";
  ReferenceBackend backend;
  std::ostringstream log;
  const PropertyReport a = run_fuzz(backend, o, log)[0], b = run_fuzz(backend, o, log)[0];
  ASSERT_TRUE(a.failed);
  EXPECT_EQ(a.cases, b.cases);
  EXPECT_EQ(a.counterexample, b.counterexample);
  EXPECT_EQ(a.failure, b.failure);
}

// The reference, at least `delay` per forward and per backward: a case of `repeat` (two of each) takes
// four delays, so a round of four cases far outlasts a one-second budget.
class SlowBackend final : public Backend {
 public:
  explicit SlowBackend(std::chrono::milliseconds delay) : delay_(delay) {}
  std::string name() const override { return "slow reference"; }
  ref::Forward forward(const LayerConfig& c, const std::vector<bf16>& x, const ref::LayerWeights& w,
                       const ref::Routing* given, const ref::Options& opt) override {
    std::this_thread::sleep_for(delay_);
    return reference_.forward(c, x, w, given, opt);
  }
  ref::Gradients backward(const LayerConfig& c, const std::vector<bf16>& x, const ref::LayerWeights& w,
                          const ref::Forward& fwd, const std::vector<bf16>& dy, const ref::Options& opt) override {
    std::this_thread::sleep_for(delay_);
    return reference_.backward(c, x, w, fwd, dy, opt);
  }

 private:
  std::chrono::milliseconds delay_;
  ReferenceBackend reference_;
};

// The budget holds within one layer run: the deadline is checked before every case and every layer run
// (it used to be checked between rounds of four cases: here 3.2 s and more for a 1 s budget). The case
// the deadline cuts short is dropped, neither counted nor a failure.
TEST(Driver, TimeBudgetHoldsWithinOneLayerRun) {
  FuzzOptions o;
  o.seed = 1;
  o.cases = 0;
  o.seconds = 1;
  o.properties = {"repeat"};
  SlowBackend backend(std::chrono::milliseconds(200));
  std::ostringstream log;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<PropertyReport> reports = run_fuzz(backend, o, log);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_FALSE(reports[0].failed) << reports[0].failure;
  EXPECT_GE(reports[0].cases, 1);
  EXPECT_LE(reports[0].cases, 2);
  EXPECT_LT(seconds, 2.0) << log.str();
}

}  // namespace
}  // namespace mok::fuzz
