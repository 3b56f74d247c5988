// mok-verify: compare a candidate (a golden-format file, or a backend's run on the golden's inputs)
// against golden files (the run itself: mok/verify/run.h). Exit status: 0 all bitwise equal, 1 a
// mismatch, 2 usage or file error, or nothing compared, 77 no Hopper GPU for --gpus N (ctest: skip).
#include <algorithm>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mok/core/tool_exit.h"
#include "mok/core/validate.h"
#include "mok/golden/file_kind.h"
#include "mok/golden/golden.h"
#include "mok/verify/backend.h"
#include "mok/verify/run.h"

namespace fs = std::filesystem;
using namespace mok;
using namespace mok::verify;

namespace {

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
Exit status: 0 all bitwise equal, 1 a mismatch, 2 usage or file error (any error while processing a
golden is that golden's; the others still run), or nothing compared (a directory without *.h5 files,
or every golden SKIPPED), 77 no Hopper GPU for --gpus N.
A golden whose forward the backend runs but not its backward (a backend may declare so; none does
now) has its routing and y compared bit for bit, as any golden, and its backward reported as skipped
with the reason (its gradient tensors not compared). A golden the backend does not implement at all is listed
as SKIPPED with the reason, and changes no exit status unless every golden is skipped (exit 2).
File names that are not plain printable ASCII are printed quoted, their odd bytes as \xNN.
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
  VerifyRequest request;
  std::string backend;
  BackendFlags flags;
};

// The whole of value as a decimal integer >= 1: no sign, no spaces, no trailing text, in range.
int positive_int(const std::string& option, const std::string& value) {
  int v = 0;
  if (!parse_whole_number(value, v) || v <= 0)
    throw UsageError(option + " needs an integer from 1 to " + std::to_string(std::numeric_limits<int>::max()) +
                     ", got " + quote_input(value));
  return v;
}

Args parse_args(int argc, char** argv) {
  Args a;
  bool runs_given = false;
  std::vector<std::string> given;  // the options seen so far: a repeat is refused, not overridden
  const auto first_time = [&](const std::string& arg) {
    if (std::find(given.begin(), given.end(), arg) != given.end())
      throw UsageError(quote_input(arg) + " is given twice");
    given.push_back(arg);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quiet" || arg == "--one-process") {
      first_time(arg);
      (arg == "--quiet" ? a.request.quiet : a.flags.one_process) = true;
      continue;
    }
    if (arg.rfind("-", 0) != 0 || arg == "-") {
      a.request.goldens.push_back(arg);
      continue;
    }
    const auto value = [&]() -> std::string {  // the option's, so that an unknown option is named as such
      // An option where the value should be is a missing value (`--json --quiet` wrote a file "--quiet").
      if (i + 1 >= argc || !*argv[i + 1] || std::string(argv[i + 1]).rfind("--", 0) == 0)
        throw UsageError(quote_input(arg) + " needs a value");
      first_time(arg);
      return argv[++i];
    };
    if (arg == "--candidate")
      a.request.candidate = value();
    else if (arg == "--backend")
      a.backend = value();
    else if (arg == "--json") {
      a.request.json = value();
      // It wrote a file named "-": standard output is the report's.
      if (a.request.json == "-") throw UsageError("--json needs a file name ('-': standard output holds the report)");
    } else if (arg == "--step") {
      const std::string step = value();
      if (step != "fp32" && step != "fp32_fma" && step != "hopper_tc")
        throw UsageError("--step takes hopper_tc or fp32 (fp32_fma), got " + quote_input(step));
      a.flags.step = golden::step_model_from_string(step == "fp32" ? "fp32_fma" : step);
    } else if (arg == "--ring-rows") {
      a.flags.ring_rows = positive_int(arg, value());
      // Every backend's ring is whole K-steps: 8 was refused once per golden, as each golden's error.
      if (const std::string problem = ring_rows_problem(*a.flags.ring_rows); !problem.empty())
        throw UsageError("--ring-rows: " + problem);
    } else if (arg == "--recompute") {
      const std::string on = value();
      if (on != "on" && on != "off") throw UsageError("--recompute takes on or off");
      a.flags.recompute = on == "on";
    } else if (arg == "--gpus")
      a.flags.gpus = positive_int(arg, value());
    else if (arg == "--timeout")
      a.flags.timeout_s = positive_int(arg, value());
    else if (arg == "--runs") {
      a.request.runs = positive_int(arg, value());
      runs_given = true;
    } else
      throw UsageError("unknown option " + quote_input(arg));
  }
  if (a.request.goldens.empty()) throw UsageError("no golden file given");
  if (a.request.candidate.empty() == a.backend.empty())
    throw UsageError("give one of --candidate FILE and --backend NAME");
  if (!a.request.candidate.empty()) {
    if (a.flags.step || a.flags.ring_rows || a.flags.recompute || a.flags.gpus || a.flags.one_process ||
        a.flags.timeout_s || runs_given)
      throw UsageError(
          "--step, --ring-rows, --recompute, --gpus, --one-process, --timeout and --runs apply to --backend only");
    std::error_code ec;  // a path that cannot be examined is no directory: reading it names why
    if (a.request.goldens.size() != 1 || fs::is_directory(a.request.goldens[0], ec))
      throw UsageError("--candidate compares against exactly one golden file");
  }
  if ((a.flags.timeout_s || a.flags.one_process) && !a.flags.gpus)
    throw UsageError("--timeout and --one-process apply to --gpus N only");
  if (a.flags.timeout_s && a.flags.one_process) throw UsageError("--timeout applies to --gpus N over processes only");
  if (!a.backend.empty() && !backends().count(a.backend)) throw UsageError("unknown backend " + quote_input(a.backend));
  return a;
}

int tool_main(int argc, char** argv) {
  if (printed_help(argc, argv, kUsage)) return kExitEqual;
  try {
    const Args args = parse_args(argc, argv);
    const std::unique_ptr<Backend> backend = args.backend.empty() ? nullptr : backends().at(args.backend)(args.flags);
    return verify_goldens(args.request, backend.get(), std::cout, std::cerr);
  } catch (const UsageError& e) {
    std::cerr << "mok-verify: " << escape_bytes(e.what()) << "\n" << kUsage;
  } catch (const std::exception& e) {
    std::cerr << "mok-verify: " << escape_bytes(e.what()) << std::endl;
  }
  return kExitError;
}

}  // namespace

int main(int argc, char** argv) {
  // A report lost to a full disk or a closed pipe is no success: it exited 0 with no EQUAL line written.
  static_assert(kExitError == 2, "tool_exit_status's status for lost output");
  return mok::tool_exit_status("mok-verify", tool_main(argc, argv));
}
