// A forward-only run (a backend that runs a config's forward but not its backward,
// RunResults::gradients_skipped, as the gpu backend did with the fp8 mode before the megakernel ran its
// backward) against real goldens: its routing and y compared bit for bit, its backward reported as
// skipped with the reason, in text and JSON; a differing forward tensor, a missing forward tensor and a
// tensor missing without a declared reason each still fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "mok/golden/catalogue.h"
#include "mok/golden/golden.h"
#include "mok/reference/layer.h"
#include "mok/verify/compare.h"
#include "mok/verify/report.h"

namespace mok::verify {
namespace {

using golden::GoldenCase;
using golden::LayerResults;
using golden::Tensor;

const std::string kReason = "precision = fp8: this backend runs the fp8 mode's forward only";

// The forward a forward-only backend returns, computed here by the CPU reference on the golden's inputs
// (a run of its own, not the golden's stored bits; the GPU's forward equals it bit for bit).
LayerResults forward_run(const GoldenCase& g) {
  const ref::Problem p = golden::problem_of(g);
  return golden::forward_results_of(
      p, ref::forward(p.config, p.x, p.weights, p.routing ? &*p.routing : nullptr, g.options));
}

std::vector<std::string> names(const std::vector<Tensor>& tensors) {
  std::vector<std::string> n;
  for (const Tensor& t : tensors) n.push_back(t.name);
  return n;
}

// The golden's gradient tensors: its outputs group but y.
std::vector<std::string> gradient_names(const GoldenCase& g) {
  std::vector<std::string> n = names(g.results.outputs);
  std::erase(n, "y");
  return n;
}

std::string joined(const std::vector<std::string>& items, const std::string& quote) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + quote + items[i] + quote;
  return s;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Drops the tensor of that name from either group.
LayerResults without(LayerResults r, const std::string& name) {
  for (std::vector<Tensor>* group : {&r.routing, &r.outputs})
    std::erase_if(*group, [&](const Tensor& t) { return t.name == name; });
  return r;
}

// Flips the lowest bit of the element two thirds into the tensor of that name.
LayerResults flipped(LayerResults r, const std::string& name) {
  for (std::vector<Tensor>* group : {&r.routing, &r.outputs})
    for (Tensor& t : *group)
      if (t.name == name) t.bytes[size_t(t.elements() * 2 / 3) * golden::element_size(t.dtype)] ^= 1;
  return r;
}

CaseReport run_report(const GoldenCase& g, const LayerResults& run, const std::optional<std::string>& reason) {
  CaseReport r = compare_run(g, run, reason);
  r.golden_file = g.name + ".h5";
  r.golden_name = g.name;
  r.candidate = "forward-only test";
  return r;
}

class ForwardOnly : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    for (const char* name : {"fp8_smoke", "fp8_zipf", "fp8_shared"})
      goldens_.push_back(golden::make_case(*golden::find_case(name)));
  }
  static void TearDownTestSuite() { goldens_.clear(); }

  const GoldenCase& golden() const {
    for (const GoldenCase& g : goldens_)
      if (g.name == GetParam()) return g;
    throw Error("no golden " + GetParam());
  }

  static std::vector<GoldenCase> goldens_;
};

std::vector<GoldenCase> ForwardOnly::goldens_;

TEST_P(ForwardOnly, AnEqualForwardPassesAndTheBackwardIsReportedSkipped) {
  const GoldenCase& g = golden();
  ASSERT_EQ(g.config.precision, Precision::fp8);
  const LayerResults run = forward_run(g);
  EXPECT_EQ(names(run.routing), names(g.results.routing));
  EXPECT_EQ(names(run.outputs), std::vector<std::string>{"y"});

  const CaseReport r = run_report(g, run, kReason);
  EXPECT_TRUE(r.equal());
  EXPECT_EQ(r.tensors.size(), g.results.routing.size() + 1);
  for (const TensorReport& t : r.tensors) EXPECT_TRUE(t.bitwise_equal()) << t.name;
  EXPECT_EQ(r.backward_skipped, kReason);
  EXPECT_EQ(r.skipped_tensors, gradient_names(g));
  for (const std::string& name : r.skipped_tensors) EXPECT_TRUE(is_gradient(name)) << name;
  EXPECT_GE(r.skipped_tensors.size(), 4u);  // dx, d_topk_w, d_w1, d_w2 at least

  const std::string text = format_text(r);
  EXPECT_TRUE(contains(text, "\n  backward skipped: " + kReason + "\n")) << text;
  EXPECT_TRUE(contains(text, "\n  not compared: " + joined(r.skipped_tensors, "") + "\n")) << text;
  EXPECT_TRUE(contains(text, "EQUAL    " + g.name + ": all " + std::to_string(r.tensors.size()) +
                                 " tensors bitwise equal (forward only: backward skipped, " +
                                 std::to_string(r.skipped_tensors.size()) + " gradient tensors not compared)\n"))
      << text;
  EXPECT_TRUE(contains(text, "  outputs/y ")) << text;
  EXPECT_FALSE(contains(text, "outputs/dx")) << text;
  EXPECT_FALSE(contains(text, "ABSENT")) << text;

  const std::string json = format_json({r}, {});
  EXPECT_TRUE(contains(json, "\"all_equal\": true")) << json;
  EXPECT_TRUE(contains(json, "\"equal\": true, \"differing_tensors\": 0, \"backward_skipped\": \"" + kReason +
                                 "\", \"skipped_tensors\": [" + joined(r.skipped_tensors, "\"") + "]"))
      << json;
  EXPECT_TRUE(contains(json, "{\"name\": \"y\", \"group\": \"outputs\"")) << json;
  EXPECT_FALSE(contains(json, "{\"name\": \"dx\"")) << json;
}

TEST_P(ForwardOnly, ADifferingForwardTensorFails) {
  const GoldenCase& g = golden();
  const LayerResults run = forward_run(g);
  std::vector<std::string> forward = names(run.routing);
  forward.push_back("y");
  for (const std::string& target : forward) {
    SCOPED_TRACE(target);
    const CaseReport r = run_report(g, flipped(run, target), kReason);
    EXPECT_FALSE(r.equal());
    EXPECT_EQ(r.differing_tensors(), 1);
    for (const TensorReport& t : r.tensors) EXPECT_EQ(t.bitwise_equal(), t.name != target) << t.name;
    EXPECT_EQ(r.skipped_tensors, gradient_names(g));  // still not compared, still said
    const std::string text = format_text(r);
    EXPECT_TRUE(contains(text, target + ": first mismatch ")) << text;
    EXPECT_TRUE(contains(text, "MISMATCH " + g.name + ": 1 of " + std::to_string(r.tensors.size()) +
                                   " tensors differ (forward only: backward skipped"))
        << text;
    const std::string json = format_json({r}, {});
    EXPECT_TRUE(contains(json, "\"all_equal\": false")) << json;
    EXPECT_TRUE(contains(json, "\"equal\": false, \"differing_tensors\": 1, \"backward_skipped\": \"")) << json;
  }
}

TEST_P(ForwardOnly, AMissingTensorWithoutADeclaredReasonFails) {
  const GoldenCase& g = golden();
  const CaseReport r = run_report(g, forward_run(g), std::nullopt);
  const std::vector<std::string> gradients = gradient_names(g);
  EXPECT_FALSE(r.equal());
  EXPECT_EQ(r.differing_tensors(), int(gradients.size()));
  EXPECT_EQ(r.tensors.size(), g.results.routing.size() + g.results.outputs.size());
  EXPECT_TRUE(r.backward_skipped.empty());
  EXPECT_TRUE(r.skipped_tensors.empty());
  for (const TensorReport& t : r.tensors) {
    const bool gradient = std::find(gradients.begin(), gradients.end(), t.name) != gradients.end();
    EXPECT_EQ(t.bitwise_equal(), !gradient) << t.name;
    if (gradient) {
      EXPECT_EQ(t.absent, "the candidate has no tensor " + t.name);
    }
  }
  const std::string text = format_text(r);
  EXPECT_TRUE(contains(text, "ABSENT: the candidate has no tensor dx")) << text;
  EXPECT_TRUE(contains(text, "MISMATCH " + g.name + ": " + std::to_string(gradients.size()) + " of " +
                                 std::to_string(r.tensors.size()) + " tensors differ\n"))
      << text;
  EXPECT_FALSE(contains(text, "backward skipped")) << text;
  const std::string json = format_json({r}, {});
  EXPECT_TRUE(contains(json, "\"all_equal\": false")) << json;
  EXPECT_TRUE(contains(json, "\"backward_skipped\": null, \"skipped_tensors\": []")) << json;
}

// The reason covers the gradients only: a forward tensor missing from a forward-only run is absent.
TEST_P(ForwardOnly, AMissingForwardTensorFailsWhateverTheReason) {
  const GoldenCase& g = golden();
  for (const std::string& target : {std::string("y"), std::string("topk_w"), std::string("slot_row")}) {
    SCOPED_TRACE(target);
    const CaseReport r = run_report(g, without(forward_run(g), target), kReason);
    EXPECT_FALSE(r.equal());
    EXPECT_EQ(r.differing_tensors(), 1);
    EXPECT_EQ(r.skipped_tensors, gradient_names(g));
    const auto t =
        std::find_if(r.tensors.begin(), r.tensors.end(), [&](const TensorReport& x) { return x.name == target; });
    ASSERT_NE(t, r.tensors.end());
    EXPECT_EQ(t->absent, "the candidate has no tensor " + target);
    EXPECT_TRUE(contains(format_text(r), "ABSENT: the candidate has no tensor " + target)) << format_text(r);
  }
}

// A gradient the run does hold is compared, reason or not: the reason skips only what is absent.
TEST_P(ForwardOnly, AGradientTheRunHoldsIsCompared) {
  const GoldenCase& g = golden();
  CaseReport r = run_report(g, flipped(g.results, "d_w1"), kReason);
  EXPECT_FALSE(r.equal());
  EXPECT_EQ(r.differing_tensors(), 1);
  EXPECT_TRUE(r.skipped_tensors.empty());
  EXPECT_TRUE(r.backward_skipped.empty());  // nothing was skipped
  r = run_report(g, without(g.results, "d_w1"), kReason);
  EXPECT_TRUE(r.equal());
  EXPECT_EQ(r.skipped_tensors, std::vector<std::string>{"d_w1"});
  EXPECT_EQ(r.backward_skipped, kReason);
}

// A whole run compares as compare_tensors does, and its JSON case says no backward was skipped.
TEST_P(ForwardOnly, AWholeRunIsComparedAsEver) {
  const GoldenCase& g = golden();
  const CaseReport r = run_report(g, g.results, std::nullopt);
  EXPECT_TRUE(r.equal());
  std::vector<Tensor> all = g.results.routing;
  all.insert(all.end(), g.results.outputs.begin(), g.results.outputs.end());
  EXPECT_EQ(r.tensors.size(), compare_tensors(g, all, false).size());
  EXPECT_EQ(r.tensors.size(), all.size());
  EXPECT_TRUE(r.skipped_tensors.empty());
  EXPECT_TRUE(contains(format_text(r),
                       "EQUAL    " + g.name + ": all " + std::to_string(all.size()) + " tensors bitwise equal\n"))
      << format_text(r);
  EXPECT_TRUE(contains(format_json({r}, {}), "\"backward_skipped\": null, \"skipped_tensors\": []"));
}

INSTANTIATE_TEST_SUITE_P(Fp8Goldens, ForwardOnly, ::testing::Values("fp8_smoke", "fp8_zipf", "fp8_shared"));

TEST(IsGradient, TheBackwardsTensorsOnly) {
  for (const char* name : {"dx", "d_topk_w", "d_logits", "d_router", "d_w1", "d_w2", "d_shared_w1", "d_shared_w2"})
    EXPECT_TRUE(is_gradient(name)) << name;
  for (const char* name : {"y", "topk_idx", "topk_w", "logits", "counts", "offsets", "row_source", "slot_row", "x",
                           "dy", "w1", "d_w3", ""})
    EXPECT_FALSE(is_gradient(name)) << name;
}

}  // namespace
}  // namespace mok::verify
