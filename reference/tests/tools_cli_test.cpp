// The reference's tools on the command line: mok-reference-timing's sizes parse strictly (atoi took "2x" and
// "1e3" for 2 and 1 and ran that size); --help is help, exit 0, and mok_oracle_errors starts no run on an argument.
#include <gtest/gtest.h>

#include <string>

#include "mok/core/validate.h"
#include "tool_run.h"

namespace {

using mok::test::ToolRun;

ToolRun run_tool(const std::string& tool, const std::string& args) {
  return mok::test::run_tool_command(tool, args, 60);
}

ToolRun run_timing(const std::string& args) { return run_tool(MOK_REFERENCE_TIMING_TOOL, args); }

TEST(MokReferenceTimingCli, SizesParseStrictly) {
  const struct {
    const char* args;
    const char* message;
  } cases[] = {
      {"1x 16 64 64 4 2", "argument 1, '1x', is not a decimal integer"},
      {"1 1e3 64 64 4 2", "argument 2, '1e3', is not a decimal integer"},
      {"1 0x10 64 64 4 2", "argument 2, '0x10', is not a decimal integer"},
      {"1 16 ' 64' 64 4 2", "argument 3, ' 64', is not a decimal integer"},
      {"1 16 64 64 4 ''", "argument 6, '', is not a decimal integer"},
      // atoi wrapped it to 1215752191 tokens, and the message named that size
      {"1 99999999999 64 64 4 2", "argument 2, '99999999999', is not a decimal integer"},
  };
  for (const auto& c : cases) {
    const ToolRun r = run_timing(c.args);
    EXPECT_EQ(r.status, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_EQ(r.output.find("forward"), std::string::npos) << c.args << "\n" << r.output;  // nothing ran
  }
  const ToolRun ok = run_timing("1 16 64 64 4 2");
  EXPECT_EQ(ok.status, 0) << ok.output;
  EXPECT_NE(ok.output.find("R=1 T=16 H=64 I=64 E=4 k=2"), std::string::npos) << ok.output;
}

// Its timings written to a full disk were a success (exit 0); the others' tools say so and exit 2.
TEST(MokReferenceTimingCli, AnUnwritableStandardOutputExitsTwo) {
  for (const char* args : {"--help", "1 16 64 64 4 2"}) {
    const std::string to_full = "sh -c 'exec \"$0\" \"$@\" >/dev/full' " + std::string(MOK_REFERENCE_TIMING_TOOL);
    const ToolRun r = run_tool(to_full, args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("mok-reference-timing: cannot write to standard output"), std::string::npos) << r.output;
  }
}

// Sizes past the memory said only "std::bad_alloc". (1.7 GB of tensors: within the memory check, 1.5 times that,
// of a machine of 3 GB or more; past the 1 GB the limit leaves, so the first tensors do not fit and it fails in a
// second, not after minutes of the reference under a loaded CI.)
TEST(MokReferenceTimingCli, OutOfMemoryNamesTheToolAndTheSizes) {
  if (mok::memory_limit_bytes() < 3e9) GTEST_SKIP() << "the memory check refuses the case here: it needs 3 GB";
  const std::string limited =
      "sh -c 'ulimit -v 1000000 && exec \"$0\" \"$@\"' " + std::string(MOK_REFERENCE_TIMING_TOOL);
  const ToolRun r = run_tool(limited, "1 2000000 64 64 1 1");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("mok-reference-timing: out of memory for R=1 T=2000000 H=64 I=64 E=1 k=1"), std::string::npos)
      << r.output;
}

// --help printed the usage as an error (exit 2); mok_oracle_errors ignored every argument and started its
// run of minutes (here the 60 s timeout would end it: exit 124).
TEST(MokReferenceToolsCli, HelpIsHelpAndArgumentsStartNoRun) {
  for (const char* help : {"-h", "--help"}) {
    for (const char* tool : {MOK_REFERENCE_TIMING_TOOL, MOK_ORACLE_ERRORS_TOOL}) {
      const ToolRun r = run_tool(tool, help);
      EXPECT_EQ(r.status, 0) << tool << " " << help << "\n" << r.output;
      EXPECT_EQ(r.output.rfind("usage: ", 0), 0u) << r.output;
    }
  }
  const ToolRun r = run_tool(MOK_ORACLE_ERRORS_TOOL, "--bogus");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_EQ(r.output.rfind("usage: mok_oracle_errors", 0), 0u) << r.output;
}

}  // namespace
