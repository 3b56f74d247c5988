#include "mok/fuzz/repro.h"

#include <optional>
#include <sstream>

#include "mok/core/validate.h"
#include "mok/fuzz/properties.h"
#include "mok/golden/golden.h"

namespace mok::fuzz {
namespace {

// The description's last line carries the replay parameters as key=value words.
constexpr const char* kParamsTag = "mok-fuzz:";

// A key given once: given twice, the first won and the second was ignored (another case's value read silently).
std::string value_of(const std::string& params, const std::string& key, const std::filesystem::path& file) {
  std::istringstream words(params);
  std::optional<std::string> value;
  for (std::string word; words >> word;) {
    if (word.rfind(key + "=", 0) != 0) continue;
    if (value)
      throw Error("mok-fuzz: " + display_name(file.string()) + " is no mok-fuzz repro: its description gives " + key +
                  "= twice");
    value = word.substr(key.size() + 1);
  }
  if (!value)
    throw Error("mok-fuzz: " + display_name(file.string()) + " is no mok-fuzz repro: its description lacks " + key +
                "=");
  return *value;
}

}  // namespace

void write_repro(const std::filesystem::path& file, const std::string& property, const FuzzCase& fc,
                 const std::string& failure) {
  ref::Options fault_free = fc.params.options;
  fault_free.fault = ref::Fault::none;
  golden::GoldenCase g = golden::make_case("fuzz-" + property, make_problem(fc), fault_free);
  g.description = "mok-fuzz counterexample of property " + property + ": " + failure + "\ncase: " + describe(fc) +
                  "\n" + kParamsTag + " property=" + property + " aux_seed=" + std::to_string(fc.params.aux_seed) +
                  " fault=" + to_string(fc.params.options.fault);
  golden::write_golden(file, g);
}

Repro read_repro(const std::filesystem::path& file) {
  const golden::GoldenCase g = golden::read_golden(file);
  // The tag starts the description's last line, as write_repro puts it (found anywhere, a word of the
  // failure's text could have been taken for it).
  const size_t tag = g.description.rfind(kParamsTag);
  if (tag == std::string::npos || (tag > 0 && g.description[tag - 1] != '\n') ||
      g.description.find('\n', tag) != std::string::npos)
    throw Error("mok-fuzz: " + display_name(file.string()) + " is a golden file but no mok-fuzz repro (no '" +
                kParamsTag + "' line ending its description)");
  const std::string params = g.description.substr(tag);
  Repro r;
  const std::string property = value_of(params, "property", file), fault = value_of(params, "fault", file),
                    aux = value_of(params, "aux_seed", file);
  r.problem = golden::problem_of(g);
  r.params.options = g.options;
  // A value this build does not know is the file's error, named with it.
  const auto refuse = [&](const std::string& why) {
    return Error("mok-fuzz: " + display_name(file.string()) + ": " + why);
  };
  const Property* p = property_named(property);
  if (!p) throw refuse(unknown_property(property));
  const std::optional<ref::Fault> f = fault_named(fault);
  if (!f) throw refuse(unknown_fault(fault));
  r.property = p->name;
  r.params.options.fault = *f;
  // Strictly the whole word, as --seed: stoull took "-1" as 2^64 - 1 and "12x" as 12, another case.
  if (!parse_whole_number(aux, r.params.aux_seed)) throw refuse("aux_seed " + quote_input(aux) + " is not a number");
  // Stored inputs the layer refuses are the file's error, as mok-golden and mok-verify say (exit 2), not a
  // property's failure: write_repro stores a case the reference ran (invalid_inputs mutates its own copies).
  try {
    const ref::Problem& pr = r.problem;
    validate_inputs(pr.config, pr.x, pr.weights, pr.routing ? &*pr.routing : nullptr, r.params.options.replay_ids);
    validate_tokens(pr.config, pr.dy, "dy [N, H]");
  } catch (const Error& e) {
    throw refuse("its stored inputs: " + reason_of(e));
  }
  r.description = g.description;
  return r;
}

Verdict replay(Backend& backend, const Repro& repro) {
  CaseParams params = repro.params;
  if (const auto step = backend.fixed_step()) params.options.step = *step;
  return run_check(find_property(repro.property), backend, repro.problem, params);
}

}  // namespace mok::fuzz
