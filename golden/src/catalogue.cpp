#include "mok/golden/catalogue.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <type_traits>

#include "mok/core/fields.h"
#include "mok/golden/file_kind.h"

namespace mok::golden {
namespace {

// mok-golden generate holds up to 4.7 times a case's tensors at once (the reference's working copies, the fp64
// oracle's, the file's image: 3.8-4.7 measured on cases of mostly weights, mostly tokens and both).
constexpr double kGenerateCopies = 5;

struct Shape {
  int ranks, tokens_per_rank, experts, top_k, hidden = 64, intermediate = 64;
};

LayerConfig config_of(const Shape& s) {
  LayerConfig c;
  c.ranks = s.ranks;
  c.tokens_per_rank = s.tokens_per_rank;
  c.experts = s.experts;
  c.top_k = s.top_k;
  c.hidden = s.hidden;
  c.intermediate = s.intermediate;
  return c;
}

ref::Options options_of(int ring_rows, bool recompute) {
  ref::Options o;
  o.ring_rows = ring_rows;
  o.recompute = recompute;
  return o;
}

std::vector<CaseSpec> build_catalogue() {
  using ref::RoutingKind;
  const ref::Options plain;
  std::vector<CaseSpec> cases;

  LayerConfig smoke = config_of({2, 16, 4, 2});
  smoke.shared_intermediate = 64;
  cases.push_back({"smoke", "builtin default: R=2, softmax router, shared expert", smoke, plain, {1}});

  LayerConfig sigmoid = config_of({2, 24, 8, 3});
  sigmoid.score_mode = ScoreMode::sigmoid;
  sigmoid.n_group = 4;
  sigmoid.topk_group = 2;
  sigmoid.routed_scale = 2.5f;
  cases.push_back(
      {"sigmoid_grouped", "sigmoid scores + bias, 4 groups keep 2, k=3, routed_scale 2.5", sigmoid, plain, {2}});

  LayerConfig shared = config_of({2, 24, 4, 2});
  shared.shared_intermediate = 128;
  shared.renormalize = false;
  cases.push_back({"shared_no_renorm", "shared expert (Is=128), softmax weights not renormalised", shared, plain, {3}});

  LayerConfig clamped = config_of({1, 48, 4, 2});
  clamped.swiglu_limit = 0.5f;
  cases.push_back({"clamped_swiglu",
                   "R=1, clamped SwiGLU with limit 0.5 (clamps a large share of gate and up)",
                   clamped,
                   plain,
                   {4}});

  cases.push_back({"ranks_8",
                   "R=8, one expert per rank, recompute mode, 16-row ring",
                   config_of({8, 8, 8, 2}),
                   options_of(16, true),
                   {5}});

  cases.push_back({"zipf",
                   "R=4, given routing, Zipf-skewed (s=1.5), 32-row ring",
                   config_of({4, 32, 4, 2}),
                   options_of(32, false),
                   {6, RoutingKind::zipf, 1.5}});

  cases.push_back({"all_to_one",
                   "given routing: all 78 tokens to expert 0 (k=1), experts 1-3 get none",
                   config_of({2, 39, 4, 1}),
                   options_of(32, false),
                   {7, RoutingKind::all_to_one}});

  cases.push_back({"zero_token_experts",
                   "given routing: only experts 0 and 4 of 8 receive tokens",
                   config_of({2, 32, 8, 2}),
                   plain,
                   {8, RoutingKind::sparse}});

  cases.push_back({"score_ties",
                   "router with expert pairs of equal rows: exact score ties, k=3 splits a pair",
                   config_of({2, 32, 4, 3}),
                   plain,
                   {9, RoutingKind::router_ties}});

  cases.push_back({"single_token", "T=1 on each of 2 ranks", config_of({2, 1, 4, 2}), plain, {10}});

  LayerConfig medium = config_of({4, 128, 8, 4, 128, 64});
  medium.shared_intermediate = 64;
  cases.push_back({"medium",
                   "512 tokens (16 layout chunks), 2048 routed rows, shared expert, 64-row ring",
                   medium,
                   options_of(64, false),
                   {11}});

  // The FP8 mode (issue 19): H, I and Is multiples of 128, the scale blocks.
  LayerConfig fp8 = config_of({2, 16, 4, 2, 128, 128});
  fp8.precision = Precision::fp8;
  cases.push_back({"fp8_smoke", "fp8 mode: R=2, softmax router", fp8, plain, {12}});

  LayerConfig fp8_zipf = config_of({4, 32, 4, 2, 128, 128});
  fp8_zipf.precision = Precision::fp8;
  cases.push_back({"fp8_zipf",
                   "fp8 mode: R=4, given Zipf-skewed routing (s=1.5), recompute mode, 32-row ring",
                   fp8_zipf,
                   options_of(32, true),
                   {13, RoutingKind::zipf, 1.5}});

  LayerConfig fp8_shared = config_of({2, 24, 4, 2, 256, 128});
  fp8_shared.precision = Precision::fp8;
  fp8_shared.shared_intermediate = 128;
  fp8_shared.score_mode = ScoreMode::sigmoid;
  fp8_shared.n_group = 2;
  fp8_shared.routed_scale = 2.5f;
  fp8_shared.swiglu_limit = 0.75f;
  cases.push_back({"fp8_shared",
                   "fp8 mode: H=256 (two K blocks per GEMM), shared expert, sigmoid, clamped SwiGLU",
                   fp8_shared,
                   plain,
                   {14}});
  return cases;
}

[[noreturn]] void bad_line(const std::string& source, int line, const std::string& what) {
  throw Error("mok: " + source + ":" + std::to_string(line) + ": " + what);
}

// A float value of -0 read as +0. It means the layer 0 means (a limit or exponent of -0 is 0's), but a
// golden's content hash takes a float by its bits: -0 gave two case files of one layer two hashes.
// Normalised rather than refused: "-0" is a valid number a script may well write, and it means 0.
double without_negative_zero(double d) { return d == 0 ? 0.0 : d; }

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

}  // namespace

const std::vector<CaseSpec>& catalogue() {
  static const std::vector<CaseSpec> cases = build_catalogue();
  return cases;
}

const CaseSpec* find_case(const std::string& name) {
  for (const CaseSpec& c : catalogue())
    if (c.name == name) return &c;
  return nullptr;
}

const CaseSpec& builtin_case() { return catalogue().front(); }

CaseSpec parse_case_text(const std::string& text, const std::string& source, const std::string& default_name) {
  CaseSpec spec;
  spec.name = default_name;
  std::map<std::string, int> seen;
  std::istringstream in(text);
  std::string raw;
  for (int line = 1; std::getline(in, raw); ++line) {
    const std::string content = trim(raw.substr(0, raw.find('#')));
    if (content.empty()) continue;
    const size_t eq = content.find('=');
    if (eq == std::string::npos) bad_line(source, line, "expected key = value, got " + quote_input(content));
    const std::string key = trim(content.substr(0, eq)), value = trim(content.substr(eq + 1));
    if (seen.count(key)) bad_line(source, line, "key " + key + " repeats line " + std::to_string(seen[key]));
    seen[key] = line;
    const auto bad = [&](const std::string& want) {
      bad_line(source, line, key + " = " + quote_input(value) + ": expected " + want);
    };
    const auto integer = [&](int32_t& out) {
      if (!parse_whole_number(value, out)) bad("an integer");
    };
    const auto real = [&](float& out) {
      double d;
      if (!parse_whole_number(value, d)) bad("a number");
      if (const std::string why = float32_problem(d); !why.empty()) bad("a float32 value, but it " + why);
      out = float(without_negative_zero(d));
    };
    const auto flag = [&](bool& out) {
      if (value != "true" && value != "false") bad("true or false");
      out = value == "true";
    };
    try {
      bool config_key = false;  // a field of the config (mok/core/fields.h), parsed by its type
      for_each_field(spec.config, [&](const char* name, auto& field) {
        using T = std::remove_reference_t<decltype(field)>;
        if (key != name) return;
        config_key = true;
        if constexpr (std::is_same_v<T, ScoreMode>)
          field = score_mode_from_string(value);
        else if constexpr (std::is_same_v<T, Precision>)
          field = precision_from_string(value);
        else if constexpr (std::is_same_v<T, float>)
          real(field);
        else if constexpr (std::is_same_v<T, bool>)
          flag(field);
        else
          integer(field);
      });
      if (config_key) continue;
      if (key == "name")
        spec.name = value;
      else if (key == "description") {
        // Refused here, not after the case's computation when the file is written: an HDF5 string ends at one.
        if (value.find('\0') != std::string::npos) bad("text without a NUL byte");
        spec.description = value;
      } else if (key == "step")
        spec.options.step = step_model_from_string(value);
      else if (key == "ring_rows")
        integer(spec.options.ring_rows);
      else if (key == "recompute")
        flag(spec.options.recompute);
      else if (key == "seed") {
        if (!parse_whole_number(value, spec.recipe.seed)) bad("an unsigned 64-bit integer");
      } else if (key == "routing")
        spec.recipe.routing = ref::routing_kind_from_string(value);
      else if (key == "zipf_s") {
        if (!parse_whole_number(value, spec.recipe.zipf_s)) bad("a number");
        spec.recipe.zipf_s = without_negative_zero(spec.recipe.zipf_s);
        ref::validate_zipf_s(spec.recipe.zipf_s);
      } else
        bad_line(source, line, "unknown key " + quote_input(key) + " (the keys are listed in docs/golden-format.md)");
    } catch (const Error& e) {
      if (std::string(e.what()).rfind("mok: " + source + ":", 0) == 0) throw;
      bad_line(source, line, reason_of(e));
    }
  }
  if (spec.name.empty()) throw Error("mok: " + source + ": the case has no name");
  try {
    validate_case_name(spec.name, "name");
    validate_ring_rows(spec.options.ring_rows);
    validate(spec.config);
    require_fits_in_memory(spec.config, kGenerateCopies);
  } catch (const Error& e) {
    throw Error("mok: " + source + ": " + reason_of(e));
  }
  return spec;
}

CaseSpec parse_case_file(const std::filesystem::path& path) {
  // Checked before opening: a directory reads as empty text (a case of all defaults), a FIFO blocks.
  if (const std::string kind = not_a_regular_file(path); !kind.empty())
    throw Error("mok: case file " + display_name(path.string()) + ": " + kind);
  // A case is a few lines: a larger file (a golden or a log given by mistake) was read whole, its memory blamed on
  // the case's tensors.
  constexpr uintmax_t kMaxBytes = 1 << 20;
  std::error_code size_error;
  if (const uintmax_t bytes = std::filesystem::file_size(path, size_error); !size_error && bytes > kMaxBytes)
    throw Error("mok: case file " + display_name(path.string()) + " is " + std::to_string(bytes) +
                " bytes: a case file is key = value lines, at most " + std::to_string(kMaxBytes) + " bytes");
  std::ifstream in(path);
  if (!in) throw Error("mok: cannot read case file " + display_name(path.string()) + ": " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error("mok: cannot read case file " + display_name(path.string()));
  return parse_case_text(text.str(), display_name(path.string()), path.stem().string());
}

GoldenCase make_case(const CaseSpec& spec) {
  GoldenCase g = make_case(spec.name, spec.config, spec.options, spec.recipe);
  g.description = spec.description;
  return g;
}

}  // namespace mok::golden
