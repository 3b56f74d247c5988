#include "mok/fuzz/driver.h"

#include <rapidcheck.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <new>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>

#include "mok/core/config.h"
#include "mok/core/fnv1a.h"
#include "mok/fuzz/generators.h"
#include "mok/fuzz/properties.h"
#include "mok/fuzz/repro.h"

namespace mok::fuzz {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kRoundCases = 4;  // cases per rapidcheck run (a seed's cases do not depend on time)
constexpr const char* kTimeUp = "the time budget is spent";
constexpr const char* kOutOfMemory = "out of memory";

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Thrown by DeadlineBackend once its deadline has passed. Not a std::exception, so that no property
// takes it for the layer's own answer (the properties and run_check catch mok::Error and std::exception).
struct TimeUp {};

// The backend, stopped at a deadline: every forward and backward first looks at the clock, so that a
// property that runs the layer several times per case stops within one layer run of the deadline.
class DeadlineBackend final : public Backend {
 public:
  explicit DeadlineBackend(Backend& inner) : inner_(inner) {}

  void set_deadline(std::optional<Clock::time_point> deadline) { deadline_ = deadline; }
  bool passed() const { return deadline_ && Clock::now() >= *deadline_; }

  std::string name() const override { return inner_.name(); }
  std::optional<StepModel> fixed_step() const override { return inner_.fixed_step(); }
  ref::Forward forward(const LayerConfig& c, const std::vector<bf16>& x, const ref::LayerWeights& w,
                       const ref::Routing* given, const ref::Options& opt) override {
    stop_if_passed();
    return inner_.forward(c, x, w, given, opt);
  }
  ref::Gradients backward(const LayerConfig& c, const std::vector<bf16>& x, const ref::LayerWeights& w,
                          const ref::Forward& fwd, const std::vector<bf16>& dy, const ref::Options& opt) override {
    stop_if_passed();
    return inner_.backward(c, x, w, fwd, dy, opt);
  }

 private:
  void stop_if_passed() const {
    if (passed()) throw TimeUp{};
  }

  Backend& inner_;
  std::optional<Clock::time_point> deadline_;
};

// Counts the cases rapidcheck runs (shrink attempts and cases cut off by the deadline apart) and prints
// progress now and then, while a failure shrinks too (that can take longer than the search).
class Progress final : public rc::detail::TestListener {
 public:
  Progress(const std::string& property, const int& failures, double interval, std::ostream& log)
      : property_(property),
        failures_(failures),
        interval_(interval),
        log_(log),
        start_(Clock::now()),
        last_case_(start_),
        last_print_(start_) {}

  void onTestCaseFinished(const rc::detail::CaseDescription& description) override {
    if (description.result.type == rc::detail::CaseResult::Type::Discard) return;
    ++cases_;
    last_case_ = Clock::now();
    if (seconds_between(last_print_, last_case_) >= interval_) {
      print();
      last_print_ = last_case_;
    }
  }
  void onShrinkTried(const rc::detail::CaseDescription&, bool accepted) override {
    shrinks_ += accepted;
    ++shrink_tries_;
    const Clock::time_point now = Clock::now();
    if (seconds_between(last_print_, now) >= interval_) {
      char line[256];
      std::snprintf(line, sizeof line, "mok-fuzz: %-16s shrinking a failure: %ld tries, %d accepted\n",
                    property_.c_str(), shrink_tries_, shrinks_);
      log_ << line << std::flush;
      last_print_ = now;
    }
  }
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

 private:
  std::string property_;
  const int& failures_;
  double interval_;
  std::ostream& log_;
  Clock::time_point start_, last_case_, last_print_;
  long cases_ = 0;
  int shrinks_ = 0;
  long shrink_tries_ = 0;
};

std::string rerun_command(const FuzzOptions& o, const std::string& backend, const std::string& property, long cases) {
  std::string cmd = display_name(o.program) + " --seed " + std::to_string(o.seed) + " --property " + property +
                    " --cases " + std::to_string(cases);
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
  // With a time budget, each property gets an equal share of what is left when it starts, past its first
  // case: that one runs whole, so every property asked for is checked (under load a slow first case, cut
  // at its share, left a property with none: exit 2), and a run may end one case per property late.
  const Clock::time_point end =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  DeadlineBackend timed(backend);
  std::vector<PropertyReport> reports;
  int failures = 0;
  for (const Property* prop : selected) {
    std::optional<Clock::time_point> share;
    if (o.cases == 0) share = Clock::now() + (end - Clock::now()) / long(selected.size() - reports.size());
    PropertyReport report;
    report.property = prop->name;
    Progress progress(prop->name, failures, o.progress_seconds, log);
    std::optional<FuzzCase> failing;           // the last failing case: after shrinking, the minimal one
    std::optional<std::string> out_of_memory;  // the case that ran out of host memory
    const rc::detail::Property property = rc::detail::toProperty([&] {
      FuzzCase fc = *gen_fuzz_case();
      fc.params.options.fault = o.fault;
      if (const auto step = backend.fixed_step()) fc.params.options.step = *step;
      timed.set_deadline(progress.cases() > 0 ? share : std::nullopt);
      if (timed.passed()) RC_DISCARD(kTimeUp);
      Verdict v;
      try {
        v = run_check(*prop, timed, make_problem(fc), fc.params);
      } catch (const TimeUp&) {
        RC_DISCARD(kTimeUp);  // a case cut short is no case: neither counted nor a failure
      } catch (const std::bad_alloc&) {
        // The machine's failure, not the layer's: rapidcheck took it for a failure and shrank it to a case
        // that did not reproduce. The campaign stops (exit 2), naming the case.
        out_of_memory = describe(fc);
        RC_DISCARD(kOutOfMemory);
      }
      if (v) {
        failing = fc;
        report.failure = *v;
        RC_FAIL(*v);
      }
    });
    rc::detail::TestMetadata metadata;
    metadata.id = metadata.description = prop->name;
    ref::Rng round_seeds(o.seed ^ fnv1a(prop->name.data(), prop->name.size()));
    while (o.cases > 0 ? progress.cases() < o.cases : progress.cases() == 0 || Clock::now() < *share) {
      rc::detail::TestParams params;
      params.seed = round_seeds.next();
      params.maxSuccess = int(o.cases > 0 ? std::min<long>(kRoundCases, o.cases - progress.cases()) : kRoundCases);
      // Only the deadline discards a case: the first discard ends the round (rapidcheck "gives up").
      params.maxDiscardRatio = 0;
      // An empty reproduce map keeps rapidcheck's global configuration (RC_PARAMS, its own seed) out.
      const rc::detail::TestResult result = rc::detail::checkProperty(property, metadata, params, progress, {});
      // Out of memory while shrinking a failure: the failure (its last failing case) is reported, not lost.
      if (out_of_memory && !(result.is<rc::detail::FailureResult>() && failing))
        throw std::runtime_error("out of memory in property " + prop->name + " (case " + *out_of_memory +
                                 "): no property failed; the case needs more memory than this process can have");
      if (result.is<rc::detail::SuccessResult>()) continue;
      if (result.is<rc::detail::GaveUpResult>()) break;
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
          // display_name: a space or control byte in DIR neither splits the command nor forges a line.
          report.replay_command = display_name(o.program) + " --replay " + display_name(file.string());
          if (backend.name() != "reference") report.replay_command += " --backend " + backend.name();
          log << "  repro: " << display_name(file.string()) << "\n  replay: " << report.replay_command << "\n";
        } catch (const std::exception& e) {
          report.repro_error = e.what();
          log << "  repro not written: " << escape_bytes(e.what()) << "\n";
        }
      }
      log << "  rerun: " << rerun_command(o, backend.name(), prop->name, report.cases) << "\n";
    }
    progress.print();
    reports.push_back(report);
  }
  return reports;
}

int campaign_exit_status(const std::vector<PropertyReport>& reports) {
  bool failed = false, lost = false, starved = reports.empty();
  for (const PropertyReport& r : reports) {
    failed |= r.failed;
    lost |= !r.repro_error.empty();
    starved |= r.cases == 0 && !r.failed;
  }
  return starved || lost ? 2 : failed ? 1 : 0;
}

}  // namespace mok::fuzz
