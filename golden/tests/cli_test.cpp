// mok-golden as CI runs it: exit status 0 / 1 / 2 and the first differing element named.
#include <gtest/gtest.h>

#include "mok/golden/catalogue.h"
#include "mok/golden/golden.h"
#include "test_files.h"

namespace mok::golden {
namespace {

using testing::TempDir;

testing::ToolRun run_tool(const TempDir& dir, const std::string& args) {
  return testing::run_tool(MOK_GOLDEN_TOOL, dir, args);
}

TEST(MokGoldenCli, CheckPassesOnFreshGoldens) {
  TempDir dir("golden-cli-ok");
  std::filesystem::create_directory(dir / "data");
  write_golden(dir / "data" / "single_token.h5", make_case(*find_case("single_token")));
  const testing::ToolRun r = run_tool(dir, "check --name single_token --dir " + (dir / "data").string());
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("ok    single_token"), std::string::npos) << r.output;
}

TEST(MokGoldenCli, CheckNamesTheFirstDifferingElement) {
  TempDir dir("golden-cli-diff");
  std::filesystem::create_directory(dir / "data");
  GoldenCase g = make_case(*find_case("single_token"));
  Tensor& y = g.results.outputs.front();
  ASSERT_EQ(y.name, "y");
  y.bytes[2 * 70] ^= 1;  // element 70 = y[1, 6]: rank 1, token 0
  write_golden(dir / "data" / "single_token.h5", g);
  const testing::ToolRun r = run_tool(dir, "check --name single_token --dir " + (dir / "data").string());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("first difference y[1, 6] (rank 1, token 0 (global 1), column 6): golden 0x"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("FAIL  single_token: 1 tensors differ"), std::string::npos) << r.output;
}

TEST(MokGoldenCli, CheckFailsAGoldenTheCatalogueNoLongerDescribes) {
  TempDir dir("golden-cli-stale");
  CaseSpec spec = *find_case("single_token");
  spec.recipe.seed += 1;
  write_golden(dir / "single_token.h5", make_case(spec));
  const testing::ToolRun r = run_tool(dir, "check --name single_token --dir " + dir.path().string());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("FAIL  single_token: the catalogue's seed differs from the committed golden's"),
            std::string::npos)
      << r.output;
}

TEST(MokGoldenCli, CheckReportsAMissingCatalogueGoldenAndACorruptFile) {
  TempDir dir("golden-cli-bad");
  testing::write_bytes(dir / "broken.h5", {'n', 'o', 't', ' ', 'h', 'd', 'f'});
  const testing::ToolRun r = run_tool(dir, "check --dir " + dir.path().string());
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("ERROR broken.h5: mok: golden file"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ERROR smoke: catalogue case has no golden"), std::string::npos) << r.output;
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

TEST(MokGoldenCli, UsageErrorsExitTwo) {
  TempDir dir("golden-cli-usage");
  for (const char* args : {"", "frobnicate", "generate", "check --bogus 1", "generate --out . --name nothing"}) {
    const testing::ToolRun r = run_tool(dir, args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
  }
}

}  // namespace
}  // namespace mok::golden
