// mok-verify's run over goldens (verify_goldens) with a backend of the test's own, since neither real
// backend throws at will: a run whose every golden is skipped compared nothing and fails, as an empty
// directory does; any exception while processing one golden is that golden's error, the goldens after it
// still run and the JSON report is complete.
#include "mok/verify/run.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "mok/golden/catalogue.h"
#include "mok/golden/golden.h"
#include "test_files.h"

namespace mok::verify {
namespace {

using golden::testing::TempDir;

// Before its n-th run, runs the n-th step (which may throw); then returns the reference's run.
class ScriptedBackend : public Backend {
 public:
  explicit ScriptedBackend(std::vector<std::function<void()>> steps) : steps_(std::move(steps)) {}
  std::string name() const override { return "scripted"; }
  RunResults run(const golden::GoldenCase& g) override {
    if (runs_ < steps_.size()) steps_[runs_++]();
    return reference_->run(g);
  }

 private:
  std::vector<std::function<void()>> steps_;
  size_t runs_ = 0;
  std::unique_ptr<Backend> reference_ = make_reference_backend({});
};

struct Outcome {
  int status;
  std::string out, err, json;
};

class VerifyRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { smoke_ = new golden::GoldenCase(golden::make_case(golden::builtin_case())); }
  static void TearDownTestSuite() { delete smoke_; }

  // `count` copies of the smoke golden, a.h5, b.h5, ... in the directory the run is given.
  void write_goldens(int count) {
    std::filesystem::create_directory(goldens());
    for (int i = 0; i < count; ++i) golden::write_golden(file(i), *smoke_);
  }

  std::filesystem::path goldens() const { return dir_ / "goldens"; }
  std::string file(int i) const { return (goldens() / (std::string(1, char('a' + i)) + ".h5")).string(); }

  Outcome verify(Backend& backend) {
    VerifyRequest request;
    request.goldens = {goldens()};
    request.json = (dir_ / "report.json").string();
    request.quiet = true;
    std::ostringstream out, err;
    const int status = verify_goldens(request, &backend, out, err);
    return {status, out.str(), err.str(), golden::testing::read_text(request.json)};
  }

  static golden::GoldenCase* smoke_;
  TempDir dir_{"verify-run"};
};

golden::GoldenCase* VerifyRun::smoke_ = nullptr;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

void unsupported() { throw Unsupported("mok: this backend does not run this config"); }

// Every golden SKIPPED used to exit 0 and say nothing: a verification that compared nothing passed.
TEST_F(VerifyRun, EveryGoldenSkippedComparedNothingAndFails) {
  write_goldens(2);
  ScriptedBackend backend({unsupported, unsupported});
  const Outcome r = verify(backend);
  EXPECT_EQ(r.status, kExitError) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "SKIPPED  " + file(0) + ": mok: this backend does not run this config")) << r.out;
  EXPECT_TRUE(contains(r.out, "SKIPPED  " + file(1) + ": ")) << r.out;
  EXPECT_TRUE(contains(r.err, "mok-verify: mok: nothing compared: the backend skipped every golden (2, SKIPPED above)"))
      << r.err;
  EXPECT_TRUE(contains(r.json, "\"all_equal\": false")) << r.json;
  EXPECT_TRUE(contains(r.json, "\"errors\": [\"mok: nothing compared: ")) << r.json;
  EXPECT_TRUE(contains(r.json, "\"skipped\": [\"" + file(0) + ": mok: this backend does not run this config\""))
      << r.json;
  EXPECT_TRUE(contains(r.json, "\"cases\": []")) << r.json;
}

// A skip beside a golden that was compared changes no exit status, as documented.
TEST_F(VerifyRun, ASkipBesideAComparedGoldenChangesNoStatus) {
  write_goldens(2);
  ScriptedBackend backend({unsupported});
  const Outcome r = verify(backend);
  EXPECT_EQ(r.status, kExitEqual) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "SKIPPED  " + file(0) + ": ")) << r.out;
  EXPECT_TRUE(contains(r.out, "EQUAL    smoke")) << r.out;
  EXPECT_TRUE(contains(r.json, "\"all_equal\": true")) << r.json;
}

// A std::runtime_error, std::bad_alloc or std::filesystem_error (no mok::Error) from one golden's
// processing ended the loop: the goldens after it went unverified and no JSON report was written.
TEST_F(VerifyRun, AnyExceptionIsItsGoldensErrorAndTheRestRun) {
  write_goldens(4);
  ScriptedBackend backend({[] { throw std::runtime_error("boom"); }, [] { throw std::bad_alloc(); },
                           [] {
                             throw std::filesystem::filesystem_error(
                                 "cannot stat", std::make_error_code(std::errc::no_such_file_or_directory));
                           }});
  const Outcome r = verify(backend);
  EXPECT_EQ(r.status, kExitError) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "mok-verify: " + file(0) + ": boom")) << r.err;
  EXPECT_TRUE(contains(r.err, "mok-verify: " + file(1) + ": std::bad_alloc")) << r.err;
  EXPECT_TRUE(contains(r.err, "mok-verify: " + file(2) + ": filesystem error: cannot stat")) << r.err;
  EXPECT_TRUE(contains(r.out, "golden " + file(3) + " (smoke) against scripted")) << r.out;
  EXPECT_TRUE(contains(r.out, "EQUAL    smoke")) << r.out;
  EXPECT_TRUE(contains(r.json, "\"errors\": [\"" + file(0) + ": boom\", \"" + file(1) + ": std::bad_alloc\", \"" +
                                   file(2) + ": filesystem error: cannot stat"))
      << r.json;
  EXPECT_TRUE(contains(r.json, "\"cases\": [\n    {\"golden\": \"" + file(3) + "\"")) << r.json;
  EXPECT_TRUE(contains(r.json, "\"all_equal\": false")) << r.json;
}

}  // namespace
}  // namespace mok::verify
