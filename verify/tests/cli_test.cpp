// mok-verify as a user runs it: exit 0 / 1 / 2, the first mismatch named, bad files named, JSON.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <functional>
#include <utility>

#include "mok/golden/catalogue.h"
#include "mok/golden/golden.h"
#include "test_files.h"

namespace mok::verify {
namespace {

using golden::testing::RawGolden;
using golden::testing::TempDir;
using golden::testing::ToolRun;

class MokVerifyCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { smoke_ = new golden::GoldenCase(golden::make_case(golden::builtin_case())); }
  static void TearDownTestSuite() { delete smoke_; }

  void SetUp() override { golden::write_golden(dir_ / "golden.h5", *smoke_); }

  ToolRun verify(const std::string& args) { return golden::testing::run_tool(MOK_VERIFY_TOOL, dir_, args); }

  // A copy of the golden, made wrong by `damage` (a candidate unless used as the golden).
  std::string damaged(const std::string& name, const std::function<void(const std::filesystem::path&)>& damage) {
    std::filesystem::copy_file(dir_ / "golden.h5", dir_ / name);
    damage(dir_ / name);
    return (dir_ / name).string();
  }

  std::string golden_path() const { return (dir_ / "golden.h5").string(); }

  static golden::GoldenCase* smoke_;
  TempDir dir_{"verify-cli"};
};

golden::GoldenCase* MokVerifyCli::smoke_ = nullptr;

TEST_F(MokVerifyCli, IdenticalCandidateExitsZero) {
  std::filesystem::copy_file(dir_ / "golden.h5", dir_ / "copy.h5");
  const ToolRun r = verify(golden_path() + " --candidate " + (dir_ / "copy.h5").string());
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("EQUAL    smoke: all 23 tensors bitwise equal"), std::string::npos) << r.output;
}

TEST_F(MokVerifyCli, OneFlippedBitExitsOneAndIsLocated) {
  golden::GoldenCase copy = *smoke_;
  copy.results.outputs[1].bytes[2 * (20 * 64 + 3)] ^= 1;  // dx[20, 3]
  golden::write_golden(dir_ / "flipped.h5", copy);
  const ToolRun r = verify(golden_path() + " --candidate " + (dir_ / "flipped.h5").string());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("dx: first mismatch dx[20, 3] (rank 1, token 4 (global 20), column 3): golden 0x"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("dx: ulp histogram 0: 2047, 1: 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("MISMATCH smoke: 1 of 23 tensors differ"), std::string::npos) << r.output;
}

TEST_F(MokVerifyCli, ReferenceBackendMatchesAndFp32StepDoesNot) {
  ToolRun r = verify(golden_path() + " --backend reference --runs 2");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("against reference (run 2/2)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[mok-verify] smoke: running reference (run 1/2)"), std::string::npos) << r.output;
  r = verify(golden_path() + " --backend reference --ring-rows 16 --recompute on --quiet");
  EXPECT_EQ(r.status, 0) << r.output;
  r = verify(golden_path() + " --backend reference --step fp32");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("ulp histogram 0: "), std::string::npos) << r.output;
}

TEST_F(MokVerifyCli, BadFilesExitTwoNamingTheProblem) {
  const std::vector<char> bytes = golden::testing::read_bytes(dir_ / "golden.h5");
  const struct {
    std::string file, message;
  } cases[] = {
      {damaged("corrupt.h5",
               [&](const std::filesystem::path& p) {
                 std::vector<char> b = bytes;
                 b[b.size() / 3] ^= 0x40;
                 golden::testing::write_bytes(p, b);
               }),
       "corrupt.h5: the file's SHA-256 does not match its seal: the file is corrupt"},
      {damaged("truncated.h5",
               [&](const std::filesystem::path& p) {
                 golden::testing::write_bytes(p, std::vector<char>(bytes.begin(), bytes.begin() + 4000));
               }),
       "truncated.h5: truncated: 4000 bytes"},
      {damaged("version.h5", [](const std::filesystem::path& p) { RawGolden(p).set_root_i32("format_version", 7); }),
       "version.h5: format version 7, this build reads version 1"},
      {damaged("missing.h5", [](const std::filesystem::path& p) { RawGolden(p).remove("/routing/slot_row"); }),
       "missing.h5: missing dataset /routing/slot_row"},
      {(dir_ / "absent.h5").string(), "absent.h5: no such file"},
  };
  for (const auto& c : cases) {
    ToolRun r = verify(c.file + " --backend reference");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.message << "\n" << r.output;
    r = verify(golden_path() + " --candidate " + c.file);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.message << "\n" << r.output;
  }
}

// An input the backend refuses (a given expert id out of range) is named with the golden file it came
// from: a directory's goldens run one after another.
TEST_F(MokVerifyCli, AnInputTheBackendRefusesIsNamedWithItsFile) {
  golden::GoldenCase g = golden::make_case(*golden::find_case("zipf"));
  golden::Tensor* given = nullptr;
  for (golden::Tensor& t : g.inputs)
    if (t.name == "given_topk_idx") given = &t;
  ASSERT_NE(given, nullptr);
  const int32_t out_of_range = 99;
  std::memcpy(given->bytes.data(), &out_of_range, sizeof out_of_range);
  std::filesystem::create_directory(dir_ / "goldens");
  golden::write_golden(dir_ / "goldens" / "misrouted.h5", g);
  const ToolRun r = verify((dir_ / "goldens").string() + " --backend reference");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("misrouted.h5: mok: invalid input: topk_idx[0, 0] = 99"), std::string::npos) << r.output;
}

TEST_F(MokVerifyCli, JsonReportIsWrittenAtomically) {
  ToolRun r = verify(golden_path() + " --backend reference --quiet --json " + (dir_ / "report.json").string());
  EXPECT_EQ(r.status, 0) << r.output;
  const std::string json = golden::testing::read_text(dir_ / "report.json");
  EXPECT_NE(json.find("\"all_equal\": true"), std::string::npos) << json;
  EXPECT_NE(json.find("\"name\": \"d_w1\", \"group\": \"outputs\", \"dtype\": \"f32\", \"shape\": [4, 128, 64]"),
            std::string::npos)
      << json;
  const size_t files_before = dir_.entries().size();
  r = verify(golden_path() + " --backend reference --json " + (dir_ / "no-dir" / "report.json").string());
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("does not exist"), std::string::npos) << r.output;
  EXPECT_EQ(dir_.entries().size(), files_before);
}

// A --json that cannot be written (a directory, a parent that does not exist) was found only after
// every golden had run: refused before any run, naming the path.
TEST_F(MokVerifyCli, AnUnwritableJsonIsRefusedBeforeAnyRun) {
  const std::string dir = dir_.path().string(), missing = (dir_ / "no-dir" / "report.json").string();
  const struct {
    std::string json, message;
  } cases[] = {
      {dir, "mok-verify: mok: cannot write --json " + dir + ": it is a directory, not a regular file"},
      {missing, "mok-verify: mok: cannot write --json " + missing + ": " + dir + "/no-dir does not exist"},
  };
  for (const auto& c : cases) {
    const ToolRun r = verify(golden_path() + " --backend reference --json " + c.json);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("[mok-verify]"), std::string::npos) << r.output;  // no golden read or run
    EXPECT_EQ(r.output.find("EQUAL"), std::string::npos) << r.output;
  }
}

// `--json` naming a golden or the candidate used to write the report over it (exit 0; the golden was
// then "not a mok golden file"). Refused before any run, the file left as it was; also a golden found in
// a directory, and one named by another path.
TEST_F(MokVerifyCli, AJsonReportOverAnInputIsRefused) {
  std::filesystem::copy_file(dir_ / "golden.h5", dir_ / "copy.h5");
  const std::vector<char> bytes = golden::testing::read_bytes(dir_ / "golden.h5");
  const std::string copy = (dir_ / "copy.h5").string(), dir = dir_.path().string();
  const struct {
    std::string args, message;
  } cases[] = {
      {golden_path() + " --backend reference --json " + golden_path(), "is the golden file " + golden_path()},
      {dir + " --backend reference --json " + dir + "/./copy.h5", "is the golden file " + copy},
      {golden_path() + " --candidate " + copy + " --json " + copy, "is the candidate file " + copy},
  };
  for (const auto& c : cases) {
    const ToolRun r = verify(c.args);
    EXPECT_EQ(r.status, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find("mok-verify: mok: --json "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(c.message + " this run reads: the report would overwrite it"), std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("EQUAL"), std::string::npos) << r.output;  // before any run
    EXPECT_TRUE(golden::testing::read_bytes(dir_ / "golden.h5") == bytes) << c.args << ": golden.h5 was overwritten";
    EXPECT_TRUE(golden::testing::read_bytes(dir_ / "copy.h5") == bytes) << c.args << ": copy.h5 was overwritten";
  }
}

// Issue 16: a directory without goldens used to exit 0 (and --json said all_equal: true). Checking
// nothing is a failure.
TEST_F(MokVerifyCli, ADirectoryWithoutGoldensFails) {
  std::filesystem::create_directory(dir_ / "empty");
  const std::string json = (dir_ / "report.json").string();
  const ToolRun r = verify((dir_ / "empty").string() + " --backend reference --json " + json);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("mok-verify: mok: directory " + (dir_ / "empty").string() +
                          " holds no *.h5 golden file: nothing to verify"),
            std::string::npos)
      << r.output;
  const std::string report = golden::testing::read_text(json);
  EXPECT_NE(report.find("\"all_equal\": false"), std::string::npos) << report;
  EXPECT_NE(report.find("nothing to verify"), std::string::npos) << report;
}

// A directory, a FIFO or a device given as the golden file is named for what it is ("no such file"
// before).
TEST_F(MokVerifyCli, AGoldenThatIsNoRegularFileIsNamed) {
  ASSERT_EQ(mkfifo((dir_ / "fifo.h5").c_str(), 0600), 0);
  for (const auto& [file, what] : {std::pair<std::string, std::string>{(dir_ / "fifo.h5").string(), "is a FIFO"},
                                   {"/dev/zero", "is a character device"}}) {
    ToolRun r = golden::testing::run_tool(MOK_VERIFY_TOOL, dir_, file + " --backend reference", 30);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(file + ": " + what + ", not a regular file"), std::string::npos) << r.output;
    r = golden::testing::run_tool(MOK_VERIFY_TOOL, dir_, golden_path() + " --candidate " + file, 30);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(file + ": " + what + ", not a regular file"), std::string::npos) << r.output;
  }
}

// A report lost to a full disk (here /dev/full) is no success: it exited 0.
TEST_F(MokVerifyCli, AnUnwritableStandardOutputExitsTwo) {
  for (const std::string& args :
       {golden_path() + " --candidate " + golden_path(), golden_path() + " --backend reference --quiet"}) {
    ToolRun r = golden::testing::run_tool_with_stdout(MOK_VERIFY_TOOL, dir_, args, "/dev/full");
    EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("mok-verify: cannot write to standard output"), std::string::npos) << r.output;
    r = golden::testing::run_tool_with_stdout(MOK_VERIFY_TOOL, dir_, args, "/dev/null");
    EXPECT_EQ(r.status, 0) << args << "\n" << r.output;
  }
}

// --ring-rows that is no whole number of K-steps is a usage error before any golden is read: it was
// each golden's error, once per golden of a directory.
TEST_F(MokVerifyCli, ARingRowsOfNoWholeKStepsIsAUsageError) {
  golden::write_golden(dir_ / "second.h5", *smoke_);
  for (const char* rows : {"8", "17", "2147483647"}) {
    const ToolRun r = verify(dir_.path().string() + " --backend reference --quiet --ring-rows " + rows);
    EXPECT_EQ(r.status, 2) << rows << "\n" << r.output;
    EXPECT_NE(r.output.find(std::string("mok-verify: --ring-rows: ring_rows = ") + rows +
                            " is not a positive multiple of 16"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("usage:"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("second.h5"), std::string::npos) << r.output;  // no golden named: none was read
  }
  EXPECT_EQ(verify(dir_.path().string() + " --backend reference --quiet --ring-rows 32").status, 0);
}

// Numbers parse strictly: " 2" and "+2" used to pass as 2.
TEST_F(MokVerifyCli, NumbersParseStrictly) {
  for (const char* value : {"' 2'", "+2", "2x", "0x2", "1e1", "99999999999", "''"}) {
    const ToolRun r = verify(golden_path() + " --backend reference --runs " + value);
    EXPECT_EQ(r.status, 2) << value << "\n" << r.output;
    EXPECT_NE(r.output.find("usage:"), std::string::npos) << value << "\n" << r.output;
  }
}

TEST_F(MokVerifyCli, JunkArgumentsAreEchoedEscaped) {
  const ToolRun r = verify(golden_path() + " --backend reference --step \"$(printf 'fp\\001\\377')\"");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("--step takes hopper_tc or fp32 (fp32_fma), got 'fp\\x01\\xff'"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find('\x01'), std::string::npos) << r.output;
}

// An option mok-verify does not know is named as such wherever it stands (last, it was said to need a
// value; -q was taken for a golden file's name, after the goldens before it had run).
TEST_F(MokVerifyCli, UnknownOptionsAreNamedBeforeAnyRun) {
  for (const std::string option : {"--bogus", "-q"}) {
    const ToolRun r = verify(golden_path() + " --backend reference " + option);
    EXPECT_EQ(r.status, 2) << option << "\n" << r.output;
    EXPECT_NE(r.output.find("unknown option '" + option + "'"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("EQUAL"), std::string::npos) << r.output;
  }
}

TEST_F(MokVerifyCli, UsageErrorsExitTwo) {
  for (const std::string& args :
       {std::string(""), golden_path(), golden_path() + " --backend reference --candidate x.h5",
        golden_path() + " --backend gpu-that-is-not-there", golden_path() + " --backend reference --runs 0",
        golden_path() + " --candidate x.h5 --step fp32", golden_path() + " --backend reference --step fp64",
        golden_path() + " --backend reference --frobnicate 1"}) {
    const ToolRun r = verify(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("usage:"), std::string::npos) << args << "\n" << r.output;
  }
}

// The refusal of an option only a backend takes, given beside --candidate, names that option.
TEST_F(MokVerifyCli, BackendOnlyOptionsBesideACandidateAreNamed) {
  for (const std::string option : {"--one-process", "--timeout 5"}) {
    const ToolRun r = verify(golden_path() + " --candidate x.h5 " + option);
    EXPECT_EQ(r.status, 2) << option << "\n" << r.output;
    const size_t refusal = r.output.find("apply to --backend only");
    ASSERT_NE(refusal, std::string::npos) << r.output;
    const std::string line = r.output.substr(0, refusal).substr(r.output.rfind('\n', refusal) + 1);
    EXPECT_NE(line.find(option.substr(0, option.find(' '))), std::string::npos) << r.output;
  }
}

// An option where a value should be is a missing value (`--json --quiet` wrote the report to a file
// named "--quiet", exit 0), and an option given twice is refused (the last one used to win silently).
TEST_F(MokVerifyCli, AMissingOrRepeatedOptionValueIsAUsageError) {
  const std::string in_dir = "cd " + dir_.path().string() + " && " + MOK_VERIFY_TOOL;
  ToolRun r = golden::testing::run_tool(in_dir, dir_, golden_path() + " --backend reference --json --quiet");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("mok-verify: '--json' needs a value"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "--quiet"));
  r = verify(golden_path() + " --candidate " + golden_path() + " --candidate " + (dir_ / "other.h5").string());
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("mok-verify: '--candidate' is given twice"), std::string::npos) << r.output;
  r = verify(golden_path() + " --backend reference --quiet --quiet");  // a flag too (it was accepted)
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("mok-verify: '--quiet' is given twice"), std::string::npos) << r.output;
}

// `--json -` wrote the report into a file named "-", exit 0: refused (standard output holds the report).
TEST_F(MokVerifyCli, JsonToADashIsAUsageError) {
  const std::string in_dir = "cd " + dir_.path().string() + " && " + MOK_VERIFY_TOOL;
  const ToolRun r = golden::testing::run_tool(in_dir, dir_, golden_path() + " --backend reference --json -");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("--json needs a file name ('-': standard output holds the report)"), std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "-"));
}

// A golden path that cannot be examined (here a symbolic link loop) is a file error like any other: it
// escaped as std::filesystem_error, so that the goldens beside it went unverified and no --json was written.
TEST_F(MokVerifyCli, AGoldenThatCannotBeExaminedIsAFileError) {
  const std::filesystem::path loop = dir_ / "loop.h5";
  std::filesystem::create_symlink(loop, loop);
  const std::string json = (dir_ / "report.json").string();
  const ToolRun r = verify(loop.string() + " " + golden_path() + " --backend reference --quiet --json " + json);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("mok: golden file " + loop.string() + ": cannot be examined: "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("EQUAL    smoke"), std::string::npos) << r.output;
  const std::string report = golden::testing::read_text(json);
  EXPECT_NE(report.find("\"all_equal\": false"), std::string::npos) << report;
  EXPECT_NE(report.find(loop.string() + ": cannot be examined: "), std::string::npos) << report;
  const ToolRun candidate = verify(loop.string() + " --candidate " + golden_path());
  EXPECT_EQ(candidate.status, 2) << candidate.output;
  EXPECT_NE(candidate.output.find("mok: golden file " + loop.string() + ": cannot be examined: "), std::string::npos)
      << candidate.output;
}

// File names were printed raw: one holding a newline forged a report line ("EQUAL ..."), a control byte
// reached the terminal. Names that are not plain printable ASCII are quoted and escaped in the text
// (progress, report, errors) and escaped per RFC 8259 in the JSON.
TEST_F(MokVerifyCli, FileNamesAreQuotedAndEscaped) {
  const std::string evil = "x\nEQUAL    forged: all 23 tensors bitwise equal 'q' \"dq\"\x1b[2J.h5";
  const std::filesystem::path names = dir_ / "names";
  std::filesystem::create_directory(names);
  std::filesystem::copy_file(dir_ / "golden.h5", names / evil);
  golden::testing::write_bytes(names / ("broken " + evil), {'n', 'o', 't'});
  const std::string json = (dir_ / "report.json").string();
  const ToolRun r = verify(names.string() + " --backend reference --json " + json);
  EXPECT_EQ(r.status, 2) << r.output;
  const std::string shown = display_name((names / evil).string());
  std::string expected(1, '\'');  // appended, not "'" + ...: GCC 12 warns (-Wrestrict) on that form
  expected += names.string() + "/x\\x0aEQUAL    forged: all 23 tensors bitwise equal \\'q\\' \"dq\"\\x1b[2J.h5'";
  EXPECT_EQ(shown, expected);
  EXPECT_NE(r.output.find("[mok-verify] reading " + shown), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("golden " + shown + " (smoke) against reference"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("mok-verify: mok: golden file " + display_name((names / ("broken " + evil)).string()) + ": "),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("\nEQUAL    forged"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find('\x1b'), std::string::npos) << r.output;
  const std::string report = golden::testing::read_text(json);
  EXPECT_NE(report.find("\"golden\": \"" + names.string() +
                        "/x\\u000aEQUAL    forged: all 23 tensors bitwise equal 'q' \\\"dq\\\"\\u001b[2J.h5\""),
            std::string::npos)
      << report;
  EXPECT_EQ(report.find('\n' + std::string("EQUAL")), std::string::npos) << report;
}

// --gpus N runs over N processes; its arguments are checked before any GPU is looked for, so these
// hold on a machine without one.
TEST_F(MokVerifyCli, GpusArgumentsAreCheckedBeforeAnyGpu) {
  for (const std::string& args :
       {golden_path() + " --backend gpu --gpus 0", golden_path() + " --backend gpu --gpus -1",
        golden_path() + " --backend gpu --gpus two", golden_path() + " --backend gpu --timeout 10",
        golden_path() + " --backend gpu --one-process",
        golden_path() + " --backend gpu --gpus 2 --one-process --timeout 10",
        golden_path() + " --candidate x.h5 --gpus 2"}) {
    const ToolRun r = verify(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("usage:"), std::string::npos) << args << "\n" << r.output;
  }
  const ToolRun r = verify(golden_path() + " --backend reference --gpus 2");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("--gpus applies to the gpu backend only"), std::string::npos) << r.output;
}

// The smoke golden (R=2, 32 tokens, 4 experts) splits over 1, 2 and 4 GPUs, not over 3.
TEST_F(MokVerifyCli, AGoldenThatDoesNotSplitOverTheGpusIsRefused) {
  if (!MOK_VERIFY_GPU_BACKEND) GTEST_SKIP() << "a build without CUDA has no gpu backend";
  const ToolRun r = verify(golden_path() + " --backend gpu --gpus 3 --quiet");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("the golden's R=2 ranks do not split over 3 GPUs, nor do its 32 tokens and 4 experts"),
            std::string::npos)
      << r.output;
}

// Why a test of mok-verify without a GPU cannot run here, from `--backend gpu --gpus 2` on the golden: "" where
// it found no GPU (77). Any outcome but GPUs found is a failure (a regression to exit 2 without a GPU skipped the
// tests that check it).
std::string gpus_found(const ToolRun& probe) {
  if (probe.status == 0) return "two Hopper GPUs are here: no \"no GPU\" result to test";
  if (probe.status == 2 && probe.output.find("Hopper GPU(s) are usable") != std::string::npos)
    return "a Hopper GPU is here (too few for --gpus 2): no \"no GPU\" result to test";
  EXPECT_EQ(probe.status, 77) << probe.output;
  return "";
}

// Without a GPU the goldens after the first are still read, so a file error anywhere wins over "no GPU"
// (exit 2, not 77), and the report names the broken file.
TEST_F(MokVerifyCli, AFileErrorAfterNoGpuStillWins) {
  if (!MOK_VERIFY_GPU_BACKEND) GTEST_SKIP() << "a build without CUDA has no gpu backend";
  if (const std::string why = gpus_found(verify(golden_path() + " --backend gpu --gpus 2 --quiet")); !why.empty())
    GTEST_SKIP() << why;
  const std::string broken = (dir_ / "broken.h5").string();
  golden::testing::write_bytes(broken, {'n', 'o', 't', ' ', 'h', 'd', 'f'});
  const ToolRun r = verify(golden_path() + " " + broken + " --backend gpu --gpus 2 --quiet");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("broken.h5"), std::string::npos) << r.output;
}

// --gpus N in one process finds no GPU as the ranks across processes do: 77 (a skip), not 2 (it was 2).
TEST_F(MokVerifyCli, NoGpuInOneProcessIsASkipAsAcrossProcesses) {
  if (!MOK_VERIFY_GPU_BACKEND) GTEST_SKIP() << "a build without CUDA has no gpu backend";
  if (const std::string why = gpus_found(verify(golden_path() + " --backend gpu --gpus 2 --quiet")); !why.empty())
    GTEST_SKIP() << why;
  const ToolRun r = verify(golden_path() + " --backend gpu --gpus 2 --one-process --quiet");
  EXPECT_EQ(r.status, 77) << r.output;
  EXPECT_NE(r.output.find("no Hopper GPU"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace mok::verify
