// The fuzz loop: each property checked by rapidcheck on generated cases, in rounds of fixed seeds
// derived from the run's seed, so a seed always yields the same cases in the same order; a failure
// shrinks, is written as a repro file, and stops that property.
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string>
#include <vector>

#include "mok/fuzz/backend.h"
#include "mok/fuzz/fuzz_case.h"

namespace mok::fuzz {

struct FuzzOptions {
  uint64_t seed = 1;
  long cases = 100;  // per property; 0: run for `seconds` instead
  // In all: each property gets an equal share of the time left when it starts, past its first case, which
  // runs whole. The deadline is checked before every later case and every layer run (a case it cuts short
  // is dropped), so a run ends within one layer run (and the oracle) of it, or one case per property
  // whose share its first case outlasted.
  double seconds = 0;
  std::vector<std::string> properties;  // empty: all, in all_properties() order
  ref::Fault fault = ref::Fault::none;
  std::filesystem::path repro_dir = ".";
  std::string program = "mok-fuzz";  // how the printed replay and rerun commands start
  double progress_seconds = 5;       // between progress lines on the log, searching or shrinking
};

struct PropertyReport {
  std::string property;
  long cases = 0;      // cases checked, the failing one included
  double seconds = 0;  // time spent on those cases (shrinking excluded)
  bool failed = false;
  std::string failure;          // the shrunk counterexample's failure
  std::string counterexample;   // the shrunk case, one line
  int shrink_steps = 0;         // accepted shrinks
  std::filesystem::path repro;  // empty if none was written
  std::string repro_error;      // why a failing case's repro could not be written, if it could not
  std::string replay_command;   // the command that replays the repro
};

// Progress (cases, cases/s, failures) and every failure's details go to `log`.
std::vector<PropertyReport> run_fuzz(Backend& backend, const FuzzOptions& options, std::ostream& log);

// A campaign's exit status: 2 where a property it was asked for ran no case (that property was not checked)
// or a failing case's repro could not be written (the tool's output lost), 1 where a property failed, 0
// where every property held.
int campaign_exit_status(const std::vector<PropertyReport>& reports);

}  // namespace mok::fuzz
