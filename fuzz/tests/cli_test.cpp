// mok-fuzz's command line (issue 16): values parse strictly, an empty value is no value, and a time
// budget holds and is reported with the cases that ran.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "tool_run.h"

namespace {

using mok::test::ToolRun;

// mok-fuzz with `args`, killed after 120 s (status 124): a flag that starts a whole campaign fails fast.
ToolRun run_fuzz(const std::string& args) { return mok::test::run_tool_command(MOK_FUZZ_TOOL, args, 120); }

// Each used to be accepted: "" as --replay started a fuzz campaign, -1 became 2^64 - 1. (--list makes
// an accepted command line exit 0 at once.)
TEST(MokFuzzCli, BadValuesExitTwoNamingThem) {
  const struct {
    const char* args;
    const char* message;
  } cases[] = {
      {"--replay '' --list", "'--replay' needs a value, not an empty string"},
      {"--seed -1 --list", "--seed needs an unsigned 64-bit integer, not '-1'"},
      {"--seed ' 1' --list", "--seed needs an unsigned 64-bit integer, not ' 1'"},
      {"--seed +1 --list", "--seed needs an unsigned 64-bit integer, not '+1'"},
      {"--seed 18446744073709551616 --list", "not '18446744073709551616'"},
      {"--cases -5 --list", "--cases needs a positive integer, not '-5'"},
      {"--cases 5x --list", "--cases needs a positive integer, not '5x'"},
      {"--seconds 1e3 --list", "--seconds needs a positive integer, not '1e3'"},
      {"--seconds 99999999999 --list", "--seconds is at most 1000000000"},
      {"--backend '' --list", "'--backend' needs a value"},
      // an option taken for the value: a whole campaign ran into a directory named "--list"
      {"--property repeat --cases 2 --repro-dir --list", "'--repro-dir' needs a value, not the option '--list'"},
      {"--replay --list", "'--replay' needs a value, not the option '--list'"},
      {"--backend bogus --list", "unknown backend 'bogus' (reference or gpu)"},
      {"--bogus 1", "unknown flag '--bogus'"},
      {"--cases 5 --seconds 5 --list", "--cases and --seconds exclude each other"},
      {"--replay x.h5 --seed 3", "--seed, --cases, --seconds, --property and --repro-dir do not apply"},
      {"--replay x.h5 --property repeat", "--seed, --cases, --seconds, --property and --repro-dir do not apply"},
      {"--replay x.h5 --repro-dir d", "--seed, --cases, --seconds, --property and --repro-dir do not apply"},
      {"--replay x.h5 --cases 0", "--seed, --cases, --seconds, --property and --repro-dir do not apply"},
      {"--seed 1 --seed 2 --list", "'--seed' is given twice"},
      {"--property repeat --property repeat --list", "'--property repeat' is given twice"},
      {"--list --list", "'--list' is given twice"},
      {"\"$(printf -- '--\\001')\" 1", "unknown flag '--\\x01'"},
  };
  for (const auto& c : cases) {
    const ToolRun r = run_fuzz(c.args);
    EXPECT_EQ(r.status, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
  EXPECT_EQ(run_fuzz("--seed 18446744073709551615 --list").status, 0);
}

// The budget holds (it used to be checked only between rounds of four cases per property, and a run
// of --seconds 30 took 212 s under sanitizers) and the totals say how many cases ran. Two quick properties,
// as each runs its first case whole, past its share (1 s) if need be.
TEST(MokFuzzCli, SecondsBoundTheRunAndTheCasesAreReported) {
  const auto start = std::chrono::steady_clock::now();
  const ToolRun r =
      run_fuzz("--seed 1 --seconds 2 --property repeat --property topk --repro-dir " + ::testing::TempDir());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_LT(seconds, 2.0 + 10.0) << r.output;  // one layer run past the deadline, however slow the build
  EXPECT_NE(r.output.find(" cases in "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(budget 2 s)"), std::string::npos) << r.output;
}

// A repro of a failure that was the layer throwing replays as FAIL, exit 1, as the campaign counted it
// (it used to escape --replay as an unreadable repro: exit 2, no verdict).
TEST(MokFuzzCli, ReplayOfAnExceptionIsAFailure) {
  const std::string dir = ::testing::TempDir() + "mok_fuzz_cli_exception";
  const ToolRun found = run_fuzz("--seed 1 --property repeat --inject layout_off_by_one --cases 20 --repro-dir " + dir);
  ASSERT_EQ(found.status, 1) << found.output;
  ASSERT_NE(found.output.find("failure: unexpected exception: "), std::string::npos) << found.output;
  const ToolRun replayed = run_fuzz("--replay " + dir + "/mok-fuzz-repeat-seed1-layout_off_by_one.h5");
  EXPECT_EQ(replayed.status, 1) << replayed.output;
  EXPECT_NE(replayed.output.find("FAIL repeat: unexpected exception: "), std::string::npos) << replayed.output;
}

// File names reach the output through display_name: a space in --repro-dir used to split the printed
// replay command, a newline to forge a line.
TEST(MokFuzzCli, FileNamesInTheOutputAreQuoted) {
  const std::string dir = ::testing::TempDir() + "mok_fuzz_cli repros\nx";  // '...' below keeps it one word
  const std::string file = dir + "/mok-fuzz-router_backward-seed1-router_grad_sign.h5";
  const ToolRun found =
      run_fuzz("--seed 1 --property router_backward --inject router_grad_sign --cases 20 --repro-dir '" + dir + "'");
  ASSERT_EQ(found.status, 1) << found.output;
  std::string quoted(1, '\'');  // appended: GCC 12 warns (-Wrestrict) on "'" + ...
  quoted += ::testing::TempDir() + "mok_fuzz_cli repros\\x0ax/mok-fuzz-router_backward-seed1-router_grad_sign.h5'";
  EXPECT_NE(found.output.find("repro: " + quoted + "\n"), std::string::npos) << found.output;
  EXPECT_NE(found.output.find(" --replay " + quoted + "\n"), std::string::npos) << found.output;
  EXPECT_EQ(found.output.find("repros\n"), std::string::npos) << found.output;
  const ToolRun replayed = run_fuzz("--replay '" + file + "'");
  EXPECT_EQ(replayed.status, 1) << replayed.output;
  EXPECT_NE(replayed.output.find("mok-fuzz: replaying " + quoted + " on reference\n"), std::string::npos)
      << replayed.output;
}

// A --repro-dir that names a file (or lies under one) was accepted, and failed only when a failure's
// repro was due, after the campaign: refused before any case runs.
TEST(MokFuzzCli, AReproDirThatCannotBeADirectoryIsRefused) {
  const std::string file = ::testing::TempDir() + "mok_fuzz_cli_not_a_dir";
  std::FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  const std::string dangling = ::testing::TempDir() + "mok_fuzz_cli_dangling";
  std::remove(dangling.c_str());
  ASSERT_EQ(symlink((::testing::TempDir() + "mok_fuzz_cli_nothing_here").c_str(), dangling.c_str()), 0);
  const struct {
    std::string dir, message;
  } cases[] = {
      {file, "mok-fuzz: --repro-dir " + file + " is not a directory"},
      {file + "/repros", "mok-fuzz: --repro-dir " + file + "/repros cannot be made: " + file + " is not a directory"},
      // a dangling link: it was said not to exist, as if it would be made
      {dangling, "mok-fuzz: --repro-dir " + dangling + " is a symbolic link to nothing (it dangles)"},
      {dangling + "/repros", "mok-fuzz: --repro-dir " + dangling + "/repros cannot be made: " + dangling +
                                 " is a symbolic link to nothing (it dangles)"},
  };
  for (const auto& c : cases) {
    const ToolRun r = run_fuzz("--seed 1 --property topk --cases 1 --repro-dir " + c.dir);
    EXPECT_EQ(r.status, 2) << c.dir << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find(" cases in "), std::string::npos) << r.output;  // before the campaign
  }
  // A directory that takes no file (here under /proc): the campaign ran, shrank its failure and exited 1, its
  // repro "not written"; refused before any case runs.
  const ToolRun proc = run_fuzz("--seed 1 --property topk --cases 1 --repro-dir /proc/mok_fuzz_cli_repros");
  EXPECT_EQ(proc.status, 2) << proc.output;
  EXPECT_NE(proc.output.find("mok-fuzz: --repro-dir /proc/mok_fuzz_cli_repros takes no file: "), std::string::npos)
      << proc.output;
  EXPECT_EQ(proc.output.find(" cases in "), std::string::npos) << proc.output;
  // A directory still to be made, parents and all, is accepted as before.
  EXPECT_EQ(run_fuzz("--seed 1 --property topk --cases 1 --repro-dir " + ::testing::TempDir() + "mok_fuzz_cli_new/a/b")
                .status,
            0);
}

// Output that cannot be written (a full disk, here /dev/full) is no success: it used to exit 0.
TEST(MokFuzzCli, UnwritableOutputExitsTwo) {
  EXPECT_EQ(run_fuzz("--list >/dev/full").status, 2);
  EXPECT_EQ(run_fuzz("--seed 1 --property topk --cases 1 >/dev/full").status, 2);
  EXPECT_EQ(run_fuzz("--seed 1 --property topk --cases 1 >/dev/null").status, 0);
}

}  // namespace
