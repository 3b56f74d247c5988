// mok-golden: generate golden files from the catalogue or a case file, and check committed goldens
// against the reference bit for bit. Exit status: 0 all equal, 1 a mismatch, 2 usage or file error.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "mok/core/fields.h"
#include "mok/core/tool_exit.h"
#include "mok/golden/catalogue.h"
#include "mok/golden/file_error.h"
#include "mok/golden/file_kind.h"
#include "mok/golden/golden.h"
#include "mok/golden/locate.h"
#include "mok/reference/oracle.h"

#ifndef MOK_GOLDEN_DATA_DIR
#error "MOK_GOLDEN_DATA_DIR must be defined by the build"
#endif

namespace fs = std::filesystem;
using namespace mok;
using namespace mok::golden;

namespace {

constexpr int kEqual = 0, kMismatch = 1, kError = 2;

constexpr const char* kUsage = R"(usage:
  mok-golden list
  mok-golden generate --out DIR [--name NAME]      catalogue cases (all, or one) to DIR/NAME.h5
  mok-golden generate --config FILE --out PATH      the case a key = value file describes
  mok-golden check [--dir DIR] [--name NAME]       regenerate each DIR/*.h5, require equal bits
  mok-golden check --builtin [--dir DIR]            the builtin case twice, then against its golden in DIR
DIR defaults to the committed goldens, )" MOK_GOLDEN_DATA_DIR R"(.
Exit status: 0 all equal, 1 a mismatch, 2 usage or file error.
)";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// --key value options after the command word; every key must be known to the command, and given once.
struct Args {
  std::string command;
  std::vector<std::pair<std::string, std::string>> options;
  bool builtin = false;

  std::string get(const std::string& key, const std::string& fallback = "") const {
    for (const auto& [k, v] : options)
      if (k == key) return v;
    return fallback;
  }
  bool has(const std::string& key) const { return !get(key).empty(); }
};

Args parse_args(int argc, char** argv, const std::vector<std::string>& keys) {
  Args a;
  a.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--builtin") {  // a flag, given once as every option is
      if (a.builtin) throw UsageError(arg + " is given twice");
      a.builtin = true;
      continue;
    }
    if (std::find(keys.begin(), keys.end(), arg) == keys.end())
      throw UsageError("unknown option " + quote_input(arg) + " for " + a.command);
    // An option where the value should be is a missing value (`--out --name` wrote a golden named "--name").
    if (i + 1 >= argc || std::string(argv[i + 1]).empty() || std::string(argv[i + 1]).rfind("--", 0) == 0)
      throw UsageError(arg + " needs a value");
    if (a.has(arg)) throw UsageError(arg + " is given twice");
    a.options.emplace_back(arg, argv[++i]);
  }
  return a;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string fixed(double v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string shape_text(const LayerConfig& c) {
  return "R=" + std::to_string(c.ranks) + " T=" + std::to_string(c.tokens_per_rank) +
         " E=" + std::to_string(c.experts) + " k=" + std::to_string(c.top_k) + " H=" + std::to_string(c.hidden) +
         " I=" + std::to_string(c.intermediate);
}

// A name and the spaces to column 20 after it (one at least: a longer name pushes the rest along).
std::string in_column(const std::string& name) {
  return name + std::string(name.size() < 20 ? 20 - name.size() : 1, ' ');
}

int list_catalogue() {
  for (const CaseSpec& s : catalogue())
    std::cout << in_column(s.name) << shape_text(s.config) << "  " << ref::to_string(s.recipe.routing) << "  "
              << s.description << "\n";
  return kEqual;
}

// generate's and check's DIR: one error naming what it is instead (not one per golden).
void require_golden_directory(const fs::path& dir) {
  if (const std::string kind = not_a_directory(dir); !kind.empty())
    throw Error("mok: golden directory " + display_name(dir.string()) + " " + kind);
}

// The case's golden into `out`, refused before the case is computed (which may take minutes) where
// AtomicFile would refuse it after.
void generate_one(const CaseSpec& spec, const fs::path& out) {
  require_writable_file(out);
  const auto start = std::chrono::steady_clock::now();
  write_golden(out, make_case(spec));
  std::cout << spec.name << ": " << display_name(out.string()) << ", " << fs::file_size(out) << " bytes, "
            << fixed(seconds_since(start), 2) << " s" << std::endl;
}

// The first field in which a committed golden's recipe differs from the catalogue's, or "".
std::string stale_field(const GoldenCase& g, const CaseSpec& s) {
  std::string stale;  // the config's fields (mok/core/fields.h), then the options and the recipe
  for_each_field(g.config, s.config, [&](const char* name, const auto& a, const auto& b) {
    if (stale.empty() && !(a == b)) stale = name;
  });
  if (!stale.empty()) return stale;
  const std::pair<const char*, bool> fields[] = {
      {"step", g.options.step == s.options.step},
      {"ring_rows", g.options.ring_rows == s.options.ring_rows},
      {"recompute", g.options.recompute == s.options.recompute},
      {"fp8_weight_gradients", g.options.fp8_weight_gradients == s.options.fp8_weight_gradients},
      {"recipe", g.recipe.has_value()},
      {"seed", g.recipe && g.recipe->seed == s.recipe.seed},
      {"routing", g.recipe && g.recipe->routing == s.recipe.routing},
      {"zipf_s", g.recipe && g.recipe->zipf_s == s.recipe.zipf_s},
  };
  for (const auto& [name, same] : fields)
    if (!same) return name;
  return "";
}

int generate(const Args& a) {
  if (!a.has("--out")) throw UsageError("generate needs --out");
  if (a.has("--config")) {
    if (a.has("--name")) throw UsageError("--name and --config exclude each other");
    if (same_file(a.get("--config"), a.get("--out")))  // the golden written over the case it was made from
      throw UsageError("--out " + display_name(a.get("--out")) + " is the case file --config reads");
    const CaseSpec spec = parse_case_file(a.get("--config"));
    // check takes a golden named for a catalogue case for that case's (check_file): one of another
    // config failed every check, exit 1, with advice to regenerate the catalogue's case instead.
    if (const CaseSpec* listed = find_case(spec.name)) {
      GoldenCase g;
      g.config = spec.config;
      g.options = spec.options;
      g.recipe = spec.recipe;
      if (const std::string field = stale_field(g, *listed); !field.empty())
        throw Error("mok: case file " + display_name(a.get("--config")) + ": name " + spec.name +
                    " is a catalogue case's, whose " + field +
                    " differs (mok-golden check would fail it): give it a name of its own (a line name = ...)");
    }
    generate_one(spec, a.get("--out"));
    return kEqual;
  }
  const fs::path dir = a.get("--out");
  if (a.has("--name")) {
    const CaseSpec* spec = find_case(a.get("--name"));
    if (!spec) throw UsageError("the catalogue has no case " + quote_input(a.get("--name")) + " (see mok-golden list)");
    generate_one(*spec, dir / (spec->name + ".h5"));
    return kEqual;
  }
  require_golden_directory(dir);  // one error, before any case is computed
  // Every case it can: a case that fails is named with its error (and leaves no file: write_golden is
  // atomic), and the rest still run.
  int failed = 0;
  for (const CaseSpec& spec : catalogue()) {
    const fs::path out = dir / (spec.name + ".h5");
    if (const auto error = file_error(out, [&] { generate_one(spec, out); })) {
      std::cout << "ERROR " << spec.name << ": " << escape_bytes(*error) << std::endl;
      ++failed;
    }
  }
  if (failed) std::cout << failed << " of " << catalogue().size() << " cases failed" << std::endl;
  return failed ? kError : kEqual;
}

// Every tensor of `got` against `want`, bit for bit; prints each differing tensor's first element.
// Returns the number of differing tensors.
int compare_cases(const GoldenCase& want, const GoldenCase& got, const char* want_label, const char* got_label) {
  int differing = 0;
  for (const std::vector<Tensor>* group : {&want.inputs, &want.results.routing, &want.results.outputs})
    for (const Tensor& w : *group) {
      const Tensor* g = got.find(w.name);
      if (!g || g->dtype != w.dtype || g->shape != w.shape) {
        std::cout << "    " << w.name << ": missing or of another dtype/shape in the " << got_label << "\n";
        ++differing;
        continue;
      }
      const std::optional<int64_t> i = first_difference(w, *g);
      if (!i) continue;
      ++differing;
      std::cout << "    first difference " << element_name(w, *i) << " (" << locate(want, w.name, *i)
                << "): " << want_label << " " << describe_bits(w.dtype, w.bits(*i)) << ", " << got_label << " "
                << describe_bits(w.dtype, g->bits(*i)) << "\n";
    }
  return differing;
}

// The first stored fp64-oracle bound that is not this build's (ref::oracle_bound of the tensor in the
// golden's precision; a bound depends on nothing else), as "tensor: stored vs now", or "". A golden
// written before a bound changed holds a bound its own error need not meet.
std::string stale_bound(const GoldenCase& g) {
  for (int t = 0; t <= int(ref::OracleTensor::d_shared_w2); ++t) {
    const auto tensor = ref::OracleTensor(t);
    const auto stored = g.oracle.find(ref::to_string(tensor));
    const double now = ref::oracle_bound(tensor, g.config.precision);
    if (stored != g.oracle.end() && stored->second.bound != now)
      return std::string(ref::to_string(tensor)) + ": " + std::to_string(stored->second.bound) + " vs " +
             std::to_string(now);
  }
  return "";
}

// Why `golden`, read from `file`, cannot stand for its case (a FAIL line's text), or "": a file named for
// a catalogue case must hold that case (the check counts it as that case's golden), and the catalogue's
// fields and this build's oracle bounds must be those it was written with.
std::string unfit_golden(const fs::path& file, const GoldenCase& golden) {
  const std::string stem = file.stem().string();
  const std::string regenerate = ": regenerate it (mok-golden generate --name " + golden.name + ")";
  if (find_case(stem) && golden.name != stem)
    return display_name(file.filename().string()) + ": named for the catalogue case " + stem + " but holds the case " +
           quote_input(golden.name);
  if (const CaseSpec* spec = find_case(golden.name))
    if (const std::string field = stale_field(golden, *spec); !field.empty())
      return golden.name + ": the catalogue's " + field + " differs from the committed golden's" + regenerate;
  if (const std::string bound = stale_bound(golden); !bound.empty())
    return golden.name + ": its stored fp64-oracle bound of " + bound + " (this build's)" + regenerate;
  return "";
}

// Regenerates one committed golden (from its recipe, or from its stored inputs) and compares.
int check_file(const fs::path& file) {
  const auto start = std::chrono::steady_clock::now();
  const GoldenCase golden = read_golden(file);
  if (const std::string unfit = unfit_golden(file, golden); !unfit.empty()) {
    std::cout << "FAIL  " << unfit << std::endl;
    return kMismatch;
  }
  const double read_s = seconds_since(start);
  const GoldenCase fresh = regenerate(golden);
  const double total_s = seconds_since(start);
  std::cout << in_column(golden.name) << shape_text(golden.config) << "  read " << fixed(read_s, 2) << " s, regenerate "
            << fixed(total_s - read_s, 2) << " s" << std::endl;
  const int differing = compare_cases(golden, fresh, "golden", "reference");
  // The file too where its name is not the case's: `ok smoke` for o5.h5 read beside "catalogue case has no
  // golden smoke.h5".
  const std::string file_name = file.stem() == golden.name ? "" : " (" + display_name(file.filename().string()) + ")";
  std::cout << (differing ? "FAIL  " : "ok    ") << golden.name << file_name
            << (differing ? ": " + std::to_string(differing) + " tensors differ" : "") << std::endl;
  return differing ? kMismatch : kEqual;
}

// --name as a file of DIR: a case name (validate_case_name), so that DIR/NAME.h5 is in DIR (`../x` read
// a file outside it).
void require_case_name_argument(const std::string& name) {
  try {
    validate_case_name(name, "--name");
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
}

int check_dir(const Args& a) {
  const fs::path dir = a.get("--dir", MOK_GOLDEN_DATA_DIR);
  if (a.has("--name")) require_case_name_argument(a.get("--name"));
  require_golden_directory(dir);
  std::vector<fs::path> files;
  if (a.has("--name")) {
    files.push_back(dir / (a.get("--name") + ".h5"));
  } else {
    files = h5_files_in(dir);
  }
  const auto start = std::chrono::steady_clock::now();
  int status = kEqual, failed = 0, missing = 0;  // failed: of the files checked; missing: catalogue cases
  if (!a.has("--name"))
    for (const CaseSpec& spec : catalogue())
      if (std::find(files.begin(), files.end(), dir / (spec.name + ".h5")) == files.end()) {
        std::cout << "ERROR " << spec.name << ": catalogue case has no golden "
                  << display_name((dir / (spec.name + ".h5")).string()) << std::endl;
        status = kError;
        ++missing;
      }
  for (const fs::path& file : files) {
    int s = kError;
    if (const auto error = file_error(file, [&] { s = check_file(file); }))
      std::cout << "ERROR " << display_name(file.filename().string()) << ": " << escape_bytes(*error) << std::endl;
    status = std::max(status, s);
    failed += s != kEqual;
  }
  // Apart: counted with the failures, the missing made "9 goldens checked ...: 22 failed".
  std::cout << files.size() << " goldens checked in " << fixed(seconds_since(start), 2) << " s: " << failed
            << " failed";
  if (missing) std::cout << "; " << missing << " catalogue cases without a golden";
  std::cout << std::endl;
  return status;
}

// The README's main job: the builtin case twice in memory (run-to-run bits), then against its golden.
int check_builtin(const Args& a) {
  const CaseSpec& spec = builtin_case();
  const fs::path dir = a.get("--dir", MOK_GOLDEN_DATA_DIR);
  require_golden_directory(dir);  // as check and generate say it (a file for DIR was "DIR/smoke.h5: no such file")
  const fs::path file = dir / (spec.name + ".h5");
  std::cout << "builtin case " << spec.name << ": " << shape_text(spec.config) << ", " << spec.description << "\n";
  auto start = std::chrono::steady_clock::now();
  const GoldenCase first = make_case(spec);
  std::cout << "  run 1: " << fixed(seconds_since(start), 2) << " s\n";
  start = std::chrono::steady_clock::now();
  const GoldenCase second = make_case(spec);
  std::cout << "  run 2: " << fixed(seconds_since(start), 2) << " s" << std::endl;
  int differing = compare_cases(first, second, "run 1", "run 2");
  std::cout << (differing ? "FAIL  run 1 and run 2 differ" : "ok    run 1 and run 2 are bitwise equal") << std::endl;
  GoldenCase golden;
  try {
    golden = read_golden(file);
  } catch (const Error& e) {
    std::cout << "ERROR " << escape_bytes(e.what()) << std::endl;
    return kError;
  }
  if (const std::string unfit = unfit_golden(file, golden); !unfit.empty()) {  // as check's
    std::cout << "FAIL  " << unfit << std::endl;
    return kMismatch;
  }
  const int against_golden = compare_cases(golden, first, "golden", "run 1");
  std::cout << (against_golden ? "FAIL  " : "ok    ") << "run 1 against " << display_name(file.string())
            << (against_golden ? ": " + std::to_string(against_golden) + " tensors differ" : ": bitwise equal")
            << std::endl;
  differing += against_golden;
  return differing ? kMismatch : kEqual;
}

int run(int argc, char** argv) {
  if (argc < 2) throw UsageError("no command");
  const std::string command = argv[1];
  if (command == "list") {
    if (argc != 2) throw UsageError("list takes no options");
    return list_catalogue();
  }
  if (command == "generate") {
    const Args a = parse_args(argc, argv, {"--out", "--name", "--config"});
    if (a.builtin) throw UsageError("--builtin is an option of check");
    return generate(a);
  }
  if (command == "check") {
    const Args a = parse_args(argc, argv, {"--dir", "--name"});
    if (a.builtin && a.has("--name")) throw UsageError("--builtin and --name exclude each other");
    return a.builtin ? check_builtin(a) : check_dir(a);
  }
  if (command == "-h" || command == "--help") {
    if (argc != 2) throw UsageError(command + " takes no options");  // as list: `-h extra` exited 0
    std::cout << kUsage;
    return kEqual;
  }
  throw UsageError("unknown command " + quote_input(command));
}

}  // namespace

int main(int argc, char** argv) {
  int status = kError;
  try {
    status = run(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "mok-golden: " << escape_bytes(e.what()) << "\n" << kUsage;
  } catch (const std::bad_alloc&) {  // its what() is "std::bad_alloc", which names neither tool nor cause
    std::cerr << "mok-golden: out of memory (the case's tensors and the reference's work did not fit)" << std::endl;
  } catch (const std::exception& e) {
    std::cerr << escape_bytes(e.what()) << std::endl;
  }
  // A report or list lost to a full disk or a closed pipe is no success (check exited 0 without its "ok").
  static_assert(kError == 2, "tool_exit_status's status for lost output");
  return mok::tool_exit_status("mok-golden", status);
}
