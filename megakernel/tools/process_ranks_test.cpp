// The process machinery of the tools (mok/tools/process_ranks.h) without a GPU: ranks that write their
// results, a failing rank that ends the others at once, the timeout, and result files never read in part.
#include "mok/tools/process_ranks.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace mok::tools {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

void sleep_long() { std::this_thread::sleep_for(std::chrono::seconds(60)); }

TEST(ProcessRanks, EveryRankWritesItsResultFile) {
  const TempDir dir("process-ranks-test");
  const auto body = [](const Rank& r) {
    Forward f;
    f.y = {bf16{uint16_t(r.index)}, bf16{uint16_t(r.count)}};
    ResultWriter file(r.result);
    file.put(int32_t(r.index * 10));
    file.put_fields(f);
    file.commit();
  };
  ASSERT_TRUE(run_ranks("process-ranks-test", 3, 30, dir.path(), body));
  for (int g = 0; g < 3; ++g) {
    ResultReader file(result_path(dir.path(), g));
    int32_t value = 0;
    file.get(value);
    Forward f;
    file.get_fields(f);
    EXPECT_EQ(value, g * 10);
    ASSERT_EQ(f.y.size(), 2u);
    EXPECT_EQ(f.y[0].bits, g);
    EXPECT_EQ(f.y[1].bits, 3);
    EXPECT_TRUE(f.routing.topk_idx.empty());
  }
}

TEST(ProcessRanks, AFailingRankKillsTheOthersAtOnce) {
  const TempDir dir("process-ranks-test");
  const auto start = Clock::now();
  const auto body = [](const Rank& r) {
    if (r.index == 1) throw Error("planted failure");
    sleep_long();  // a peer waiting for the failed rank
  };
  testing::internal::CaptureStderr();
  EXPECT_FALSE(run_ranks("process-ranks-test", 3, 120, dir.path(), body));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_LT(seconds_since(start), 20);
  EXPECT_NE(err.find("process-ranks-test: rank 1 (GPU 1): planted failure"), std::string::npos) << err;
  EXPECT_NE(err.find("process-ranks-test: rank 1 exited with code 1; killing the other ranks"), std::string::npos)
      << err;
}

TEST(ProcessRanks, TheTimeoutKillsRanksThatHang) {
  const TempDir dir("process-ranks-test");
  const auto start = Clock::now();
  testing::internal::CaptureStderr();
  EXPECT_FALSE(run_ranks("process-ranks-test", 2, 0.5, dir.path(), [](const Rank&) { sleep_long(); }));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_LT(seconds_since(start), 20);
  EXPECT_NE(err.find("ran past the timeout of 0.5 s; killing ranks 0 1 (still running)"), std::string::npos) << err;
}

TEST(ProcessRanks, AResultFileIsNeverReadInPart) {
  const TempDir dir("process-ranks-test");
  const std::filesystem::path path = result_path(dir.path(), 0);
  {
    ResultWriter file(path);
    file.put(int32_t(7));  // no commit: as a rank that failed while writing
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fputs("not a result", f);
    std::fclose(f);
  }
  EXPECT_THROW(ResultReader{path}, Error);
  ResultWriter file(path);
  file.put(uint64_t(1) << 40);  // a field's element count larger than the file
  file.commit();
  ResultReader reader(path);
  Forward f;
  EXPECT_THROW(reader.get_fields(f), Error);
}

TEST(ProcessRanks, TheTemporaryDirectoryIsRemoved) {
  std::filesystem::path path;
  {
    const TempDir dir("process-ranks-test");
    path = dir.path();
    ResultWriter file(result_path(path, 0));
    file.commit();
    EXPECT_TRUE(std::filesystem::exists(result_path(path, 0)));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace mok::tools
