// The built-in catalogue of golden cases (docs/golden-format.md lists it) and the key = value case
// file that `mok-golden generate --config` reads.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "mok/golden/golden.h"

namespace mok::golden {

// Everything that makes a golden from scratch.
struct CaseSpec {
  std::string name;
  std::string description;
  LayerConfig config;
  ref::Options options;
  Recipe recipe;
};

const std::vector<CaseSpec>& catalogue();
const CaseSpec* find_case(const std::string& name);  // nullptr if the catalogue has no such case
const CaseSpec& builtin_case();                      // the small default of `mok-golden check --builtin`

// A case file: one `key = value` a line, `#` starts a comment. Keys (default in brackets):
//   name [the file's stem], description [""]
//   ranks [1], tokens_per_rank [1], experts [1], hidden [64], intermediate [64], top_k [1],
//   score_mode [softmax|sigmoid], renormalize [true], n_group [1], topk_group [1], routed_scale [1],
//   swiglu_limit [0], shared_intermediate [0], precision [bf16|fp8]
//   step [hopper_tc|fp32_fma], ring_rows [256], recompute [false]
//   seed [1], routing [router|router_ties|uniform|zipf|one_hot|all_to_one|sparse], zipf_s [1.2]
// Unknown keys, repeated keys and malformed values are mok::Error naming the file and line.
CaseSpec parse_case_file(const std::filesystem::path& path);
CaseSpec parse_case_text(const std::string& text, const std::string& source, const std::string& default_name);

GoldenCase make_case(const CaseSpec& spec);

}  // namespace mok::golden
