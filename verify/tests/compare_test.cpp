// The comparison engine: ULP arithmetic, and a one-bit flip in any tensor of a copied golden found
// and located in layer terms.
#include "mok/verify/compare.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "mok/core/bf16.h"
#include "mok/golden/catalogue.h"
#include "mok/golden/locate.h"
#include "mok/verify/report.h"
#include "test_files.h"

namespace mok::verify {
namespace {

using golden::DType;
using golden::GoldenCase;
using golden::Tensor;

TEST(UlpDistance, Float32) {
  const auto d = [](float a, float b) { return ulp_distance(DType::f32, bits_of(a), bits_of(b)); };
  EXPECT_EQ(d(1.0f, 1.0f), 0u);
  EXPECT_EQ(d(1.0f, std::nextafter(1.0f, 2.0f)), 1u);
  EXPECT_EQ(d(std::nextafter(1.0f, 0.0f), std::nextafter(1.0f, 2.0f)), 2u);
  EXPECT_EQ(d(0.0f, -0.0f), 0u);
  EXPECT_EQ(d(float_of(1), float_of(0x80000001u)), 2u);            // the smallest subnormals either side of zero
  EXPECT_EQ(d(float_of(0x7f7fffffu), float_of(0x7f800000u)), 1u);  // max float to +Inf
  EXPECT_FALSE(d(float_of(0x7fc00000u), 1.0f));
  EXPECT_EQ(ulp_distance(DType::f32, 0x7fc00000u, 0x7fc00000u), 0u);
}

TEST(UlpDistance, Bf16) {
  EXPECT_EQ(ulp_distance(DType::bf16, 0x3f80, 0x3f81), 1u);
  EXPECT_EQ(ulp_distance(DType::bf16, 0x3f80, 0x3f7f), 1u);
  EXPECT_EQ(ulp_distance(DType::bf16, 0x0001, 0x8001), 2u);
  EXPECT_EQ(ulp_distance(DType::bf16, 0x8000, 0x0000), 0u);
  EXPECT_FALSE(ulp_distance(DType::bf16, 0x7fc0, 0x3f80));
}

TEST(UlpBuckets, Labels) {
  EXPECT_EQ(ulp_bucket_label(0), "0");
  EXPECT_EQ(ulp_bucket_label(1), "1");
  EXPECT_EQ(ulp_bucket_label(2), "2-3");
  EXPECT_EQ(ulp_bucket_label(3), "4-7");
  EXPECT_EQ(ulp_bucket_label(32), "2147483648-4294967295");
  EXPECT_EQ(ulp_bucket_label(kNanBucket), "nan");
}

std::vector<Tensor> all_tensors(const GoldenCase& g) {
  std::vector<Tensor> t = g.inputs;
  t.insert(t.end(), g.results.routing.begin(), g.results.routing.end());
  t.insert(t.end(), g.results.outputs.begin(), g.results.outputs.end());
  return t;
}

// The words the location of an element of each tensor must contain.
std::vector<std::string> location_words(const std::string& name) {
  for (const auto& [names, words] : std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>>{
           {{"x", "dy", "y", "dx"}, {"rank ", "token ", "(global ", "column "}},
           {{"router", "d_router"}, {"expert ", "column "}},
           {{"expert_bias", "counts"}, {"expert "}},
           {{"offsets"}, {"layout"}},
           {{"w1", "d_w1"}, {"expert ", " row ", "column "}},
           {{"w2", "d_w2"}, {"expert ", "row ", "column "}},
           {{"shared_w1", "d_shared_w1", "shared_w2", "d_shared_w2"}, {"shared expert", "row ", "column "}},
           {{"topk_idx", "topk_w", "d_topk_w", "given_topk_idx", "given_topk_w", "slot_row"},
            {"rank ", "token ", "slot ", "expert "}},
           {{"logits", "d_logits"}, {"rank ", "token ", "expert "}},
           {{"row_source"}, {"layout row ", "expert ", "serving rank "}}})
    if (std::find(names.begin(), names.end(), name) != names.end()) return words;
  return {"no words known for " + name};
}

class BitFlip : public ::testing::TestWithParam<std::string> {};

// For every tensor of the case: copy the golden file with one bit of one element flipped (a valid
// file), read both back, compare: exactly that tensor differs, at that element, located.
TEST_P(BitFlip, EveryTensorOfACopiedGoldenIsFoundAndLocated) {
  const GoldenCase golden = golden::make_case(*golden::find_case(GetParam()));
  golden::testing::TempDir dir("verify-bitflip-" + GetParam());
  golden::write_golden(dir / "golden.h5", golden);
  const GoldenCase original = golden::read_golden(dir / "golden.h5");
  const std::vector<Tensor> tensors = all_tensors(original);
  for (const Tensor& target : tensors) {
    SCOPED_TRACE(target.name);
    GoldenCase copy = original;
    const int64_t element = target.elements() * 2 / 3;
    for (std::vector<Tensor>* group : {&copy.inputs, &copy.results.routing, &copy.results.outputs})
      for (Tensor& t : *group)
        if (t.name == target.name) t.bytes[size_t(element) * golden::element_size(t.dtype)] ^= 1;  // lowest bit
    golden::write_golden(dir / "candidate.h5", copy);
    const std::vector<TensorReport> reports =
        compare_tensors(original, all_tensors(golden::read_golden(dir / "candidate.h5")), true);
    ASSERT_EQ(reports.size(), tensors.size());
    for (const TensorReport& r : reports) {
      if (r.name != target.name) {
        EXPECT_TRUE(r.bitwise_equal()) << r.name;
        continue;
      }
      EXPECT_FALSE(r.bitwise_equal());
      EXPECT_EQ(r.equal, r.elements - 1);
      ASSERT_TRUE(r.first_mismatch);
      EXPECT_EQ(r.first_mismatch->index, element);
      EXPECT_EQ(r.first_mismatch->golden_bits ^ r.first_mismatch->candidate_bits, 1u);
      EXPECT_EQ(r.first_mismatch->element, golden::element_name(target, element));
      for (const std::string& word : location_words(target.name))
        EXPECT_NE(r.first_mismatch->location.find(word), std::string::npos)
            << "'" << r.first_mismatch->location << "' lacks '" << word << "'";
      if (r.dtype != DType::i32) {
        EXPECT_EQ(r.max_ulp, 1u);
        EXPECT_EQ(r.ulp_histogram[1], 1);
      } else {
        EXPECT_EQ(r.max_abs, 1.0);
      }
    }
  }
}

// smoke: router, shared expert, softmax. sigmoid_grouped: expert_bias. zipf: a given routing.
INSTANTIATE_TEST_SUITE_P(Cases, BitFlip, ::testing::Values("smoke", "sigmoid_grouped", "zipf"));

TEST(Compare, LocationsInLayerTerms) {
  const GoldenCase g = golden::make_case(*golden::find_case("smoke"));  // R=2, T=16, E=4, k=2, H=I=64
  EXPECT_EQ(golden::locate(g, "y", 17 * 64 + 5), "rank 1, token 1 (global 17), column 5");
  EXPECT_EQ(golden::locate(g, "d_w1", (3 * 128 + 70) * 64 + 9), "expert 3 (rank 1), up row 6, column 9");
  EXPECT_EQ(golden::locate(g, "shared_w1", 2 * 64 + 1), "shared expert, gate row 2, column 1");
  const int32_t expert = golden::i32_values(g.tensor("topk_idx"))[2 * 5 + 1];
  EXPECT_EQ(golden::locate(g, "topk_w", 2 * 5 + 1), "rank 0, token 5 (global 5), slot 1, expert " +
                                                        std::to_string(expert) + " (rank " +
                                                        std::to_string(expert / 2) + ")");
  EXPECT_EQ(golden::locate(g, "offsets", 4), "end of the layout (offsets[E])");
}

TEST(Compare, UlpHistogramAndErrors) {
  const GoldenCase g = golden::make_case(*golden::find_case("single_token"));
  Tensor y = g.tensor("y");
  const auto value = [](uint32_t bits) { return double(to_float(bf16{uint16_t(bits)})); };
  double max_abs = 0, max_rel = 0, diff_squares = 0, squares = 0;
  for (int64_t i = 0; i < y.elements(); ++i) squares += value(y.bits(i)) * value(y.bits(i));
  const auto shift = [&](int64_t i, int ulps) {
    const uint16_t bits = uint16_t(y.bits(i));
    const uint16_t moved = uint16_t(bits & 0x8000 ? bits - ulps : bits + ulps);  // away from zero
    std::memcpy(y.bytes.data() + 2 * i, &moved, 2);
    const double diff = std::fabs(value(moved) - value(bits));
    max_abs = std::max(max_abs, diff);
    max_rel = std::max(max_rel, diff / std::fabs(value(bits)));
    diff_squares += diff * diff;
  };
  shift(3, 1);
  shift(4, 1);
  shift(9, 1);
  shift(40, 5);
  const TensorReport r = compare_tensor(g, golden::Group::outputs, g.tensor("y"), &y);
  EXPECT_EQ(r.equal, r.elements - 4);
  EXPECT_EQ(r.max_ulp, 5u);
  EXPECT_EQ(r.ulp_histogram[0], r.elements - 4);
  EXPECT_EQ(r.ulp_histogram[1], 3);
  EXPECT_EQ(r.ulp_histogram[3], 1);
  EXPECT_EQ(r.first_mismatch->index, 3);
  ASSERT_GT(max_abs, 0.0);
  EXPECT_DOUBLE_EQ(r.max_abs, max_abs);
  EXPECT_DOUBLE_EQ(r.max_rel, max_rel);
  EXPECT_DOUBLE_EQ(r.norm_rel, std::sqrt(diff_squares / squares));
  ASSERT_TRUE(r.oracle);
  EXPECT_TRUE(r.within_oracle_bound().value());
}

TEST(Compare, AbsentAndMisshapenTensors) {
  const GoldenCase g = golden::make_case(*golden::find_case("single_token"));
  EXPECT_FALSE(compare_tensor(g, golden::Group::outputs, g.tensor("y"), nullptr).bitwise_equal());
  Tensor wrong = g.tensor("y");
  wrong.shape = {wrong.shape[1], wrong.shape[0]};
  const TensorReport r = compare_tensor(g, golden::Group::outputs, g.tensor("y"), &wrong);
  EXPECT_FALSE(r.bitwise_equal());
  EXPECT_NE(r.absent.find("another shape"), std::string::npos);
}

// The JSON report is valid UTF-8 whatever bytes a path holds: a byte outside UTF-8 becomes its \u escape,
// valid UTF-8 stays as it is; a report that compared nothing is not all equal.
TEST(JsonReport, EscapesBytesThatAreNotUtf8) {
  const std::string json = format_json({}, {"no file /tmp/a\xff\xfe/caf\xc3\xa9.h5 \xe2\x82"}, {});
  EXPECT_NE(json.find("no file /tmp/a\\u00ff\\u00fe/caf\xc3\xa9.h5 \\u00e2\\u0082"), std::string::npos) << json;
  EXPECT_NE(json.find("\"all_equal\": false"), std::string::npos) << json;
}

// Strings are escaped per RFC 8259: quote and backslash as \" and \\, every control character as
// \u00XX, so that no name or message can end a string early or break a line of the report.
TEST(JsonReport, EscapesQuotesBackslashesAndControlCharacters) {
  CaseReport c;
  c.golden_file = std::string("a\"b\\c\n\t\r\x01\x1f\0 d.h5", 16);
  c.golden_name = "smoke";
  const std::string json = format_json({c}, {"mok: \"x\"\n"}, {"y\\z\x7f"});
  EXPECT_NE(json.find("\"golden\": \"a\\\"b\\\\c\\u000a\\u0009\\u000d\\u0001\\u001f\\u0000 d.h5\""), std::string::npos)
      << json;
  EXPECT_NE(json.find("\"errors\": [\"mok: \\\"x\\\"\\u000a\"]"), std::string::npos) << json;
  EXPECT_NE(json.find("\"skipped\": [\"y\\\\z\x7f\"]"), std::string::npos) << json;  // DEL needs no escape
}

}  // namespace
}  // namespace mok::verify
