// Configs at their limits (issue 16): sizes whose products pass int32 or this machine's memory, values
// a float32 cannot hold; each is a mok::Error naming the problem before anything is allocated. And the
// error texts: input quoted and escaped, internal faults no input errors.
#include "mok/core/validate.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "core_test_support.h"
#include "mok/core/saved_layout.h"

namespace mok::test {
namespace {

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
  EXPECT_NE(validate_error(make_config(1, 1, big, big, 1, 1)).find("2 * I = 2147483648"), std::string::npos);
}

TEST(Validate, Fp8NeedsWholeScaleBlocks) {
  LayerConfig c = make_config(1, 4, 128, 256, 4, 2);
  c.precision = Precision::fp8;
  EXPECT_EQ(validate_error(c), "");
  c.shared_intermediate = 128;
  EXPECT_EQ(validate_error(c), "");
  c.hidden = 192;
  EXPECT_EQ(validate_error(c),
            "mok: invalid input: hidden H = 192 is not a multiple of 128, the fp8 mode's block size");
  c.hidden = 128;
  c.intermediate = 64;
  EXPECT_NE(validate_error(c).find("intermediate I = 64 is not a multiple of 128"), std::string::npos);
  c.intermediate = 128;
  c.shared_intermediate = 320;
  EXPECT_NE(validate_error(c).find("shared_intermediate = 320 is not a multiple of 128"), std::string::npos);
  c.precision = Precision::bf16;
  EXPECT_EQ(validate_error(c), "") << "bf16 takes multiples of 64";
  c.precision = Precision(2);
  EXPECT_NE(validate_error(c).find("precision = 2 (need 0 = bf16 or 1 = fp8)"), std::string::npos);
}

TEST(Validate, RefusesAnUnknownScoreMode) {
  LayerConfig c = make_config(1, 4, 64, 64, 4, 2);
  c.score_mode = ScoreMode(2);  // would route as softmax unnoticed
  EXPECT_NE(validate_error(c).find("score_mode = 2 (need 0 = softmax or 1 = sigmoid)"), std::string::npos);
}

// The layout's chunks of 32 tokens up to the largest N validate allows (2^31 - 1), with no sum past int.
TEST(Validate, LayoutChunksCountTheLargestBatch) {
  EXPECT_EQ(layout_chunks(1), 1);
  EXPECT_EQ(layout_chunks(32), 1);
  EXPECT_EQ(layout_chunks(33), 2);
  EXPECT_EQ(layout_chunks(std::numeric_limits<int>::max()), 1 << 26);
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
  EXPECT_EQ(error_of([&] { require_fits_in_memory(c, 1, double(1ull << 30)); }),
            "mok: invalid input: this problem (R = 1, T = 1, E = 16, H = 16384, I = 16384) needs 72.0 GiB of host "
            "memory here (1 times its tensors' 72.0 GiB), more than the 1.0 GiB this process may take (the machine's "
            "memory, or its cgroup's limit)");
  EXPECT_EQ(error_of([&] { require_fits_in_memory(c, 1, double(1ull << 40)); }), "");
}

// A caller that holds several copies of the tensors at once (mok-golden generate: up to 4.7) is refused where
// the tensors alone would fit.
TEST(Memory, TheCallersCopiesCount) {
  const LayerConfig c = make_config(1, 1, 1 << 14, 1 << 14, 16, 1);  // 72 GiB of tensors
  EXPECT_EQ(error_of([&] { require_fits_in_memory(c, 1, double(100ull << 30)); }), "");
  EXPECT_EQ(error_of([&] { require_fits_in_memory(c, 5, double(100ull << 30)); }),
            "mok: invalid input: this problem (R = 1, T = 1, E = 16, H = 16384, I = 16384) needs 360.0 GiB of host "
            "memory here (5 times its tensors' 72.0 GiB), more than the 100.0 GiB this process may take (the "
            "machine's memory, or its cgroup's limit)");
  EXPECT_EQ(error_of([&] { require_fits_in_memory(c, 1.35, double(100ull << 30)); }), "");
}

// A cgroup's memory limit (a container's, a batch job's) bounds what a problem may take: the smallest along the
// group's path up to the mount's root, v2's memory.max ("max": none) and v1's memory controller alike.
TEST(Memory, TheCgroupsSmallestLimitIsFound) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("mok_cgroup_test_" + std::to_string(getpid()));
  const auto write = [&](const fs::path& file, const std::string& text) {
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text << "\n";
  };
  write(root / "job/step/memory.max", "max");
  write(root / "job/memory.max", "3000000000");
  write(root / "memory/batch/memory.limit_in_bytes", "2000000000");
  write(root / "memory/memory.limit_in_bytes", "9223372036854771712");
  EXPECT_EQ(cgroup_memory_limit_bytes("0::/job/step\n", root.string()), 3e9);
  EXPECT_EQ(cgroup_memory_limit_bytes("4:memory:/batch\n1:cpu,cpuacct:/x\n", root.string()), 2e9);
  EXPECT_EQ(cgroup_memory_limit_bytes("4:cpu,memory:/batch\n0::/job/step\n", root.string()), 2e9);
  EXPECT_EQ(cgroup_memory_limit_bytes("3:cpu:/job\n0::/elsewhere\n", root.string()), 0.0);  // none set
  EXPECT_EQ(cgroup_memory_limit_bytes("no colon\n", root.string()), 0.0);
  fs::remove_all(root);
  EXPECT_GT(memory_limit_bytes(), 0.0);
  EXPECT_LE(memory_limit_bytes(), physical_memory_bytes());
}

// The widest config within the int32 limits (I = Is = 2^30 - 64 on 2^31 - 1 tokens) needs 2.3e19 bytes
// of saved activations, past size_t: saved_layout gave them wrapped. Refused past 1 PiB of tensors, the
// sizes of what is accepted are exact: halving T from that config until validate accepts it, the saved
// buffer's bytes are its sections' sum, each in whole 256-byte blocks, taken in double (no wrap; exact below
// 2^53), below 2^63 (torch's int64 sizes).
TEST(Validate, AProblemPastOnePebibyteIsRefusedBeforeItsSizesWrap) {
  LayerConfig c = make_config(1, std::numeric_limits<int32_t>::max(), 448, (1 << 30) - 64, 1, 1);
  c.shared_intermediate = c.intermediate;
  EXPECT_EQ(validate_error(c),
            "mok: invalid input: problem too large: its tensors need 1.84e+19 bytes, more than 2^50 (1 PiB; mok "
            "sizes its buffers in 64 bits)");
  while (c.tokens_per_rank > 1 && !validate_error(c).empty()) c.tokens_per_rank /= 2;
  ASSERT_EQ(validate_error(c), "");
  EXPECT_LE(problem_bytes(c), kMaxProblemBytes);
  EXPECT_GT(problem_bytes(c), kMaxProblemBytes / 2) << "the largest T accepted, to a factor 2";
  const double N = c.tokens(), P = own_padded_rows(c, 1, 0), H = c.hidden, I = c.intermediate,
               Is = c.shared_intermediate;
  const auto section = [](double bytes) { return std::ceil(bytes / 256) * 256; };
  // offsets and tile_offsets, row_source and slot_row, xe, h, the shared expert's h and a (S = N rows)
  const double sections = 2 * section(4 * (c.experts + 1)) + 2 * section(4 * N * c.top_k) + section(P * H * 2) +
                          section(P * 2 * I * 2) + section(N * 2 * Is * 2) + section(N * Is * 2);
  ASSERT_LT(sections, 0x1p53);
  const double saved = double(saved_layout(c).bytes);
  EXPECT_EQ(saved, sections);
  EXPECT_LT(saved, 0x1p63);
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

// A quote or backslash in quoted input is escaped: the quoted text ends where it seems to.
TEST(ErrorText, QuotesAndBackslashesInQuotedInputAreEscaped) {
  EXPECT_EQ(quote_input("it's a\\x0a"), "'it\\'s a\\\\x0a'");
}

// A long input is cut, the cut said (a 100 MB line of a case file made a 420 MB message); a name is shown whole.
TEST(ErrorText, LongInputIsCutANameIsWhole) {
  const std::string line(kQuotedBytes + 5, '\0');
  EXPECT_EQ(quote_input(line).size(), 2 + 4 * kQuotedBytes + std::string(" (its first 200 of 205 bytes)").size());
  EXPECT_NE(quote_input(line).find("' (its first 200 of 205 bytes)"), std::string::npos);
  EXPECT_EQ(display_name(line).size(), 2 + 4 * line.size());
}

// Plain names print as they are; a name with a newline, control byte, quote or backslash is quoted and
// escaped, so that it cannot forge a line of a tool's output (they were printed raw).
TEST(ErrorText, NamesArePlainOrQuotedAndEscaped) {
  EXPECT_EQ(display_name("/tmp/golden data/smoke.h5"), "/tmp/golden data/smoke.h5");
  EXPECT_EQ(display_name("a\nEQUAL    smoke.h5"), "'a\\x0aEQUAL    smoke.h5'");
  EXPECT_EQ(display_name("\x1b[2J\r.h5"), "'\\x1b[2J\\x0d.h5'");
  EXPECT_EQ(display_name("say \"hi\".h5"), "'say \"hi\".h5'");
  EXPECT_EQ(display_name("it's.h5"), "'it\\'s.h5'");
  EXPECT_EQ(display_name("back\\slash"), "'back\\\\slash'");
  EXPECT_EQ(display_name("caf\xc3\xa9"), "'caf\\xc3\\xa9'");
  EXPECT_EQ(display_name(""), "''");
}

}  // namespace
}  // namespace mok::test
