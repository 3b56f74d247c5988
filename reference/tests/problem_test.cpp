// Problem recipes at their limits (issue 16): problems larger than this machine's memory, Zipf
// exponents a Zipf law cannot hold or so large that the weights underflow, junk routing-kind names.
// Each is a mok::Error naming the problem before anything is allocated, or a problem drawn as asked;
// never a crash. The config checks themselves are core's tests (core/tests/validate_test.cpp).
#include "mok/reference/problem.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <set>
#include <string>

#include "core_test_support.h"
#include "mok/core/validate.h"

namespace mok::ref {
namespace {

using mok::test::error_of;

TEST(Memory, MakeProblemRefusesWhatThisMachineCannotHoldBeforeAllocating) {
  ASSERT_GT(physical_memory_bytes(), 0.0);
  // H = I = 2^20: 6 TiB of weights alone, far past any machine this runs on.
  const LayerConfig c = make_config(1, 1, 1 << 20, 1 << 20, 1, 1);
  const std::string message = error_of([&] { make_problem(c, 1); });
  EXPECT_NE(message.find("mok: invalid input: this problem"), std::string::npos) << message;
  EXPECT_NE(message.find("GiB of host memory here (1.5 times its tensors'"), std::string::npos) << message;
}

// Rng::ahead(n) is the generator after n draws, and bf16_symmetric's parallel fill gives the values one
// stream draws in order, across its chunks' edges, and leaves the generator where that stream ends: so
// make_problem's tensors (goldens, tests, mok-bench's inputs) are one stream's whatever the thread count.
TEST(Rng, AheadAndTheParallelFillAreOneStream) {
  const Rng start(7);
  Rng sequential = start;
  for (int i = 0; i < 1000; ++i) sequential.next();
  Rng ahead = start.ahead(1000);
  EXPECT_EQ(ahead.next(), sequential.next());

  const size_t n = 3 * (size_t(1) << 16) + 5;  // three whole chunks and a part
  sequential = start;
  std::vector<bf16> want(n);
  for (bf16& v : want) v = to_bf16(sequential.symmetric(0.5f));
  Rng filled = start;
  const std::vector<bf16> got = bf16_symmetric(filled, n, 0.5f);
  ASSERT_EQ(got.size(), n);
  size_t differ = 0;
  for (size_t i = 0; i < n; ++i) differ += got[i].bits != want[i].bits;
  EXPECT_EQ(differ, 0u);
  EXPECT_EQ(filled.next(), sequential.next());
}

TEST(Zipf, ExponentMustBeFiniteAndNonNegative) {
  const LayerConfig c = make_config(1, 4, 64, 64, 4, 2);
  for (const double s :
       {std::numeric_limits<double>::quiet_NaN(), -1e308, -1.0, std::numeric_limits<double>::infinity()}) {
    const std::string message = error_of([&] { make_problem(c, 1, RoutingKind::zipf, s); });
    EXPECT_NE(message.find("(need a finite Zipf exponent >= 0)"), std::string::npos) << s << ": " << message;
  }
  EXPECT_EQ(error_of([] { validate_zipf_s(-1e308); }),
            "mok: invalid input: zipf_s = -1e+308 (need a finite Zipf exponent >= 0)");
}

// Every token's k experts: distinct and in range.
void expect_distinct_in_range(const LayerConfig& c, const Routing& r) {
  for (int g = 0; g < c.tokens(); ++g) {
    const auto first = r.topk_idx.begin() + ptrdiff_t(g) * c.top_k;
    const std::set<int32_t> ids(first, first + c.top_k);
    ASSERT_EQ(ids.size(), size_t(c.top_k)) << "token " << g;
    ASSERT_GE(*ids.begin(), 0);
    ASSERT_LT(*ids.rbegin(), c.experts);
  }
}

// With s = 2000 every weight after expert 0's underflows to 0: the draws after the first used to find
// no expert and write taken[-1] (heap corruption). In exact arithmetic the weights left are dominated
// by the lowest expert left, so every token gets experts 0..k-1 in order.
TEST(Zipf, UnderflowingWeightsStillDrawTheLowestExpertsLeft) {
  const LayerConfig c = make_config(2, 4, 64, 64, 4, 2);
  for (const double s : {2000.0, 1e308, std::numeric_limits<double>::max()}) {
    const Problem p = make_problem(c, 1, RoutingKind::zipf, s);
    ASSERT_TRUE(p.routing);
    for (int g = 0; g < c.tokens(); ++g) {
      EXPECT_EQ(p.routing->topk_idx[size_t(g) * 2], 0) << s;
      EXPECT_EQ(p.routing->topk_idx[size_t(g) * 2 + 1], 1) << s;
    }
  }
}

// 256 experts with s = 150, where the weights of experts past 142 underflow: all can be taken, and the
// weights left, redrawn relative to the largest of them, still spread the late draws over several
// experts (neighbours near expert 200 differ by a factor of about e^-0.75), not in index order.
TEST(Zipf, EveryExpertCanBeTakenWhenTheTailUnderflows) {
  LayerConfig c = make_config(1, 2, 64, 64, 256, 256);
  const Problem all = make_problem(c, 3, RoutingKind::zipf, 150.0);
  expect_distinct_in_range(c, *all.routing);
  c.tokens_per_rank = 8;
  c.top_k = 200;
  const Problem most = make_problem(c, 3, RoutingKind::zipf, 150.0);
  expect_distinct_in_range(c, *most.routing);
  std::set<int32_t> last_picks;
  for (int g = 0; g < c.tokens(); ++g) last_picks.insert(most.routing->topk_idx[size_t(g) * c.top_k + c.top_k - 1]);
  EXPECT_GT(last_picks.size(), 1u);
}

TEST(Zipf, ExponentZeroDrawsAsUniform) {
  const LayerConfig c = make_config(2, 64, 64, 64, 8, 3);
  const Problem zipf = make_problem(c, 5, RoutingKind::zipf, 0.0), uniform = make_problem(c, 5, RoutingKind::uniform);
  expect_distinct_in_range(c, *zipf.routing);
  EXPECT_EQ(zipf.routing->topk_idx, uniform.routing->topk_idx);
}

TEST(RoutingKindNames, JunkIsEchoedEscaped) {
  const std::string message = error_of([] { routing_kind_from_string(std::string("zip\x01\xff", 5)); });
  EXPECT_NE(message.find("unknown routing kind 'zip\\x01\\xff'"), std::string::npos) << message;
  EXPECT_EQ(message.find('\x01'), std::string::npos);
}

}  // namespace
}  // namespace mok::ref
