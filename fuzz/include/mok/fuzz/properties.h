// The fuzzer's properties (docs/design.md: the determinism contract, verification level V3). Each is a plain check of
// one problem under one set of run parameters, so rapidcheck drives it, a repro file replays it, and any Backend runs
// it.
#pragma once

#include <string>
#include <vector>

#include "mok/fuzz/backend.h"
#include "mok/fuzz/compare.h"
#include "mok/fuzz/fuzz_case.h"

namespace mok::fuzz {

struct Property {
  std::string name;
  std::string summary;
  Verdict (*check)(Backend& backend, const ref::Problem& problem, const CaseParams& params);
};

// In the order the CLI runs them.
const std::vector<Property>& all_properties();
// The property of that name; null where none is, and unknown_property(name) says why (the caller names
// where the name came from: a repro file's errors name the file).
const Property* property_named(const std::string& name);
std::string unknown_property(const std::string& name);   // "unknown property 'x' (one of: ...)"
const Property& find_property(const std::string& name);  // throws mok::Error

// p's check with any std::exception the layer throws as its failure ("unexpected exception: ..."): the
// fuzz loop and --replay both run this, so a repro replays to the verdict that wrote it.
Verdict run_check(const Property& p, Backend& backend, const ref::Problem& problem, const CaseParams& params);

// The top-k ids a brute-force sort gives for one token: keys (score, plus bias in sigmoid mode)
// ordered by value, ties to the lower index; in sigmoid mode with groups, groups ranked by the sum
// of their two best keys the same way. bias may be null.
std::vector<int32_t> brute_force_topk(const LayerConfig& c, const float* scores, const float* bias);

// The invalid-input mutations the invalid_inputs property applies, in order.
std::vector<std::string> mutation_names();

}  // namespace mok::fuzz
