// mok-fuzz: property-based fuzzing of the MoE layer (docs/fuzzing.md).
//   mok-fuzz [--seed S] [--cases N | --seconds N] [--backend reference|gpu] [--property NAME]...
//            [--inject FAULT] [--repro-dir DIR]
//   mok-fuzz --replay FILE [--backend reference|gpu] [--inject FAULT]
//   mok-fuzz --list
// Exit status: 0 every property held, 1 a property failed, 2 bad usage, backend not available, no case
// run, out of host memory, a failure's repro or standard output not written.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <string>

#include "mok/core/tool_exit.h"
#include "mok/fuzz/driver.h"
#include "mok/fuzz/properties.h"
#include "mok/fuzz/repro.h"
#include "mok/golden/file_kind.h"

namespace {

using namespace mok;
using namespace mok::fuzz;
using mok::golden::cannot_make_directory;
using mok::golden::cannot_write_file;

constexpr const char* kUsage =
    "usage: mok-fuzz [--seed S] [--cases N | --seconds N] [--backend reference|gpu] [--property NAME]...\n"
    "                [--inject FAULT] [--repro-dir DIR]\n"
    "       mok-fuzz --replay FILE [--backend reference|gpu] [--inject FAULT]\n"
    "       mok-fuzz --list\n"
    "Runs every property (or those named) for N cases each (default 100) or N seconds in all; a failure\n"
    "shrinks to a repro file and prints the command that replays it. Without --seed a fresh seed is drawn\n"
    "and printed. --inject plants a fault in the reference (see --list) to show that the fuzzer catches it.\n";

constexpr double kMaxSeconds = 1e9;  // about 30 years: the deadline must fit the clock

struct Usage : Error {
  using Error::Error;
};

struct Args {
  FuzzOptions fuzz;
  bool seed_given = false;
  std::string backend = "reference";
  std::string replay;
  std::string inject;
  bool list = false;
  bool help = false;
};

// The whole of v as a decimal number of type T, strictly: no sign (so "-1" is no seed), no spaces, no
// trailing text, in T's range.
template <class T>
T to_number(const std::string& flag, const std::string& v, const char* want) {
  T n{};
  if (!parse_whole_number(v, n) || v.front() == '-') throw Usage(flag + " needs " + want + ", not " + quote_input(v));
  return n;
}

Args parse(int argc, char** argv) {
  Args a;
  a.fuzz.program = argv[0];
  std::vector<std::string> given;  // each flag once (--property once per property)
  const auto was_given = [&](const std::string& key) {
    return std::find(given.begin(), given.end(), key) != given.end();
  };
  const auto first_time = [&](const std::string& key) {  // a repeat is refused, not overridden
    if (was_given(key)) throw Usage(quote_input(key) + " is given twice");
    given.push_back(key);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--list" || flag == "--help" || flag == "-h") {
      first_time(flag);
      (flag == "--list" ? a.list : a.help) = true;
      continue;
    }
    if (i + 1 >= argc) throw Usage("unknown flag or missing value: " + quote_input(flag));
    const std::string v = argv[++i];
    if (v.empty()) throw Usage(quote_input(flag) + " needs a value, not an empty string");
    // An option where the value should be is a missing value, as mok-verify and mok-golden say it:
    // `--repro-dir --list` ran a whole campaign into a directory "--list" instead of listing.
    if (v.rfind("--", 0) == 0) throw Usage(quote_input(flag) + " needs a value, not the option " + quote_input(v));
    const std::string key = flag == "--property" ? flag + " " + v : flag;
    first_time(key);
    if (flag == "--seed") {
      a.fuzz.seed = to_number<uint64_t>(flag, v, "an unsigned 64-bit integer");
      a.seed_given = true;
    } else if (flag == "--cases") {
      a.fuzz.cases = to_number<long>(flag, v, "a positive integer");
      a.fuzz.seconds = 0;
    } else if (flag == "--seconds") {
      a.fuzz.seconds = double(to_number<long>(flag, v, "a positive integer"));
      if (a.fuzz.seconds > kMaxSeconds) throw Usage("--seconds is at most " + std::to_string(long(kMaxSeconds)));
      a.fuzz.cases = 0;
    } else if (flag == "--backend") {
      require_known_backend(v);  // --list used to exit 0 with any name
      a.backend = v;
    } else if (flag == "--property") {
      a.fuzz.properties.push_back(find_property(v).name);
    } else if (flag == "--inject") {
      a.inject = v;
      a.fuzz.fault = fault_from_string(v);
    } else if (flag == "--repro-dir") {
      a.fuzz.repro_dir = v;
    } else if (flag == "--replay") {
      a.replay = v;
    } else {
      throw Usage("unknown flag " + quote_input(flag));
    }
  }
  const bool cases_given = was_given("--cases"), seconds_given = was_given("--seconds");
  if (cases_given && seconds_given) throw Usage("--cases and --seconds exclude each other: give one");
  if (!a.replay.empty() &&
      (a.seed_given || cases_given || seconds_given || !a.fuzz.properties.empty() || was_given("--repro-dir")))
    throw Usage(
        "--replay runs the file's own case and property and writes no repro: --seed, --cases, --seconds, --property "
        "and --repro-dir do not apply");
  // After the replay's rule: `--replay F --cases 0` was told to give a positive count, which it may not give.
  if (a.fuzz.cases == 0 && a.fuzz.seconds <= 0) throw Usage("--cases and --seconds need a positive count");
  // Made when missing, but a DIR that names a file (or lies under one) was found only once a failure had
  // shrunk and its repro was due: refused now, before the campaign.
  if (const std::string kind = cannot_make_directory(a.fuzz.repro_dir); !kind.empty())
    throw Error("mok-fuzz: --repro-dir " + display_name(a.fuzz.repro_dir.string()) + " " + kind);
  return a;
}

// A repro directory that takes no file (/sys, a read-only mount, no permission) was found once a failure had
// shrunk: made now, and a file made in it and removed, before the campaign.
void require_repro_dir(const std::filesystem::path& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  const std::string why = error ? error.message() : cannot_write_file(dir / ".mok-fuzz-probe.h5");
  if (!why.empty()) throw Error("mok-fuzz: --repro-dir " + display_name(dir.string()) + " takes no file: " + why);
}

void list() {
  std::cout << "properties:\n";
  for (const Property& p : all_properties()) std::printf("  %-17s %s\n", p.name.c_str(), p.summary.c_str());
  std::cout << "faults (--inject):\n";
  for (ref::Fault f : all_faults()) std::cout << "  " << to_string(f) << "\n";
  std::cout << "invalid_inputs mutations:\n";
  for (const std::string& m : mutation_names()) std::cout << "  " << m << "\n";
}

int replay_file(Backend& backend, const Args& a) {
  Repro r = read_repro(a.replay);
  if (!a.inject.empty()) r.params.options.fault = a.fuzz.fault;
  std::cerr << "mok-fuzz: replaying " << display_name(a.replay) << " on " << backend.name() << "\n"
            << escape_bytes(r.description, true) << "\n";
  if (!a.inject.empty()) std::cerr << "fault overridden: " << to_string(r.params.options.fault) << "\n";
  const Verdict v = replay(backend, r);
  if (v) {
    std::cout << "FAIL " << r.property << ": " << *v << "\n";
    return 1;
  }
  std::cout << "PASS " << r.property << "\n";
  return 0;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The cases that ran and the time they took, against the budget; properties that ran no case.
void print_totals(const std::vector<PropertyReport>& reports, double seconds, const FuzzOptions& o) {
  long cases = 0;
  std::string starved;
  for (const PropertyReport& r : reports) {
    cases += r.cases;
    if (r.cases == 0) starved += " " + r.property;
  }
  std::printf("%ld cases in %.1f s", cases, seconds);
  if (o.cases == 0) std::printf(" (budget %.0f s)", o.seconds);
  std::printf("\n");
  if (!starved.empty()) std::printf("no case ran for:%s\n", starved.c_str());
}

int run(Backend& backend, Args& a) {
  const auto start = std::chrono::steady_clock::now();
  if (!a.seed_given) a.fuzz.seed = std::random_device{}();
  std::cerr << "mok-fuzz: seed " << a.fuzz.seed << ", backend " << backend.name() << ", "
            << (a.fuzz.cases > 0 ? std::to_string(a.fuzz.cases) + " cases per property"
                                 : std::to_string(long(a.fuzz.seconds)) + " seconds in all")
            << (a.fuzz.fault != ref::Fault::none ? ", fault " + to_string(a.fuzz.fault) : std::string()) << "\n";
  const std::vector<PropertyReport> reports = run_fuzz(backend, a.fuzz, std::cerr);
  std::printf("%-17s %7s %8s %8s  %s\n", "property", "cases", "seconds", "cases/s", "result");
  for (const PropertyReport& r : reports) {
    const char* result = r.failed ? "FAIL" : r.cases > 0 ? "pass" : "none";  // none: no case ran
    std::printf("%-17s %7ld %8.2f %8.2f  %s\n", r.property.c_str(), r.cases, r.seconds,
                r.cases / std::max(r.seconds, 1e-9), result);
  }
  for (const PropertyReport& r : reports)
    if (!r.replay_command.empty()) std::printf("replay %s: %s\n", r.property.c_str(), r.replay_command.c_str());
  print_totals(reports, seconds_since(start), a.fuzz);
  const int status = campaign_exit_status(reports);
  if (status == 2)
    std::fprintf(stderr, "mok-fuzz: a property ran no case, or a failing case's repro was not written (above)\n");
  return status;
}

int tool_main(int argc, char** argv) {
  try {
    Args a = parse(argc, argv);
    if (a.help) {
      std::cout << kUsage;
      return 0;
    }
    if (a.list) {
      list();
      return 0;
    }
    const std::unique_ptr<Backend> backend = make_backend(a.backend);
    if (!a.replay.empty()) return replay_file(*backend, a);
    require_repro_dir(a.fuzz.repro_dir);
    return run(*backend, a);
  } catch (const Usage& e) {
    std::cerr << "mok-fuzz: " << escape_bytes(e.what(), true) << "\n" << kUsage;
    return 2;
  } catch (const Error& e) {  // a bad flag value, an unreadable repro, a backend this build lacks
    std::cerr << escape_bytes(e.what(), true) << "\n";
    return 2;
  } catch (const std::exception& e) {  // out of memory, an internal error
    std::cerr << "mok-fuzz: " << escape_bytes(e.what(), true) << "\n";
    return 2;
  }
}

}  // namespace

int main(int argc, char** argv) { return mok::tool_exit_status("mok-fuzz", tool_main(argc, argv)); }
