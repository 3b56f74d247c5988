#include "mok/fuzz/driver.h"

#include <rapidcheck.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <ostream>
#include <sstream>

#include "mok/fuzz/generators.h"
#include "mok/fuzz/properties.h"
#include "mok/fuzz/repro.h"

namespace mok::fuzz {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kRoundCases = 4;            // cases per rapidcheck run: the unit between time checks
constexpr double kProgressSeconds = 5.0;  // between progress lines

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// Counts the cases rapidcheck runs (shrink attempts apart) and prints progress now and then.
class Progress final : public rc::detail::TestListener {
 public:
  Progress(const std::string& property, const int& failures, std::ostream& log)
      : property_(property),
        failures_(failures),
        log_(log),
        start_(Clock::now()),
        last_case_(start_),
        last_print_(start_) {}

  void onTestCaseFinished(const rc::detail::CaseDescription&) override {
    ++cases_;
    last_case_ = Clock::now();
    if (seconds_between(last_print_, last_case_) >= kProgressSeconds) {
      print();
      last_print_ = last_case_;
    }
  }
  void onShrinkTried(const rc::detail::CaseDescription&, bool accepted) override { shrinks_ += accepted; }
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}

  void print() const {
    char line[256];
    std::snprintf(line, sizeof line, "mok-fuzz: %-16s %6ld cases, %7.1f cases/s, %d failures\n", property_.c_str(),
                  cases_, cases_ / std::max(seconds(), 1e-9), failures_);
    log_ << line << std::flush;
  }

  long cases() const { return cases_; }
  int shrinks() const { return shrinks_; }
  double seconds() const { return seconds_between(start_, last_case_); }  // to the last case's end
  double elapsed() const { return seconds_between(start_, Clock::now()); }

 private:
  std::string property_;
  const int& failures_;
  std::ostream& log_;
  Clock::time_point start_, last_case_, last_print_;
  long cases_ = 0;
  int shrinks_ = 0;
};

std::string rerun_command(const FuzzOptions& o, const std::string& backend, const std::string& property, long cases) {
  std::string cmd =
      o.program + " --seed " + std::to_string(o.seed) + " --property " + property + " --cases " + std::to_string(cases);
  if (backend != "reference") cmd += " --backend " + backend;
  if (o.fault != ref::Fault::none) cmd += " --inject " + to_string(o.fault);
  return cmd;
}

}  // namespace

std::vector<PropertyReport> run_fuzz(Backend& backend, const FuzzOptions& o, std::ostream& log) {
  std::vector<const Property*> selected;
  for (const std::string& name : o.properties) selected.push_back(&find_property(name));
  if (o.properties.empty())
    for (const Property& p : all_properties()) selected.push_back(&p);
  const double budget = o.seconds / selected.size();
  std::vector<PropertyReport> reports;
  int failures = 0;
  for (const Property* prop : selected) {
    PropertyReport report;
    report.property = prop->name;
    std::optional<FuzzCase> failing;  // the last failing case: after shrinking, the minimal one
    const rc::detail::Property property = rc::detail::toProperty([&] {
      FuzzCase fc = *gen_fuzz_case();
      fc.params.options.fault = o.fault;
      if (const auto step = backend.fixed_step()) fc.params.options.step = *step;
      Verdict v;
      try {
        v = prop->check(backend, make_problem(fc), fc.params);
      } catch (const std::exception& e) {
        v = std::string("unexpected exception: ") + e.what();
      }
      if (v) {
        failing = fc;
        report.failure = *v;
        RC_FAIL(*v);
      }
    });
    rc::detail::TestMetadata metadata;
    metadata.id = metadata.description = prop->name;
    ref::Rng round_seeds(o.seed ^ fnv1a(prop->name));
    Progress progress(prop->name, failures, log);
    while (o.cases > 0 ? progress.cases() < o.cases : progress.elapsed() < budget) {
      rc::detail::TestParams params;
      params.seed = round_seeds.next();
      params.maxSuccess = int(o.cases > 0 ? std::min<long>(kRoundCases, o.cases - progress.cases()) : kRoundCases);
      // An empty reproduce map keeps rapidcheck's global configuration (RC_PARAMS, its own seed) out.
      const rc::detail::TestResult result = rc::detail::checkProperty(property, metadata, params, progress, {});
      if (result.is<rc::detail::SuccessResult>()) continue;
      report.failed = true;
      if (!failing) {  // rapidcheck itself failed (a generator error): no case to keep
        std::ostringstream what;
        rc::detail::printResultMessage(result, what);
        report.failure = what.str();
        break;
      }
      report.counterexample = describe(*failing);
      break;
    }
    report.cases = progress.cases();
    report.seconds = progress.seconds();
    report.shrink_steps = progress.shrinks();
    if (report.failed) {
      ++failures;
      log << "mok-fuzz: FAIL " << prop->name << " at case " << report.cases << " (" << report.shrink_steps
          << " shrink steps)\n  failure: " << report.failure << "\n  case: " << report.counterexample << "\n";
      if (failing) {
        std::string name = "mok-fuzz-" + prop->name + "-seed" + std::to_string(o.seed);
        if (o.fault != ref::Fault::none) name += '-' + to_string(o.fault);
        const std::filesystem::path file = std::filesystem::absolute(o.repro_dir / (name + ".h5")).lexically_normal();
        try {
          std::filesystem::create_directories(file.parent_path());
          write_repro(file, prop->name, *failing, report.failure);
          report.repro = file;
          report.replay_command = o.program + " --replay " + file.string();
          if (backend.name() != "reference") report.replay_command += " --backend " + backend.name();
          log << "  repro: " << file.string() << "\n  replay: " << report.replay_command << "\n";
        } catch (const std::exception& e) {
          log << "  repro not written: " << e.what() << "\n";
        }
      }
      log << "  rerun: " << rerun_command(o, backend.name(), prop->name, report.cases) << "\n";
    }
    progress.print();
    reports.push_back(report);
  }
  return reports;
}

}  // namespace mok::fuzz
