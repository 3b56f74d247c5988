// Configs and problem recipes at their limits (issue 16): sizes whose products pass int32 or this
// machine's memory, values a float32 or a Zipf law cannot hold, and Zipf exponents so large that the
// weights underflow. Each is a mok::Error naming the problem before anything is allocated, or a
// problem drawn as asked; never a crash.
#include "mok/reference/problem.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <set>
#include <string>

#include "mok/core/validate.h"

namespace mok::ref {
namespace {

// The message of the mok::Error that `call` throws ("" if none).
template <class Call>
std::string error_of(Call call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string validate_error(const LayerConfig& c) {
  return error_of([&] { validate(c); });
}

TEST(Validate, TokensPastInt32AreRefusedBeforeTokensOverflows) {
  LayerConfig c = make_config(2, 1 << 30, 64, 64, 2, 1);
  EXPECT_EQ(validate_error(c),
            "mok: invalid input: tokens N = R * T = 2147483648 is more than 2^31 - 1: too large for mok's 32-bit "
            "indices");
  c = make_config(1, 1 << 29, 64, 64, 8, 8);  // N fits, N * k does not
  EXPECT_NE(validate_error(c).find("routed rows N * k = 4294967296 is more than 2^31 - 1"), std::string::npos);
  c = make_config(1, 1 << 23, 64, 64, 512, 1);  // N * E: the logits
  EXPECT_NE(validate_error(c).find("logits N * E = 4294967296"), std::string::npos);
}

TEST(Validate, WidthsPastInt32AreRefused) {
  const int big = 1 << 30;
  EXPECT_NE(validate_error(make_config(1, 1, 64, big, 1, 1)).find("W1 rows per expert 2 * I = 2147483648"),
            std::string::npos);
  LayerConfig c = make_config(1, 1, 64, 64, 1, 1);
  c.shared_intermediate = big;
  EXPECT_NE(validate_error(c).find("shared W1 rows 2 * Is = 2147483648"), std::string::npos);
  EXPECT_NE(validate_error(make_config(1, 1, 1 << 24, 64, 512, 1)).find("router elements E * H = 8589934592"),
            std::string::npos);
  EXPECT_NE(validate_error(make_config(1, 1, big, big, 1, 1)), "");
}

TEST(Validate, RoutedScaleIsCheckedInEveryMode) {
  for (const ScoreMode mode : {ScoreMode::softmax, ScoreMode::sigmoid})
    for (const float scale :
         {std::numeric_limits<float>::quiet_NaN(), -3.0f, 0.0f, std::numeric_limits<float>::infinity()}) {
      LayerConfig c = make_config(1, 4, 64, 64, 4, 2);
      c.score_mode = mode;
      c.routed_scale = scale;
      EXPECT_EQ(validate_error(c), "mok: invalid input: routed_scale must be positive and finite") << scale;
    }
}

TEST(Validate, SwigluLimitIsZeroOrANormalFloat) {
  LayerConfig c = make_config(1, 4, 64, 64, 4, 2);
  for (const float limit : {std::numeric_limits<float>::denorm_min(), 1e-40f, -1.0f,
                            std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    c.swiglu_limit = limit;
    EXPECT_NE(validate_error(c).find("swiglu_limit must be 0 (off) or a positive, finite, normal float32"),
              std::string::npos)
        << limit;
  }
  for (const float limit : {0.0f, std::numeric_limits<float>::min(), 0.75f}) {
    c.swiglu_limit = limit;
    EXPECT_EQ(validate_error(c), "") << limit;
  }
}

TEST(Memory, AProblemLargerThanTheLimitIsRefusedWithItsSize) {
  const LayerConfig c = make_config(1, 1, 1 << 14, 1 << 14, 16, 1);  // 16 experts of 2^28 weights each
  EXPECT_EQ(validate_error(c), "");
  // 12 Gi weights: 24 GiB in bf16 and 48 GiB of fp32 gradients, plus a few MiB of tokens and router.
  EXPECT_NEAR(problem_bytes(c) / double(1ull << 30), 72.0, 0.01);
  EXPECT_EQ(error_of([&] { require_fits_in_memory(c, double(1ull << 30)); }),
            "mok: invalid input: this problem (R = 1, T = 1, E = 16, H = 16384, I = 16384) needs 72.0 GiB of host "
            "memory for its tensors, more than the 1.0 GiB this machine has");
  EXPECT_EQ(error_of([&] { require_fits_in_memory(c, double(1ull << 40)); }), "");
}

TEST(Memory, MakeProblemRefusesWhatThisMachineCannotHoldBeforeAllocating) {
  ASSERT_GT(physical_memory_bytes(), 0.0);
  // H = I = 2^20: 6 TiB of weights alone, far past any machine this runs on.
  const LayerConfig c = make_config(1, 1, 1 << 20, 1 << 20, 1, 1);
  const std::string message = error_of([&] { make_problem(c, 1); });
  EXPECT_NE(message.find("mok: invalid input: this problem"), std::string::npos) << message;
  EXPECT_NE(message.find("GiB of host memory for its tensors, more than the"), std::string::npos) << message;
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

TEST(ErrorText, InputIsQuotedAndEscapedInternalFaultsAreNoInputErrors) {
  EXPECT_EQ(quote_input(std::string("a\tb\0c\x7f\x80", 7)), "'a\\x09b\\x00c\\x7f\\x80'");
  EXPECT_EQ(escape_bytes("one\ntwo\r", true), "one\ntwo\\x0d");
  try {
    fail_internal("a broken invariant");
    FAIL();
  } catch (const Error&) {
    FAIL() << "an internal fault is no invalid input";
  } catch (const InternalError& e) {
    EXPECT_STREQ(e.what(), "mok: internal error: a broken invariant");
  }
}

}  // namespace
}  // namespace mok::ref
