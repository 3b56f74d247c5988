// One fuzz case: a problem recipe (config, routing kind, seed) and the run parameters a property
// needs. The problem itself is made by ref::make_problem, so a case is small to show and to shrink.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mok/reference/layer.h"
#include "mok/reference/problem.h"

namespace mok::fuzz {

// What a property needs beyond the problem: the layer options (fault included) and a seed for the
// property's own choices (sub-batch, permutation, second ring size, invalid-input positions).
struct CaseParams {
  ref::Options options;
  uint64_t aux_seed = 0;
};

struct FuzzCase {
  LayerConfig config;
  ref::RoutingKind routing = ref::RoutingKind::router;
  double zipf_s = 1.2;
  uint64_t data_seed = 1;
  CaseParams params;
};

ref::Problem make_problem(const FuzzCase& fc);

// One line: every field, as rapidcheck's counterexample and the repro's description show it.
std::string describe(const FuzzCase& fc);
std::string describe(const LayerConfig& c);

std::string to_string(ref::Fault fault);
// The fault of that name; none where no fault is, and unknown_fault(name) says why.
std::optional<ref::Fault> fault_named(const std::string& name);
std::string unknown_fault(const std::string& name);     // "unknown fault 'x'"
ref::Fault fault_from_string(const std::string& name);  // throws mok::Error
const std::vector<ref::Fault>& all_faults();            // every planted fault (none excluded)

}  // namespace mok::fuzz
