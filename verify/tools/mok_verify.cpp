// mok-verify: compare a candidate (a golden-format file, or a backend's run on the golden's inputs)
// against golden files. Exit status: 0 all bitwise equal, 1 a mismatch, 2 usage or file error, 77 no
// Hopper GPU for --gpus N (ctest: skip).
#include <algorithm>
#include <charconv>
#include <chrono>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mok/golden/atomic_file.h"
#include "mok/golden/golden.h"
#include "mok/verify/backend.h"
#include "mok/verify/compare.h"
#include "mok/verify/report.h"

namespace fs = std::filesystem;
using namespace mok;
using namespace mok::verify;

namespace {

constexpr int kEqual = 0, kMismatch = 1, kError = 2, kSkip = 77;
constexpr int64_t kProgressElements = int64_t(1) << 20;  // per-tensor progress lines for tensors this large

constexpr const char* kUsage = R"(usage:
  mok-verify GOLDEN --candidate FILE [--json FILE] [--quiet]
  mok-verify GOLDEN... --backend NAME [--step hopper_tc|fp32] [--ring-rows N] [--recompute on|off]
                                      [--gpus N [--timeout S | --one-process]] [--runs N] [--json FILE] [--quiet]
GOLDEN is a golden file or a directory (each *.h5 in it). A candidate file is compared in every
tensor, inputs included; a backend runs on each golden's inputs and its routing and outputs are
compared. Backends: reference, gpu (one GPU; --gpus N: the golden's global batch over N processes, one
per GPU, on an NCCL communicator, each run's ranks killed after --timeout S seconds (300); with
--one-process, the N GPUs driven from this process). A golden whose ranks do not split over N GPUs runs
on one rank per GPU when its tokens and experts split, and is refused otherwise.
Progress goes to stderr (--quiet: none), the report to stdout.
Exit status: 0 all bitwise equal, 1 a mismatch, 2 usage or file error, 77 no Hopper GPU for --gpus N.
A golden whose forward the backend runs but not its backward (a backend may declare so; none does
now) has its routing and y compared bit for bit, as any golden, and its backward reported as skipped
with the reason (its gradient tensors not compared). A golden the backend does not implement at all is listed
as SKIPPED with the reason, and changes no exit status.
)";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The backends by name. The megakernel's adds one entry here (and a link to its library).
using BackendFactory = std::function<std::unique_ptr<Backend>(const BackendFlags&)>;
const std::map<std::string, BackendFactory>& backends() {
  static const std::map<std::string, BackendFactory> table = {{"reference", make_reference_backend},
                                                              {"gpu", make_gpu_backend}};
  return table;
}

struct Args {
  std::vector<fs::path> goldens;
  std::string candidate, backend, json;
  BackendFlags flags;
  int runs = 1;
  bool quiet = false;
};

// The whole of value as a decimal integer >= 1: no sign, no spaces, no trailing text, in range.
int positive_int(const std::string& option, const std::string& value) {
  int v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v <= 0)
    throw UsageError(option + " needs a positive integer, got " + quote_input(value));
  return v;
}

Args parse_args(int argc, char** argv) {
  Args a;
  bool runs_given = false;
  std::vector<std::string> given;  // the options with a value seen so far: a repeat is refused, not overridden
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quiet") {
      a.quiet = true;
      continue;
    }
    if (arg == "--one-process") {
      a.flags.one_process = true;
      continue;
    }
    if (arg.rfind("-", 0) != 0 || arg == "-") {
      a.goldens.push_back(arg);
      continue;
    }
    const auto value = [&]() -> std::string {  // the option's, so that an unknown option is named as such
      // An option where the value should be is a missing value (`--json --quiet` wrote a file "--quiet").
      if (i + 1 >= argc || !*argv[i + 1] || std::string(argv[i + 1]).rfind("--", 0) == 0)
        throw UsageError(quote_input(arg) + " needs a value");
      if (std::find(given.begin(), given.end(), arg) != given.end())
        throw UsageError(quote_input(arg) + " is given twice");
      given.push_back(arg);
      return argv[++i];
    };
    if (arg == "--candidate")
      a.candidate = value();
    else if (arg == "--backend")
      a.backend = value();
    else if (arg == "--json")
      a.json = value();
    else if (arg == "--step") {
      const std::string step = value();
      if (step != "fp32" && step != "fp32_fma" && step != "hopper_tc")
        throw UsageError("--step takes hopper_tc or fp32 (fp32_fma), got " + quote_input(step));
      a.flags.step = golden::step_model_from_string(step == "fp32" ? "fp32_fma" : step);
    } else if (arg == "--ring-rows")
      a.flags.ring_rows = positive_int(arg, value());
    else if (arg == "--recompute") {
      const std::string on = value();
      if (on != "on" && on != "off") throw UsageError("--recompute takes on or off");
      a.flags.recompute = on == "on";
    } else if (arg == "--gpus")
      a.flags.gpus = positive_int(arg, value());
    else if (arg == "--timeout")
      a.flags.timeout_s = positive_int(arg, value());
    else if (arg == "--runs") {
      a.runs = positive_int(arg, value());
      runs_given = true;
    } else
      throw UsageError("unknown option " + quote_input(arg));
  }
  if (a.goldens.empty()) throw UsageError("no golden file given");
  if (a.candidate.empty() == a.backend.empty()) throw UsageError("give one of --candidate FILE and --backend NAME");
  if (!a.candidate.empty()) {
    if (a.flags.step || a.flags.ring_rows || a.flags.recompute || a.flags.gpus || a.flags.one_process ||
        a.flags.timeout_s || runs_given)
      throw UsageError("--step, --ring-rows, --recompute, --gpus and --runs apply to --backend only");
    std::error_code ec;  // a path that cannot be examined is no directory: reading it names why
    if (a.goldens.size() != 1 || fs::is_directory(a.goldens[0], ec))
      throw UsageError("--candidate compares against exactly one golden file");
  }
  if ((a.flags.timeout_s || a.flags.one_process) && !a.flags.gpus)
    throw UsageError("--timeout and --one-process apply to --gpus N only");
  if (a.flags.timeout_s && a.flags.one_process) throw UsageError("--timeout applies to --gpus N over processes only");
  if (!a.backend.empty() && !backends().count(a.backend)) throw UsageError("unknown backend " + quote_input(a.backend));
  return a;
}

// Directories expand to their *.h5 files, sorted. A directory without any is an error (in `errors`):
// checking nothing must not pass.
std::vector<fs::path> golden_files(const std::vector<fs::path>& given, std::vector<std::string>& errors) {
  std::vector<fs::path> files;
  // Error codes, not exceptions: a path that cannot be examined (a symbolic link loop, a name too long)
  // escaped as std::filesystem_error, ending the run without its --json report.
  for (const fs::path& p : given) {
    std::error_code ec;
    if (!fs::is_directory(p, ec)) {  // a file, or no path at all: read_golden names which and why
      files.push_back(p);
      continue;
    }
    std::vector<fs::path> in_dir;
    for (fs::directory_iterator it(p, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().extension() == ".h5") in_dir.push_back(it->path());
    if (ec)
      errors.push_back("mok: cannot list directory " + p.string() + ": " + ec.message());
    else if (in_dir.empty())
      errors.push_back("mok: directory " + p.string() + " holds no *.h5 golden file: nothing to verify");
    std::sort(in_dir.begin(), in_dir.end());
    files.insert(files.end(), in_dir.begin(), in_dir.end());
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
  explicit Verifier(const Args& args) : args_(args) {
    if (!args.backend.empty()) backend_ = backends().at(args.backend)(args.flags);
  }

  int run() {
    const std::vector<fs::path> files = golden_files(args_.goldens, errors_);
    for (const std::string& e : errors_) std::cerr << "mok-verify: " << e << std::endl;
    bool no_gpu = false;
    for (const fs::path& file : files) {
      try {
        if (no_gpu) {  // the rest would skip alike: only read, so that a file error anywhere still wins
          golden::read_golden(file);
          continue;
        }
        verify_golden(file);
      } catch (const NoGpu& e) {  // no GPU at all: the report says so
        std::cerr << "mok-verify: " << e.what() << std::endl;
        skipped_.push_back(e.what());
        no_gpu = true;
      } catch (const Unsupported& e) {  // a config the backend does not implement: shown, not an error
        skipped_.push_back(e.what());
        std::cout << "SKIPPED  " << escape_bytes(file.string()) << ": " << e.what() << std::endl;
      } catch (const Error& e) {
        errors_.push_back(e.what());
        std::cerr << "mok-verify: " << escape_bytes(e.what(), true) << std::endl;
      }
    }
    if (!args_.json.empty()) {
      try {
        golden::write_bytes_atomically(args_.json, format_json(cases_, errors_, skipped_));
      } catch (const Error& e) {
        std::cerr << "mok-verify: " << escape_bytes(e.what(), true) << std::endl;
        return kError;
      }
    }
    if (!errors_.empty()) return kError;
    if (no_gpu) return kSkip;
    const bool equal = std::all_of(cases_.begin(), cases_.end(), [](const CaseReport& c) { return c.equal(); });
    return equal ? kEqual : kMismatch;
  }

 private:
  void progress(const std::string& line) const {
    if (!args_.quiet) std::cerr << "[mok-verify] " << line << std::endl;
  }

  void verify_golden(const fs::path& file) {
    progress("reading " + file.string());
    const golden::GoldenCase golden = golden::read_golden(file);
    const auto tensor_progress = [&](const golden::Tensor& t, size_t number, size_t count) {
      if (t.elements() >= kProgressElements)
        progress(golden.name + ": comparing " + t.name + " (" + std::to_string(number) + "/" + std::to_string(count) +
                 ", " + std::to_string(t.elements()) + " elements)");
    };
    if (!args_.candidate.empty()) {
      progress("reading candidate " + args_.candidate);
      const golden::GoldenCase candidate = golden::read_golden(args_.candidate);
      std::vector<golden::Tensor> tensors = candidate.inputs;
      for (const auto* group : {&candidate.results.routing, &candidate.results.outputs})
        tensors.insert(tensors.end(), group->begin(), group->end());
      CaseReport r;
      r.golden_file = file.string();
      r.golden_name = golden.name;
      r.candidate = args_.candidate;
      if (config_text(candidate.config) != config_text(golden.config))
        r.config_note = "the candidate's config " + config_text(candidate.config) + " differs from the golden's " +
                        config_text(golden.config) + " (tensors are compared in global terms)";
      r.tensors = compare_tensors(golden, tensors, true, tensor_progress);
      finish(std::move(r));
      return;
    }
    for (int run = 1; run <= args_.runs; ++run) {
      progress(golden.name + ": running " + backend_->name() + " (run " + std::to_string(run) + "/" +
               std::to_string(args_.runs) + ")");
      const auto start = std::chrono::steady_clock::now();
      const RunResults results = run_backend(file, golden);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::string name = backend_->name();
      if (args_.runs > 1) name += " (run " + std::to_string(run) + "/" + std::to_string(args_.runs) + ")";
      CaseReport r = compare_run(golden, results.results, results.gradients_skipped, tensor_progress);
      r.golden_file = file.string();
      r.golden_name = golden.name;
      r.candidate = name;
      r.seconds = seconds;
      finish(std::move(r));
    }
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
      throw Error(escape_bytes(file.string()) + ": " + e.what());
    }
  }

  void finish(CaseReport r) {
    std::cout << format_text(r) << std::flush;
    cases_.push_back(std::move(r));
  }

  const Args& args_;
  std::unique_ptr<Backend> backend_;
  std::vector<CaseReport> cases_;
  std::vector<std::string> errors_;
  std::vector<std::string> skipped_;  // goldens the backend does not implement (Unsupported)
};

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help")) {
    std::cout << kUsage;
    return kEqual;
  }
  try {
    const Args args = parse_args(argc, argv);
    return Verifier(args).run();
  } catch (const UsageError& e) {
    std::cerr << "mok-verify: " << escape_bytes(e.what(), true) << "\n" << kUsage;
  } catch (const std::exception& e) {
    std::cerr << "mok-verify: " << escape_bytes(e.what(), true) << std::endl;
  }
  return kError;
}
