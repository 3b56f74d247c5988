#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <new>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "mok/core/dispatch_layout.h"
#include "mok/core/fields.h"
#include "mok/fuzz/compare.h"
#include "mok/fuzz/driver.h"
#include "mok/fuzz/generators.h"
#include "mok/fuzz/properties.h"
#include "mok/fuzz/repro.h"
#include "mok/golden/golden.h"

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
  int one_token = 0, odd = 0, sigmoid_groups = 0, shared = 0, clamped = 0, hopper = 0, chunks = 0, wide = 0, fp8 = 0;
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
    fp8 += fc.config.precision == Precision::fp8;
    ++kinds[int(fc.routing)];
  });
  for (int n : {one_token, odd, sigmoid_groups, shared, clamped, hopper, chunks, wide, fp8}) EXPECT_GT(n, 10);
  for (int n : kinds) EXPECT_GT(n, 20);
}

// Every divisor of E within the generator's ranges is drawn: R up to 8 and any n_group (E = 12's R = 6 and
// n_group = 12 included).
TEST(Generators, DrawEveryDivisorOfTheExperts) {
  std::set<std::pair<int, int>> ranks, groups;
  check_cases(3000, [&] {
    const LayerConfig c = *gen_config();
    ranks.insert({c.experts, c.ranks});
    if (c.score_mode == ScoreMode::sigmoid) groups.insert({c.experts, c.n_group});
  });
  for (const int e : {1, 2, 4, 8, 16, 3, 6, 12})
    for (int d = 1; d <= e; ++d) {
      if (e % d != 0) continue;
      if (d <= 8) {
        EXPECT_TRUE(ranks.contains({e, d})) << "E " << e << ", R " << d << " never drawn";
      }
      EXPECT_TRUE(groups.contains({e, d})) << "E " << e << ", n_group " << d << " never drawn";
    }
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

// One reference run with every field of Forward and Gradients non-empty: router routing (logits, d_router),
// a shared expert, saved activations.
struct FullRun {
  LayerConfig config = with_shared(make_config(2, 8, 64, 64, 4, 2));
  ref::Problem problem = ref::make_problem(config, 3);
  ref::Forward fwd = ref::forward(config, problem.x, problem.weights, nullptr, {});
  ref::Gradients grad = ref::backward(config, problem.x, problem.weights, fwd, problem.dy, {});

  static LayerConfig with_shared(LayerConfig c) {
    c.shared_intermediate = 64;
    return c;
  }
};

bf16 flipped(bf16 v) { return bf16{uint16_t(v.bits ^ 1u)}; }
float flipped(float v) { return float_of(bits_of(v) ^ 1u); }
int32_t flipped(int32_t v) { return v ^ 1; }

// Flips the lowest bit of each field's last element in turn (a copy of `result`), and expects `check`
// to name that field.
template <class Result, class Check>
void expect_every_field_compared(const Result& result, Check check) {
  for_each_field(result, [&](const char* name, const auto& field) {
    ASSERT_FALSE(field.empty()) << name;
    Result changed = result;
    for_each_field(changed, [&](const char* changed_name, auto& changed_field) {
      if (std::string(changed_name) == name) changed_field.back() = flipped(changed_field.back());
    });
    check(name, changed);
  });
}

TEST(Compare, ForwardComparesEveryFieldAndActivationsOnlyWhenAsked) {
  const FullRun run;
  EXPECT_EQ(compare_forward(run.config, run.fwd, run.fwd, true), std::nullopt);
  expect_every_field_compared(run.fwd, [&](const std::string& name, const ref::Forward& changed) {
    const Verdict v = compare_forward(run.config, run.fwd, changed, true);
    ASSERT_TRUE(v) << name;
    EXPECT_EQ(v->rfind(name + "[", 0), 0u) << *v;
    const Verdict without = compare_forward(run.config, run.fwd, changed, false);
    if (name == "h" || name == "shared_h" || name == "shared_a")  // a recomputing run has none
      EXPECT_EQ(without, std::nullopt) << *without;
    else
      EXPECT_EQ(without, v);
  });
}

TEST(Compare, GradientsCompareEveryField) {
  const FullRun run;
  EXPECT_EQ(compare_gradients(run.config, run.grad, run.grad), std::nullopt);
  expect_every_field_compared(run.grad, [&](const std::string& name, const ref::Gradients& changed) {
    const Verdict v = compare_gradients(run.config, run.grad, changed);
    ASSERT_TRUE(v) << name;
    EXPECT_EQ(v->rfind(name + "[", 0), 0u) << *v;
  });
}

// Rows of the field's own width in the config: y and dx by token (H), d_w2 by weight row (I), the layout
// tables one element a row; the first differing field in fields.h's order is the one reported.
TEST(Compare, MismatchesAreNamedByRowAndColumn) {
  const FullRun run;
  const int H = run.config.hidden, I = run.config.intermediate;
  ref::Forward fwd = run.fwd;
  fwd.y[size_t(3) * H + 5] = to_bf16(2.0f);
  fwd.y[size_t(4) * H] = to_bf16(2.0f);
  EXPECT_EQ(compare_forward(run.config, run.fwd, fwd, false),
            "y[3, 5]: " + show_element(run.fwd.y[size_t(3) * H + 5]) + " vs 0x4000 (0x1p+1)");
  fwd.layout.slot_row[7] += 1;
  EXPECT_EQ(compare_forward(run.config, run.fwd, fwd, false),
            "slot_row[7, 0]: " + std::to_string(run.fwd.layout.slot_row[7]) + " vs " +
                std::to_string(fwd.layout.slot_row[7]));
  ref::Gradients grad = run.grad;
  grad.d_w2[size_t(2) * I + 1] = -grad.d_w2[size_t(2) * I + 1];
  const Verdict v = compare_gradients(run.config, run.grad, grad);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->rfind("d_w2[2, 1]: ", 0), 0u) << *v;
}

// Two GPU runs that both left an element unwritten hold the same poison there (every byte 0xff): a
// difference all the same, as is a run without its y or dx, which would compare equal to another's.
TEST(Compare, PoisonAndMissingTokensAreDifferences) {
  const FullRun run;
  ref::Forward fwd = run.fwd;
  fwd.y[7] = bf16{0xffff};
  EXPECT_EQ(compare_forward(run.config, fwd, fwd, true), "y[7] holds the poison (every byte 0xff): no run wrote it");
  fwd = run.fwd;
  fwd.layout.row_source[2] = -1;
  EXPECT_EQ(compare_forward(run.config, fwd, fwd, true),
            "row_source[2] holds the poison (every byte 0xff): no run wrote it");
  ref::Gradients grad = run.grad;
  grad.d_w1[5] = float_of(0xffffffffu);
  EXPECT_EQ(compare_gradients(run.config, grad, grad), "d_w1[5] holds the poison (every byte 0xff): no run wrote it");
  ref::Forward empty = run.fwd;
  empty.y.clear();
  const Verdict v = compare_forward(run.config, empty, empty, true);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->rfind("y: 0 elements, expected ", 0), 0u) << *v;
  ref::Gradients no_dx = run.grad;
  no_dx.dx.clear();
  ASSERT_TRUE(compare_gradients(run.config, run.grad, no_dx));
}

// The error's message (it was any Error: an unknown name passed for an unavailable backend).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The gpu backend where a Hopper GPU and CUDA are here; elsewhere an error saying which is missing. An unknown
// name is refused by name.
TEST(Backends, GpuIsThereOrReportedUnavailable) {
  EXPECT_EQ(make_backend("reference")->name(), "reference");
  std::string gpu_error;
  try {
    EXPECT_EQ(make_backend("gpu")->name(), "gpu");
  } catch (const Error& e) {
    gpu_error = e.what();
  }
  if (!gpu_error.empty()) {
    EXPECT_TRUE(gpu_error.find("this build has no CUDA") != std::string::npos ||
                gpu_error.find("the gpu backend needs a Hopper GPU") != std::string::npos)
        << gpu_error;
  }
  EXPECT_EQ(error_of([] { make_backend("cuda"); }), "mok-fuzz: unknown backend 'cuda' (reference or gpu)");
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
                                         PlantedFault{ref::Fault::router_grad_sign, "router_backward", 20},
                                         PlantedFault{ref::Fault::router_grad_sign, "oracle", 20},
                                         PlantedFault{ref::Fault::rank_combine_order, "rank_invariance", 40},
                                         PlantedFault{ref::Fault::ring_combine_order, "ring_invariance", 40},
                                         PlantedFault{ref::Fault::call_combine_order, "repeat", 40},
                                         PlantedFault{ref::Fault::position_combine_order, "permutation", 40},
                                         PlantedFault{ref::Fault::position_combine_order, "batch_invariance", 40}),
                         [](const testing::TestParamInfo<PlantedFault>& info) {
                           return to_string(info.param.fault) + "_by_" + info.param.property;
                         });

// N and E coprime leave R = 1 alone dividing both: rank_invariance then varies R over a cut of the batch,
// so it still catches a fault that makes the bits depend on R (E = 3, N = 385 cut to 384 tokens on R = 1
// and 3; a reversed sum of three slots shows in about one bf16 y in 10^4), and passes without it, also
// where N < 3 (N = 2 cycled to 3 tokens).
TEST(RankInvariance, VariesTheRanksWhereNAndEShareNoDivisor) {
  const Property& rank_invariance = find_property("rank_invariance");
  ReferenceBackend backend;
  for (const int tokens : {385, 2}) {
    const LayerConfig c = make_config(1, tokens, 256, 64, 3, 3);
    const ref::Problem p = ref::make_problem(c, 5);
    CaseParams cp;
    EXPECT_EQ(rank_invariance.check(backend, p, cp), std::nullopt) << tokens << " tokens";
    if (tokens < 3) continue;
    cp.options.fault = ref::Fault::rank_combine_order;
    const Verdict v = rank_invariance.check(backend, p, cp);
    ASSERT_TRUE(v.has_value()) << tokens << " tokens: rank_combine_order not caught";
    EXPECT_NE(v->find("the batch cut to 384 tokens, R = 3 vs R = 1"), std::string::npos) << *v;
  }
}

// A campaign that checked nothing (a budget spent before any case) exited 0, and so did one that left a
// property unchecked; one whose failure's repro could not be written exited 1 as if the repro were there.
TEST(Driver, ExitStatusSaysWhatWasChecked) {
  const auto report = [](long cases, bool failed, const char* repro_error = "") {
    PropertyReport r;
    r.cases = cases, r.failed = failed, r.repro_error = repro_error;
    return r;
  };
  EXPECT_EQ(campaign_exit_status({report(3, false), report(4, false)}), 0);
  EXPECT_EQ(campaign_exit_status({report(3, false), report(0, false)}), 2);  // the second property unchecked
  EXPECT_EQ(campaign_exit_status({report(3, true), report(0, false)}), 2);
  EXPECT_EQ(campaign_exit_status({report(3, true), report(5, false)}), 1);  // a repro, or no case to keep
  EXPECT_EQ(campaign_exit_status({report(0, false), report(0, false)}), 2);
  EXPECT_EQ(campaign_exit_status({}), 2);
  EXPECT_EQ(campaign_exit_status({report(3, true, "No space left on device"), report(5, false)}), 2);
}

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

// A property's first case runs whole, whatever its share: with a budget two slow first cases outlast, each
// property still checks one case (the first was cut at its share, the second started past the end: a
// loaded CI machine's mok_fuzz_ci left invalid_inputs without a case), and none runs a second.
TEST(Driver, EveryPropertyRunsItsFirstCaseWhole) {
  FuzzOptions o;
  o.seed = 1;
  o.cases = 0;
  o.seconds = 0.1;
  o.properties = {"repeat", "topk"};
  SlowBackend backend(std::chrono::milliseconds(100));
  std::ostringstream log;
  const std::vector<PropertyReport> reports = run_fuzz(backend, o, log);
  ASSERT_EQ(reports.size(), 2u);
  for (const PropertyReport& r : reports) {
    EXPECT_FALSE(r.failed) << r.property << ": " << r.failure;
    EXPECT_EQ(r.cases, 1) << r.property << "\n" << log.str();
  }
  EXPECT_EQ(campaign_exit_status(reports), 0);
}

// The reference, whose n-th forward finds no memory.
class OutOfMemoryBackend final : public Backend {
 public:
  explicit OutOfMemoryBackend(int n = 3) : n_(n) {}
  std::string name() const override { return "reference short of memory"; }
  ref::Forward forward(const LayerConfig& c, const std::vector<bf16>& x, const ref::LayerWeights& w,
                       const ref::Routing* given, const ref::Options& opt) override {
    if (++forwards_ == n_) throw std::bad_alloc();
    return reference_.forward(c, x, w, given, opt);
  }
  bool threw() const { return forwards_ >= n_; }
  ref::Gradients backward(const LayerConfig& c, const std::vector<bf16>& x, const ref::LayerWeights& w,
                          const ref::Forward& fwd, const std::vector<bf16>& dy, const ref::Options& opt) override {
    return reference_.backward(c, x, w, fwd, dy, opt);
  }

 private:
  int n_, forwards_ = 0;
  ReferenceBackend reference_;
};

// Running out of host memory is the machine's failure, not a property's: it was reported as one and shrunk
// to a case that did not reproduce. The campaign stops with an error naming it (mok-fuzz: exit 2).
TEST(Driver, OutOfMemoryStopsTheCampaignAndIsNoPropertyFailure) {
  for (const char* property : {"repeat", "invalid_inputs"}) {
    FuzzOptions o;
    o.seed = 1;
    o.cases = 8;
    o.properties = {property};
    OutOfMemoryBackend backend;
    std::ostringstream log;
    try {
      run_fuzz(backend, o, log);
      ADD_FAILURE() << property << ": the campaign went on\n" << log.str();
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("out of memory in property ") + property + " (case "),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(log.str().find("FAIL"), std::string::npos) << log.str();
  }
}

// seed 1's router_backward catches router_grad_sign at case 1 and shrinks it (14 steps): a repro in `dir`. On
// `backend` where given, else the reference.
PropertyReport caught_router_grad_sign(const std::string& dir, std::ostream& log, double progress_seconds = 5,
                                       Backend* backend = nullptr) {
  FuzzOptions o;
  o.seed = 1;
  o.cases = 20;
  o.properties = {"router_backward"};
  o.fault = ref::Fault::router_grad_sign;
  o.repro_dir = std::filesystem::path(testing::TempDir()) / dir;
  o.progress_seconds = progress_seconds;
  ReferenceBackend reference;
  return run_fuzz(backend ? *backend : reference, o, log).at(0);
}

// Out of memory while a failure shrinks: the failure found is reported (it was lost, the campaign's error saying
// that no property failed).
TEST(Driver, OutOfMemoryWhileShrinkingKeepsTheFailure) {
  OutOfMemoryBackend backend(8);
  std::ostringstream log;
  const PropertyReport r = caught_router_grad_sign("mok_fuzz_oom_shrinking", log, 5, &backend);
  EXPECT_TRUE(backend.threw()) << "no forward ran out of memory while the failure shrank: raise n";
  EXPECT_TRUE(r.failed) << log.str();
  EXPECT_EQ(campaign_exit_status({r}), 1);
}

// Shrinking prints progress too: it can outlast the search (conservation caught combine_order on seed 1
// at case 4, then shrank for 9 s without a line).
TEST(Driver, ProgressWhileAFailureShrinks) {
  std::ostringstream log;
  const PropertyReport r = caught_router_grad_sign("mok_fuzz_progress", log, 0);
  ASSERT_TRUE(r.failed) << log.str();
  EXPECT_NE(log.str().find("shrinking a failure: 1 tries, "), std::string::npos) << log.str();
}

// The repro caught_router_grad_sign writes into `dir`, read back, and its directory; nullopt (a test
// failure, with the campaign's log) where none was written.
struct CaughtRepro {
  golden::GoldenCase golden;
  std::filesystem::path dir;
};
std::optional<CaughtRepro> caught_repro(const std::string& dir) {
  std::ostringstream log;
  const PropertyReport r = caught_router_grad_sign(dir, log);
  if (r.repro.empty()) {
    ADD_FAILURE() << "no repro written: " << log.str();
    return std::nullopt;
  }
  return CaughtRepro{golden::read_golden(r.repro), r.repro.parent_path()};
}

// aux_seed parses as strictly as --seed (stoull took "-1" as 2^64 - 1 and "12x" as 12: another case,
// replayed as if it were the failing one), a property or fault this build does not know is refused, and
// each error names the file escaped (an unknown name's named no file) and the value quoted.
TEST(Repro, ParamsParseStrictlyAndTheirErrorsNameTheFile) {
  const std::optional<CaughtRepro> caught = caught_repro("mok_fuzz_aux_seed");
  ASSERT_TRUE(caught);
  const golden::GoldenCase& g = caught->golden;
  const std::filesystem::path file = caught->dir / "bad\nseed.h5";
  const struct {
    std::string key, bad, message;
  } cases[] = {{"aux_seed", "-1", "aux_seed '-1' is not a number"},
               {"aux_seed", "12x", "aux_seed '12x' is not a number"},
               {"aux_seed", "", "aux_seed '' is not a number"},
               {"property", "no_such\x1b", "unknown property 'no_such\\x1b' (one of: repeat "},
               {"fault", "no_such", "unknown fault 'no_such'"}};
  for (const auto& c : cases) {
    golden::GoldenCase h = g;
    const size_t value = h.description.rfind(c.key + "=") + c.key.size() + 1, end = h.description.find(' ', value);
    h.description.replace(value, end - value, c.bad);  // end = npos: the last word, to the end
    golden::write_golden(file, h);
    try {
      read_repro(file);
      ADD_FAILURE() << c.key << "=" << c.bad << " accepted";
    } catch (const Error& e) {
      // One message: the tool's prefix once, the file, then the lookup's error.
      const std::string what = e.what(), head = "mok-fuzz: " + display_name(file.string()) + ": ";
      EXPECT_EQ(what.rfind(head + c.message, 0), 0u) << what;
      EXPECT_EQ(what.find("mok-fuzz: ", 1), std::string::npos) << what;
    }
  }
}

// The parameters' line is the description's last, each key in it once: a repeated key's first value won
// silently, and the tag was taken wherever it stood.
TEST(Repro, ParamsAreTheLastLineEachKeyOnce) {
  const std::optional<CaughtRepro> caught = caught_repro("mok_fuzz_params_line");
  ASSERT_TRUE(caught);
  const golden::GoldenCase& g = caught->golden;
  const std::filesystem::path file = caught->dir / "edited.h5";
  const auto refusal = [&](const std::string& description) {
    golden::GoldenCase h = g;
    h.description = description;
    golden::write_golden(file, h);
    try {
      read_repro(file);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refusal(g.description + " aux_seed=1").find("its description gives aux_seed= twice"), std::string::npos);
  EXPECT_NE(refusal(g.description + "\nmore").find("no 'mok-fuzz:' line ending its description"), std::string::npos);
  const size_t tag = g.description.rfind("mok-fuzz:");
  EXPECT_NE(refusal(g.description.substr(0, tag) + "x " + g.description.substr(tag))
                .find("no 'mok-fuzz:' line ending its description"),
            std::string::npos);
  EXPECT_EQ(refusal(g.description), "accepted");
}

// A repro whose stored inputs the layer refuses (edited after mok-fuzz wrote it) is the file's error, as
// mok-golden and mok-verify say (exit 2): replayed, most properties reported it as their failure, and a
// routing property passed on an expert id out of range.
TEST(Repro, StoredInputsTheLayerRefusesAreTheFilesError) {
  const std::optional<CaughtRepro> caught = caught_repro("mok_fuzz_stored_inputs");
  ASSERT_TRUE(caught);
  const golden::GoldenCase& g = caught->golden;
  const std::filesystem::path file = caught->dir / "edited_inputs.h5";
  golden::GoldenCase h = g;
  for (golden::Tensor& t : h.inputs)
    if (t.name == "x") t.bytes[0] = 0xc0, t.bytes[1] = 0x7f;  // element 0: bf16 0x7fc0, NaN
  golden::write_golden(file, h);
  try {
    read_repro(file);
    ADD_FAILURE() << "a NaN in the stored x accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(display_name(file.string()) +
                                         ": its stored inputs: invalid input: x [N, H] holds NaN or Inf"),
              std::string::npos)
        << e.what();
  }
}

// The name lookups return the property or fault, or nothing and leave the error to the caller, who says
// where the name came from (read_repro the file: it caught find_property's exception and stripped its
// "mok-fuzz: " prefix); the CLI's throwing forms keep the prefix.
TEST(Lookups, UnknownNamesAreReportedNotThrown) {
  ASSERT_NE(property_named("topk"), nullptr);
  EXPECT_EQ(property_named("topk")->name, "topk");
  EXPECT_EQ(property_named("no_such"), nullptr);
  EXPECT_EQ(property_named(""), nullptr);
  EXPECT_EQ(fault_named("router_grad_sign"), ref::Fault::router_grad_sign);
  EXPECT_EQ(fault_named("none"), ref::Fault::none);
  EXPECT_EQ(fault_named("no_such"), std::nullopt);
  EXPECT_EQ(unknown_fault("no\x1b"), "unknown fault 'no\\x1b'");
  EXPECT_EQ(unknown_property("x").rfind("unknown property 'x' (one of: repeat rank_invariance ", 0), 0u)
      << unknown_property("x");
  try {
    find_property("x");
    ADD_FAILURE() << "find_property took x";
  } catch (const Error& e) {
    EXPECT_EQ(e.what(), "mok-fuzz: " + unknown_property("x"));
  }
  try {
    fault_from_string("x");
    ADD_FAILURE() << "fault_from_string took x";
  } catch (const Error& e) {
    EXPECT_EQ(e.what(), "mok-fuzz: " + unknown_fault("x"));
  }
}

}  // namespace
}  // namespace mok::fuzz
