#include "mok/verify/run.h"

#include <algorithm>
#include <chrono>
#include <ostream>

#include "mok/golden/atomic_file.h"
#include "mok/golden/file_error.h"
#include "mok/golden/file_kind.h"
#include "mok/golden/golden.h"
#include "mok/verify/compare.h"
#include "mok/verify/report.h"

namespace fs = std::filesystem;

namespace mok::verify {
namespace {

constexpr int64_t kProgressElements = int64_t(1) << 20;  // per-tensor progress lines for tensors this large

// Directories expand to their *.h5 files, sorted. A directory without any is an error (in `errors`):
// checking nothing must not pass.
std::vector<fs::path> golden_files(const std::vector<fs::path>& given, std::vector<std::string>& errors) {
  std::vector<fs::path> files;
  // No std::filesystem_error escapes: a path that cannot be examined (a symbolic link loop, a name too long)
  // ended the run without its --json report. A directory that cannot be listed is an error in `errors`.
  for (const fs::path& p : given) {
    std::error_code ec;
    if (!fs::is_directory(p, ec)) {  // a file, or no path at all: read_golden names which and why
      files.push_back(p);
      continue;
    }
    try {
      const std::vector<fs::path> in_dir = golden::h5_files_in(p);
      if (in_dir.empty())
        errors.push_back("mok: directory " + display_name(p.string()) +
                         " holds no *.h5 golden file: nothing to verify");
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    } catch (const Error& e) {
      errors.push_back(e.what());
    }
  }
  return files;
}

std::string config_text(const LayerConfig& c) {
  return "R=" + std::to_string(c.ranks) + " T=" + std::to_string(c.tokens_per_rank) +
         " E=" + std::to_string(c.experts) + " k=" + std::to_string(c.top_k) + " H=" + std::to_string(c.hidden) +
         " I=" + std::to_string(c.intermediate) + " Is=" + std::to_string(c.shared_intermediate) + " " +
         golden::to_string(c.score_mode);
}

class Verifier {
 public:
  Verifier(const VerifyRequest& request, Backend* backend, std::ostream& out, std::ostream& err)
      : request_(request), backend_(backend), out_(out), err_(err) {}

  int run() {
    std::vector<std::string> listing_errors;
    const std::vector<fs::path> files = golden_files(request_.goldens, listing_errors);
    if (json_over_an_input(files) || json_unwritable()) return kExitError;
    for (const std::string& e : listing_errors) error(e);
    for (const fs::path& file : files)
      if (const auto e = golden::file_error(file, [&] { examine(file); })) error(*e);
    // Every golden skipped compared nothing, as an empty directory does: no pass (a GPU-less run is 77).
    if (cases_.empty() && errors_.empty() && !no_gpu_)
      error("mok: nothing compared: the backend skipped every golden (" + std::to_string(skipped_.size()) +
            ", SKIPPED above)");
    if (!request_.json.empty()) {
      try {
        golden::write_bytes_atomically(request_.json, format_json(cases_, errors_, skipped_));
      } catch (const Error& e) {
        err_ << "mok-verify: " << escape_bytes(e.what()) << std::endl;
        return kExitError;
      }
    }
    return status();
  }

 private:
  int status() const {
    if (!errors_.empty()) return kExitError;
    if (no_gpu_) return kExitNoGpu;
    const bool equal = std::all_of(cases_.begin(), cases_.end(), [](const CaseReport& c) { return c.equal(); });
    return equal ? kExitEqual : kExitMismatch;
  }

  // Before any work: whether the report would replace a file this run reads (`--json smoke.h5` for `--json
  // smoke.json` wrote the report over the golden), said if so.
  bool json_over_an_input(const std::vector<fs::path>& goldens) const {
    if (request_.json.empty()) return false;
    std::vector<fs::path> inputs = goldens;
    if (!request_.candidate.empty()) inputs.emplace_back(request_.candidate);
    for (const fs::path& input : inputs)
      if (golden::same_file(request_.json, input)) {
        err_ << "mok-verify: mok: --json " << display_name(request_.json) << " is "
             << (input == fs::path(request_.candidate) ? "the candidate" : "the golden") << " file "
             << display_name(input.string()) << " this run reads: the report would overwrite it" << std::endl;
        return true;
      }
    return false;
  }

  // Before any work: whether the report cannot be written where --json says (a directory, a parent that
  // does not exist), said if so; it used to be found only once every golden had run.
  bool json_unwritable() const {
    if (request_.json.empty()) return false;
    const std::string why = golden::cannot_write_file(request_.json);
    if (why.empty()) return false;
    err_ << "mok-verify: mok: cannot write --json " << display_name(request_.json) << ": " << why << std::endl;
    return true;
  }

  // Messages are escaped whole, newlines too: text from a file or a library must not forge a line.
  void error(const std::string& message) {
    errors_.push_back(message);
    err_ << "mok-verify: " << escape_bytes(message) << std::endl;
  }

  void progress(const std::string& line) const {
    if (!request_.quiet) err_ << "[mok-verify] " << line << std::endl;
  }

  // One golden; a skip is reported here, any other exception is the golden's error (file_error).
  void examine(const fs::path& file) {
    try {
      if (no_gpu_) {  // the rest would skip alike: only read, so that a file error anywhere still wins
        golden::read_golden(file);
        return;
      }
      verify_golden(file);
    } catch (const NoGpu& e) {  // no GPU at all: the report says so
      err_ << "mok-verify: " << escape_bytes(e.what()) << std::endl;
      skipped_.push_back(e.what());
      no_gpu_ = true;
    } catch (const Unsupported& e) {  // a config the backend does not implement: shown, not an error
      skipped_.push_back(file.string() + ": " + e.what());
      out_ << "SKIPPED  " << display_name(file.string()) << ": " << escape_bytes(e.what()) << std::endl;
    }
  }

  void verify_golden(const fs::path& file) {
    progress("reading " + display_name(file.string()));
    const golden::GoldenCase golden = golden::read_golden(file);
    const auto tensor_progress = [&](const golden::Tensor& t, size_t number, size_t count) {
      if (t.elements() >= kProgressElements)
        progress(golden.name + ": comparing " + t.name + " (" + std::to_string(number) + "/" + std::to_string(count) +
                 ", " + std::to_string(t.elements()) + " elements)");
    };
    if (!request_.candidate.empty()) {
      compare_candidate(file, golden, tensor_progress);
      return;
    }
    for (int run = 1; run <= request_.runs; ++run) {
      const std::string of_runs = "run " + std::to_string(run) + "/" + std::to_string(request_.runs);
      progress(golden.name + ": running " + backend_->name() + " (" + of_runs + ")");
      const auto start = std::chrono::steady_clock::now();
      const RunResults results = run_backend(file, golden);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      CaseReport r = compare_run(golden, results.results, results.gradients_skipped, tensor_progress);
      r.candidate = backend_->name() + (request_.runs > 1 ? " (" + of_runs + ")" : "");
      r.seconds = seconds;
      finish(file, golden, std::move(r));
    }
  }

  void compare_candidate(const fs::path& file, const golden::GoldenCase& golden, const CompareProgress& progress_of) {
    progress("reading candidate " + display_name(request_.candidate));
    const golden::GoldenCase candidate = golden::read_golden(request_.candidate);
    std::vector<golden::Tensor> tensors = candidate.inputs;
    for (const auto* group : {&candidate.results.routing, &candidate.results.outputs})
      tensors.insert(tensors.end(), group->begin(), group->end());
    CaseReport r;
    r.candidate = request_.candidate;
    if (config_text(candidate.config) != config_text(golden.config))
      r.config_note = "the candidate's config " + config_text(candidate.config) + " differs from the golden's " +
                      config_text(golden.config) + " (tensors are compared in global terms)";
    r.tensors = compare_tensors(golden, tensors, true, progress_of);
    finish(file, golden, std::move(r));
  }

  // The backend's run; an input it refuses is named with the golden file it came from (a directory's
  // goldens run one after another).
  RunResults run_backend(const fs::path& file, const golden::GoldenCase& golden) const {
    try {
      return backend_->run(golden);
    } catch (const NoGpu&) {
      throw;
    } catch (const Unsupported&) {
      throw;
    } catch (const Error& e) {
      throw Error(display_name(file.string()) + ": " + e.what());
    }
  }

  void finish(const fs::path& file, const golden::GoldenCase& golden, CaseReport r) {
    r.golden_file = file.string();
    r.golden_name = golden.name;
    out_ << format_text(r) << std::flush;
    cases_.push_back(std::move(r));
  }

  const VerifyRequest& request_;
  Backend* backend_;
  std::ostream& out_;
  std::ostream& err_;
  bool no_gpu_ = false;
  std::vector<CaseReport> cases_;
  std::vector<std::string> errors_;
  std::vector<std::string> skipped_;  // goldens the backend does not implement (Unsupported), or no GPU
};

}  // namespace

int verify_goldens(const VerifyRequest& request, Backend* backend, std::ostream& out, std::ostream& err) {
  return Verifier(request, backend, out, err).run();
}

}  // namespace mok::verify
