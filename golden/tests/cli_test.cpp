// mok-golden as CI runs it: exit status 0 / 1 / 2 and the first differing element named.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fstream>

#include "mok/core/validate.h"
#include "mok/golden/catalogue.h"
#include "mok/golden/golden.h"
#include "mok/reference/oracle.h"
#include "test_files.h"

namespace mok::golden {
namespace {

using testing::TempDir;

testing::ToolRun run_tool(const TempDir& dir, const std::string& args, int timeout_s = 0) {
  return testing::run_tool(MOK_GOLDEN_TOOL, dir, args, timeout_s);
}

// `mok-golden check` of the golden g written as dir/data/<stem>.h5.
testing::ToolRun check_as(const TempDir& dir, const std::string& stem, const GoldenCase& g) {
  std::filesystem::create_directory(dir / "data");
  write_golden(dir / "data" / (stem + ".h5"), g);
  return run_tool(dir, "check --name " + stem + " --dir " + (dir / "data").string());
}

TEST(MokGoldenCli, CheckPassesOnFreshGoldens) {
  TempDir dir("golden-cli-ok");
  const testing::ToolRun r = check_as(dir, "single_token", make_case(*find_case("single_token")));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("ok    single_token"), std::string::npos) << r.output;
}

// A golden whose file is not named after its case is checked as that file: its line names both (`ok smoke` for
// o5.h5 stood beside "catalogue case has no golden .../smoke.h5").
TEST(MokGoldenCli, CheckNamesAFileNotNamedAfterItsCase) {
  TempDir dir("golden-cli-renamed");
  const testing::ToolRun r = check_as(dir, "o5", make_case(*find_case("single_token")));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("ok    single_token (o5.h5)\n"), std::string::npos) << r.output;
}

TEST(MokGoldenCli, CheckNamesTheFirstDifferingElement) {
  TempDir dir("golden-cli-diff");
  GoldenCase g = make_case(*find_case("single_token"));
  Tensor& y = g.results.outputs.front();
  ASSERT_EQ(y.name, "y");
  y.bytes[2 * 70] ^= 1;  // element 70 = y[1, 6]: rank 1, token 0
  const testing::ToolRun r = check_as(dir, "single_token", g);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("first difference y[1, 6] (rank 1, token 0 (global 1), column 6): golden 0x"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("FAIL  single_token: 1 tensors differ"), std::string::npos) << r.output;
}

// `mok-golden check --name` of `g`, written as its case's committed golden in a directory of its own:
// it fails (exit 1) with `failure` in its output.
void expect_check_fails(const std::string& dir_name, const GoldenCase& g, const std::string& failure) {
  TempDir dir(dir_name);
  write_golden(dir / (g.name + ".h5"), g);
  const testing::ToolRun r = run_tool(dir, "check --name " + g.name + " --dir " + dir.path().string());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find(failure), std::string::npos) << r.output;
}

TEST(MokGoldenCli, CheckFailsAGoldenTheCatalogueNoLongerDescribes) {
  CaseSpec spec = *find_case("single_token");
  spec.recipe.seed += 1;
  expect_check_fails("golden-cli-stale", make_case(spec),
                     "FAIL  single_token: the catalogue's seed differs from the committed golden's");
}

// Every option is compared: a golden written with the other fp8_weight_gradients (its weight gradients
// another chain's bits) is not the catalogue's case.
TEST(MokGoldenCli, CheckFailsAGoldenOfAnotherFp8WeightGradientsOption) {
  CaseSpec spec = *find_case("fp8_smoke");
  spec.options.fp8_weight_gradients = !spec.options.fp8_weight_gradients;
  expect_check_fails("golden-cli-stale-option", make_case(spec),
                     "FAIL  fp8_smoke: the catalogue's fp8_weight_gradients differs from the committed golden's");
}

// A golden whose stored fp64-oracle bound is not this build's (the fp8 goldens of 5928fe1 held the bf16
// bounds, which their own errors exceeded) fails, naming the tensor.
TEST(MokGoldenCli, CheckFailsAGoldenWithAStaleOracleBound) {
  GoldenCase g = make_case(*find_case("fp8_smoke"));
  ASSERT_EQ(g.oracle.at("y").bound, ref::oracle_bound(ref::OracleTensor::y, Precision::fp8));
  g.oracle.at("y").bound = ref::oracle_bound(ref::OracleTensor::y, Precision::bf16);
  expect_check_fails("golden-cli-bound", g, "FAIL  fp8_smoke: its stored fp64-oracle bound of y: ");
}

// A write that fails for want of room (here a file-size limit, its signal ignored, as a full disk) is a
// clear error naming the file, exit 2, with nothing left behind; it used to crash at exit (status 139)
// in HDF5's close of the half-written file.
TEST(MokGoldenCli, AFailedWriteIsAnErrorAndLeavesNoFile) {
  TempDir dir("golden-cli-full");
  const std::string limited = "trap '' XFSZ; ulimit -f 100; " + std::string(MOK_GOLDEN_TOOL);
  const testing::ToolRun r = testing::run_tool(limited, dir, "generate --name smoke --out " + dir.path().string());
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("mok: writing golden file " + (dir / "smoke.h5").string() + ": cannot write"),
            std::string::npos)
      << r.output;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(entry.path().filename(), "tool.log") << "left behind: " << entry.path();
}

// Generating the catalogue goes on past a case that fails (it stopped at the first): each failure is named
// with its error, leaves no file, and makes the exit status 2; every other case is written.
TEST(MokGoldenCli, GenerateWritesEveryCaseItCanAndNamesEachFailure) {
  TempDir dir("golden-cli-generate-all");
  const std::string first = catalogue().front().name, last = catalogue().back().name;
  for (const std::string& name : {first, last}) std::filesystem::create_directory(dir / (name + ".h5"));
  const testing::ToolRun r = run_tool(dir, "generate --out " + dir.path().string());
  EXPECT_EQ(r.status, 2) << r.output;
  for (const std::string& name : {first, last}) {
    const std::string file = (dir / (name + ".h5")).string();
    EXPECT_NE(
        r.output.find("ERROR " + name + ": mok: cannot write " + file + ": it is a directory, not a regular file"),
        std::string::npos)
        << r.output;
  }
  EXPECT_NE(r.output.find("2 of " + std::to_string(catalogue().size()) + " cases failed"), std::string::npos)
      << r.output;
  for (const CaseSpec& spec : catalogue()) {
    if (spec.name == first || spec.name == last) continue;
    EXPECT_EQ(read_golden(dir / (spec.name + ".h5")).name, spec.name);
  }
  EXPECT_EQ(dir.entries().size(), catalogue().size() + 1);  // the goldens, the two directories and tool.log
}

TEST(MokGoldenCli, CheckReportsAMissingCatalogueGoldenAndACorruptFile) {
  TempDir dir("golden-cli-bad");
  testing::write_bytes(dir / "broken.h5", {'n', 'o', 't', ' ', 'h', 'd', 'f'});
  const testing::ToolRun r = run_tool(dir, "check --dir " + dir.path().string());
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("ERROR broken.h5: mok: golden file"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ERROR smoke: catalogue case has no golden"), std::string::npos) << r.output;
  // The summary counts the one file checked and the catalogue's missing goldens apart (it said "1 goldens
  // checked ...: 15 failed").
  const std::string missing = std::to_string(catalogue().size()) + " catalogue cases without a golden";
  EXPECT_NE(r.output.find(" s: 1 failed; " + missing + "\n"), std::string::npos) << r.output;
}

// A golden whose HDF5 metadata was damaged and which was sealed again (here: the first object of the
// global heap, where the string attributes live, given a size past the file's end) is that golden's
// ERROR line, exit 2; the check crashed inside libhdf5 (SIGSEGV in H5HG_read) before the reader checked
// the heap (more kinds: hdf5_metadata_test.cpp).
TEST(MokGoldenCli, CheckReportsAResealedGoldenWithBrokenMetadataInsteadOfCrashing) {
  TempDir dir("golden-cli-resealed");
  write_golden(dir / "single_token.h5", make_case(*find_case("single_token")));
  std::vector<char> bytes = testing::read_bytes(dir / "single_token.h5");
  const std::string heap = "GCOL";
  const size_t at = size_t(std::search(bytes.begin(), bytes.end(), heap.begin(), heap.end()) - bytes.begin());
  ASSERT_LT(at + 32, bytes.size());
  bytes[at + 24 + 4] = 0x20;  // the first object's size, 2^37 bytes more
  testing::write_bytes(dir / "single_token.h5", bytes);
  seal_file(dir / "single_token.h5");
  const testing::ToolRun r = run_tool(dir, "check --name single_token --dir " + dir.path().string(), 60);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("ERROR single_token.h5: mok: golden file "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(": attribute /@format: the global heap collection at address "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("does not fit the collection (malformed HDF5 metadata: the file is corrupt or was edited)"),
            std::string::npos)
      << r.output;
}

TEST(MokGoldenCli, GenerateFromCaseFile) {
  TempDir dir("golden-cli-config");
  const testing::ToolRun r = run_tool(
      dir, std::string("generate --config ") + MOK_EXAMPLE_CASE_FILE + " --out " + (dir / "example.h5").string());
  ASSERT_EQ(r.status, 0) << r.output;
  const GoldenCase g = read_golden(dir / "example.h5");
  EXPECT_EQ(g.name, "example_deepseek_like");
  EXPECT_EQ(g.config.score_mode, ScoreMode::sigmoid);
  ASSERT_TRUE(g.recipe);
  EXPECT_EQ(g.recipe->seed, 2024u);
}

// Issue 16: a file named for a catalogue case is that case's golden; holding another case is a failure
// naming both (it used to pass, checking the other case, and the named case was never checked).
TEST(MokGoldenCli, CheckFailsAFileHoldingAnotherCaseThanItsName) {
  TempDir dir("golden-cli-misnamed");
  write_golden(dir / "smoke.h5", make_case(*find_case("single_token")));
  const testing::ToolRun r = run_tool(dir, "check --name smoke --dir " + dir.path().string());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("FAIL  smoke.h5: named for the catalogue case smoke but holds the case 'single_token'"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("1 goldens checked"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1 failed"), std::string::npos) << r.output;
  // The README's check --builtin reads the same file: the same failure (it compared the tensors alone).
  const testing::ToolRun builtin = run_tool(dir, "check --builtin --dir " + dir.path().string());
  EXPECT_EQ(builtin.status, 1) << builtin.output;
  EXPECT_NE(builtin.output.find("FAIL  smoke.h5: named for the catalogue case smoke but holds the case"),
            std::string::npos)
      << builtin.output;
}

// routing = zipf with zipf_s = 2000 and k = 2 used to corrupt the heap (SIGABRT): the weights after
// expert 0's underflow to 0.
TEST(MokGoldenCli, GenerateAZipfCaseWithAHugeExponent) {
  TempDir dir("golden-cli-zipf");
  std::ofstream(dir / "huge_s.txt") << "ranks = 2\ntokens_per_rank = 4\nexperts = 4\ntop_k = 2\nrouting = zipf\n"
                                       "zipf_s = 2000\n";
  const testing::ToolRun r =
      run_tool(dir, "generate --config " + (dir / "huge_s.txt").string() + " --out " + (dir / "huge_s.h5").string());
  ASSERT_EQ(r.status, 0) << r.output;
  const GoldenCase g = read_golden(dir / "huge_s.h5");
  EXPECT_EQ(i32_values(g.tensor("given_topk_idx")),
            (std::vector<int32_t>{0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1}));
}

// `--out` naming the case file itself used to write the golden over it (exit 0, the case lost); through
// another path to the same file too. Refused before anything is written.
TEST(MokGoldenCli, GenerateRefusesToWriteOverItsCaseFile) {
  TempDir dir("golden-cli-config-over-itself");
  const std::string text = "name = itself\nranks = 1\ntokens_per_rank = 4\nexperts = 2\ntop_k = 1\n";
  std::ofstream(dir / "case.txt") << text;
  std::filesystem::create_directory(dir / "sub");
  for (const std::string& out : {(dir / "case.txt").string(), (dir / "sub" / ".." / "case.txt").string()}) {
    const testing::ToolRun r = run_tool(dir, "generate --config " + (dir / "case.txt").string() + " --out " + out);
    EXPECT_EQ(r.status, 2) << out << "\n" << r.output;
    EXPECT_NE(r.output.find("mok-golden: --out " + out + " is the case file --config reads"), std::string::npos)
        << r.output;
    EXPECT_TRUE(testing::read_text(dir / "case.txt") == text) << out << ": the case file was overwritten";
  }
}

// A directory used to become a golden of all defaults (exit 0), a FIFO to block; /dev/zero is no file
// either. Each exits 2 naming what the path is, and nothing is written.
TEST(MokGoldenCli, GenerateRefusesAConfigThatIsNoRegularFile) {
  TempDir dir("golden-cli-config-kind");
  std::filesystem::create_directory(dir / "a_dir");
  ASSERT_EQ(mkfifo((dir / "a_fifo").c_str(), 0600), 0);
  const struct {
    std::string path, what;
  } cases[] = {{(dir / "a_dir").string(), "is a directory, not a regular file"},
               {(dir / "a_fifo").string(), "is a FIFO, not a regular file"},
               {"/dev/zero", "is a character device, not a regular file"},
               {(dir / "absent.txt").string(), "no such file"}};
  for (const auto& c : cases) {
    const testing::ToolRun r = run_tool(dir, "generate --config " + c.path + " --out " + (dir / "out.h5").string(), 30);
    EXPECT_EQ(r.status, 2) << c.path << "\n" << r.output;
    EXPECT_NE(r.output.find("mok: case file " + c.path + ": " + c.what), std::string::npos) << r.output;
    EXPECT_FALSE(std::filesystem::exists(dir / "out.h5")) << c.path;
  }
}

// A case file past 1 MiB (a golden or a log passed by mistake) was read whole, its memory blamed on the case.
TEST(MokGoldenCli, GenerateRefusesACaseFileOfMoreThanOneMebibyte) {
  TempDir dir("golden-cli-config-size");
  std::string comments;
  while (comments.size() <= (1u << 20)) comments += "# a comment line, as a case file may hold\n";
  std::ofstream(dir / "large.txt") << comments;
  const std::string config = (dir / "large.txt").string();
  const testing::ToolRun r = run_tool(dir, "generate --config " + config + " --out " + (dir / "out.h5").string(), 30);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("mok: case file " + config + " is " + std::to_string(comments.size()) +
                          " bytes: a case file is key = value lines, at most 1048576 bytes"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "out.h5"));
}

TEST(MokGoldenCli, SizesPastMemoryAreRefusedBeforeAllocating) {
  TempDir dir("golden-cli-huge");
  std::ofstream(dir / "huge.txt") << "hidden = 1048576\nintermediate = 1048576\n";
  std::ofstream(dir / "overflow.txt") << "ranks = 2\ntokens_per_rank = 1073741824\nexperts = 2\n";
  testing::ToolRun r =
      run_tool(dir, "generate --config " + (dir / "huge.txt").string() + " --out " + (dir / "huge.h5").string());
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("huge.txt: invalid input: this problem"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("GiB of host memory here (5 times its tensors'"), std::string::npos) << r.output;
  r = run_tool(dir, "generate --config " + (dir / "overflow.txt").string() + " --out " + (dir / "o.h5").string());
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("tokens N = R * T = 2147483648 is more than 2^31 - 1"), std::string::npos) << r.output;
}

// Sizes within the checks' bound but past the process's memory said only "std::bad_alloc". (1.7 GB of tensors:
// within the memory check, 5 times that, of a machine of 10 GB or more; past the 1 GB the limit leaves, so the
// first tensors do not fit and it fails in a second, not after minutes of the reference under a loaded CI.)
TEST(MokGoldenCli, OutOfMemoryNamesTheToolAndItsCause) {
  if (memory_limit_bytes() < 10e9) GTEST_SKIP() << "the memory check refuses the case here: it needs 10 GB";
  TempDir dir("golden-cli-oom");
  std::ofstream(dir / "big.txt") << "tokens_per_rank = 2000000\n";
  const testing::ToolRun r =
      testing::run_tool("ulimit -v 1000000 && " + std::string(MOK_GOLDEN_TOOL), dir,
                        "generate --config " + (dir / "big.txt").string() + " --out " + (dir / "big.h5").string());
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("mok-golden: out of memory"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "big.h5"));
}

// A name past the report's 20-character column pushes the rest along (check aborted on it: the padding's
// length wrapped below zero); a case file's name or ring_rows that no golden may hold is refused, naming
// the file.
TEST(MokGoldenCli, CaseNamesAreCheckedAndLongOnesReported) {
  TempDir dir("golden-cli-names");
  std::filesystem::create_directory(dir / "data");
  std::ofstream(dir / "long.txt") << "name = a_case_name_of_21_chr\nranks = 1\ntokens_per_rank = 4\n";
  const testing::ToolRun made = run_tool(
      dir, "generate --config " + (dir / "long.txt").string() + " --out " + (dir / "data" / "long.h5").string());
  ASSERT_EQ(made.status, 0) << made.output;
  const testing::ToolRun checked = run_tool(dir, "check --name long --dir " + (dir / "data").string());
  EXPECT_EQ(checked.status, 0) << checked.output;
  EXPECT_NE(checked.output.find("ok    a_case_name_of_21_chr"), std::string::npos) << checked.output;
  std::ofstream(dir / "escape.txt") << "name = x\x1b[2Jy\n";
  std::ofstream(dir / "ring.txt") << "name = ring\nring_rows = 0\n";
  for (const auto& [file, message] :
       {std::pair{"escape.txt", "name 'x\\x1b[2Jy' is no case name: printable ASCII without spaces"},
        std::pair{"ring.txt", "ring_rows = 0 is not a positive multiple of 16"}}) {
    const testing::ToolRun r =
        run_tool(dir, "generate --config " + (dir / file).string() + " --out " + (dir / "refused.h5").string());
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(std::string(file) + ": "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
    EXPECT_FALSE(std::filesystem::exists(dir / "refused.h5"));
  }
}

TEST(MokGoldenCli, JunkArgumentsAreEchoedEscaped) {
  TempDir dir("golden-cli-junk");
  const testing::ToolRun r = run_tool(dir, "\"$(printf 'fr\\033[2Job')\" --out x");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("unknown command 'fr\\x1b[2Job'"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find('\x1b'), std::string::npos) << r.output;
}

TEST(MokGoldenCli, UsageErrorsExitTwo) {
  TempDir dir("golden-cli-usage");
  for (const char* args : {"", "frobnicate", "generate", "check --bogus 1", "generate --out . --name nothing"}) {
    const testing::ToolRun r = run_tool(dir, args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
  }
  // Help took any arguments after it without a word (exit 0), as no other command does.
  for (const char* args : {"-h extra", "--help --name smoke"}) {
    const testing::ToolRun r = run_tool(dir, args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("takes no options"), std::string::npos) << args << "\n" << r.output;
  }
  // A repeated option used to be taken at its first value without a word.
  const testing::ToolRun twice = run_tool(dir, "generate --name smoke --out a --out b");
  EXPECT_EQ(twice.status, 2) << twice.output;
  EXPECT_NE(twice.output.find("--out is given twice"), std::string::npos) << twice.output;
}

// --builtin, a flag, was taken twice without a word (and the builtin case run); it is given once, as
// every option is.
TEST(MokGoldenCli, ARepeatedBuiltinFlagIsAUsageError) {
  TempDir dir("golden-cli-builtin-twice");
  const testing::ToolRun r = run_tool(dir, "check --builtin --builtin");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("mok-golden: --builtin is given twice"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("run 1"), std::string::npos) << r.output;
}

// check --name NAME reads DIR/NAME.h5: a NAME with a path separator or ".." read a golden outside DIR
// (`--name ../x` checked DIR/../x.h5, exit 0), and one of any length was taken. NAME is a case name
// (validate_case_name), refused as a usage error naming --name before any file is read.
TEST(MokGoldenCli, CheckNameMustBeACaseName) {
  TempDir dir("golden-cli-name-outside");
  std::filesystem::create_directory(dir / "data");
  std::filesystem::create_directory(dir / "data" / "sub");
  write_golden(dir / "x.h5", make_case(*find_case("single_token")));  // outside DIR
  write_golden(dir / "data" / "sub" / "x.h5", make_case(*find_case("single_token")));
  const std::string data = (dir / "data").string();
  const std::string no_file = "' is no case name: it names a file, so no '/', '\\' or '..'";
  for (const auto& [name, message] :
       {std::pair<std::string, std::string>{"../x", "mok-golden: --name '../x" + no_file},
        {"sub/x", "mok-golden: --name 'sub/x" + no_file},
        {(dir / "x").string(), "mok-golden: --name '" + (dir / "x").string() + no_file},
        {"'sub\\x'", "mok-golden: --name 'sub\\\\x" + no_file},
        {std::string(kMaxCaseNameBytes + 1, 'a'),
         "mok-golden: --name '" + std::string(32, 'a') + "'... of 129 bytes is no case name: at most 128 bytes"}}) {
    const testing::ToolRun r = run_tool(dir, "check --name " + name + " --dir " + data);
    EXPECT_EQ(r.status, 2) << name << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << name << "\n" << r.output;
    EXPECT_EQ(r.output.find("single_token"), std::string::npos) << name << "\n" << r.output;
  }
}

// A float field or zipf_s written as -0 was stored as -0.0, its bits (and the golden's content hash)
// not 0's: two case files of one layer made two goldens. -0 reads as 0, and the goldens are the same bytes.
TEST(MokGoldenCli, MinusZeroInACaseFileIsZero) {
  TempDir dir("golden-cli-minus-zero");
  const std::string shape = "name = zero\nranks = 1\ntokens_per_rank = 4\nexperts = 2\nrouting = zipf\n";
  std::ofstream(dir / "plus.txt") << shape << "swiglu_limit = 0\nzipf_s = 0\n";
  std::ofstream(dir / "minus.txt") << shape << "swiglu_limit = -0\nzipf_s = -0.0\n";
  for (const std::string sign : {"plus", "minus"}) {
    const testing::ToolRun r = run_tool(
        dir, "generate --config " + (dir / (sign + ".txt")).string() + " --out " + (dir / (sign + ".h5")).string());
    ASSERT_EQ(r.status, 0) << r.output;
  }
  const GoldenCase minus = read_golden(dir / "minus.h5");
  EXPECT_FALSE(std::signbit(minus.config.swiglu_limit));
  ASSERT_TRUE(minus.recipe);
  EXPECT_FALSE(std::signbit(minus.recipe->zipf_s));
  EXPECT_TRUE(testing::read_bytes(dir / "minus.h5") == testing::read_bytes(dir / "plus.h5"))
      << "a case file of -0 made another golden than the same case of 0";
}

// An option where a value should be is a missing value: `--out --name` wrote a golden to a file named
// "--name" (exit 0).
TEST(MokGoldenCli, AnOptionInPlaceOfAValueIsAMissingValue) {
  TempDir dir("golden-cli-optvalue");
  const std::string in_dir = "cd " + dir.path().string() + " && " + MOK_GOLDEN_TOOL;
  const testing::ToolRun r =
      testing::run_tool(in_dir, dir, std::string("generate --config ") + MOK_EXAMPLE_CASE_FILE + " --out --name");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("mok-golden: --out needs a value"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "--name"));
}

// A case file named for a catalogue case but of another config was written, and check then failed the
// golden (exit 1) with advice to regenerate the catalogue's case, which would not fix it.
TEST(MokGoldenCli, GenerateRefusesACaseFileNamedForAnotherCatalogueCase) {
  TempDir dir("golden-cli-catalogue-name");
  const auto generate = [&](const std::string& file) {
    return run_tool(dir, "generate --config " + (dir / file).string() + " --out " + (dir / "out.h5").string());
  };
  std::ofstream(dir / "other.txt") << "name = single_token\nexperts = 2\ntop_k = 1\ntokens_per_rank = 1\n";
  const testing::ToolRun r = generate("other.txt");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("name single_token is a catalogue case's, whose "), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "out.h5"));
}

// A regular file given where a directory belongs is named as one (it was "directory ... does not exist"),
// and generate and check say alike what DIR is (not_a_directory; generate said "directory D does not exist").
TEST(MokGoldenCli, AFileGivenForADirectoryIsNamedAsOne) {
  TempDir dir("golden-cli-filedir");
  const std::string file = (dir / "a_file").string(), absent = (dir / "absent").string();
  std::ofstream(file) << "x";
  for (const auto& [path, what] : {std::pair{file, "is not a directory"}, std::pair{absent, "does not exist"}}) {
    testing::ToolRun r = run_tool(dir, "generate --name single_token --out " + path);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("cannot write " + path + "/single_token.h5: " + path + " " + what), std::string::npos)
        << r.output;
    r = run_tool(dir, "check --dir " + path);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("mok: golden directory " + path + " " + what), std::string::npos) << r.output;
    // The whole catalogue: one error before any case is computed, not one per case.
    r = run_tool(dir, "generate --out " + path);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("mok: golden directory " + path + " " + what), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("ERROR "), std::string::npos) << r.output;
    // check --builtin: the same words, before the case runs (it said "PATH/smoke.h5: no such file").
    r = run_tool(dir, "check --builtin --dir " + path);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("mok: golden directory " + path + " " + what), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("run 1"), std::string::npos) << r.output;
  }
}

// A directory here that exists but cannot be listed, or "" (a directory of mode 000 refuses its owner unless it is
// root; /proc/1/map_files refuses root without CAP_SYS_ADMIN, as on the CI machine).
std::string unlistable_directory(const TempDir& dir) {
  const std::string locked = (dir / "locked").string();
  std::filesystem::create_directory(locked);
  chmod(locked.c_str(), 0);
  for (const std::string& d : {locked, std::string("/proc/1/map_files")}) {
    DIR* listing = opendir(d.c_str());  // map_files opens, and refuses the reads past "." and ".."
    int why = listing ? 0 : errno;
    if (listing) {
      errno = 0;
      while (readdir(listing)) {
      }
      why = errno;
      closedir(listing);
    }
    if (why == EACCES || why == EPERM) return d;
  }
  return "";
}

// check --dir of a directory it cannot list names the directory and why, as mok-verify does (the library's
// filesystem_error escaped bare: "filesystem error: directory iterator cannot open directory: ...").
TEST(MokGoldenCli, CheckNamesADirectoryItCannotList) {
  TempDir dir("golden-cli-unlistable");
  const std::string locked = unlistable_directory(dir);
  if (locked.empty()) GTEST_SKIP() << "no directory here refuses its listing";
  const testing::ToolRun r = run_tool(dir, "check --dir " + locked);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("mok: cannot list directory " + locked + ": "), std::string::npos) << r.output;
  chmod((dir / "locked").c_str(), 0700);  // for TempDir's removal
}

// An output AtomicFile would refuse is refused before the case is computed: this case takes about half a
// minute on two cores, and generate used to compute it whole before finding that --out's directory
// does not exist, that --out is a directory, or that its directory takes no file (/proc: the temporary
// could not be made).
TEST(MokGoldenCli, AnUnwritableOutIsRefusedBeforeTheCaseIsComputed) {
  TempDir dir("golden-cli-out-first");
  std::ofstream(dir / "slow.txt")
      << "name = slow\nranks = 1\ntokens_per_rank = 1024\nexperts = 8\nhidden = 1024\nintermediate = 1024\n";
  std::filesystem::create_directory(dir / "a_dir.h5");
  const std::string absent = (dir / "absent").string(), a_dir = (dir / "a_dir.h5").string();
  for (const auto& [out, why] :
       {std::pair{absent + "/slow.h5", absent + " does not exist"},
        std::pair{a_dir, std::string("it is a directory, not a regular file")},
        std::pair{std::string("/proc/slow.h5"), std::string("cannot make a file in /proc: ")}}) {
    const testing::ToolRun r = run_tool(dir, "generate --config " + (dir / "slow.txt").string() + " --out " + out, 10);
    EXPECT_EQ(r.status, 2) << out << "\n" << r.output;
    EXPECT_NE(r.output.find("mok: cannot write " + out + ": " + why), std::string::npos) << r.output;
  }
}

// File names were printed raw: one holding a newline forged a line of the report ("ok    ..."), a
// control byte reached the terminal. Names that are not plain printable ASCII are quoted and escaped.
TEST(MokGoldenCli, FileNamesAreQuotedAndEscaped) {
  TempDir dir("golden-cli-quoted");
  const std::string evil = "x\nok    forged 'q'\x1b[2J.h5";
  testing::write_bytes(dir / evil, {'n', 'o', 't'});
  testing::ToolRun r = run_tool(dir, "check --dir " + dir.path().string());
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("ERROR 'x\\x0aok    forged \\'q\\'\\x1b[2J.h5': mok: golden file " +
                          display_name((dir / evil).string()) + ": "),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("\nok    forged"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find('\x1b'), std::string::npos) << r.output;
  const std::filesystem::path out = dir / "out\nok    forged";
  std::filesystem::create_directory(out);
  r = run_tool(dir,
               "generate --name single_token --out \"$(printf '" + dir.path().string() + "/out\\nok    forged')\"");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("single_token: " + display_name((out / "single_token.h5").string()) + ", "),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("\nok    forged"), std::string::npos) << r.output;
}

// A report or list lost to a full disk (here /dev/full) is no success: list and check exited 0.
TEST(MokGoldenCli, AnUnwritableStandardOutputExitsTwo) {
  TempDir dir("golden-cli-full");
  std::filesystem::create_directory(dir / "data");
  write_golden(dir / "data" / "single_token.h5", make_case(*find_case("single_token")));
  for (const std::string& args :
       {std::string("list"), std::string("--help"), "check --name single_token --dir " + (dir / "data").string()}) {
    testing::ToolRun r = testing::run_tool_with_stdout(MOK_GOLDEN_TOOL, dir, args, "/dev/full");
    EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("mok-golden: cannot write to standard output"), std::string::npos) << r.output;
    r = testing::run_tool_with_stdout(MOK_GOLDEN_TOOL, dir, args, "/dev/null");
    EXPECT_EQ(r.status, 0) << args << "\n" << r.output;
  }
}

}  // namespace
}  // namespace mok::golden
