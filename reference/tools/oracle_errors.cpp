// Measures the reference's error against the fp64 oracle, per tensor, for both K-step models over
// a fixed set of configurations, then in the fp8 mode over those whose shapes it takes (H, I, Is
// multiples of 128; not issue 2's size, whose fp8 GEMMs take minutes on the reference), and prints the
// markdown tables of docs/accuracy.md. Exit status 1 when any tensor exceeds its oracle_bound.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "mok/core/tool_exit.h"
#include "mok/reference/oracle.h"
#include "mok/reference/problem.h"

namespace {

using namespace mok;
using namespace mok::ref;

struct Case {
  std::string name;
  LayerConfig config;
  RoutingKind routing;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  out.push_back({"softmax, renormalised", make_config(4, 64, 256, 128, 16, 4), RoutingKind::router});
  LayerConfig plain = make_config(4, 64, 256, 128, 16, 4);
  plain.renormalize = false;
  plain.shared_intermediate = 128;
  out.push_back({"softmax, not renormalised, shared expert", plain, RoutingKind::router});
  LayerConfig grouped = make_config(4, 64, 256, 128, 16, 4);
  grouped.score_mode = ScoreMode::sigmoid;
  grouped.n_group = 4;
  grouped.topk_group = 2;
  grouped.routed_scale = 2.5f;
  grouped.shared_intermediate = 128;
  out.push_back({"sigmoid, 4 groups keep 2, scale 2.5, shared expert", grouped, RoutingKind::router});
  LayerConfig clamped = make_config(4, 64, 256, 128, 16, 4);
  clamped.swiglu_limit = 0.75f;
  clamped.shared_intermediate = 64;
  out.push_back({"softmax, clamped SwiGLU (limit 0.75), shared expert", clamped, RoutingKind::router});
  out.push_back({"given zipf routing", make_config(4, 64, 256, 128, 16, 4), RoutingKind::zipf});
  out.push_back(
      {"issue 2 size: R=4 T=512 H=512 I=256 E=16 k=4", make_config(4, 512, 512, 256, 16, 4), RoutingKind::router});
  return out;
}

const char* step_name(StepModel s) { return s == StepModel::hopper_tc ? "hopper_tc" : "fp32_fma"; }

constexpr int kMostFp8Tokens = 256;  // issue 2's 2048 tokens take minutes in the reference's FP8 model

// Whether the case runs in fp8 too: shapes the fp8 mode takes (H, I, Is multiples of 128), not too large.
bool takes_fp8(LayerConfig c) {
  c.precision = Precision::fp8;
  try {
    validate(c);
  } catch (const Error&) {
    return false;
  }
  return c.tokens() <= kMostFp8Tokens;
}

// The cases in this precision: all of them in bf16, those takes_fp8 accepts in fp8.
std::vector<Case> cases(Precision precision) {
  std::vector<Case> out;
  for (Case cs : cases()) {
    if (precision == Precision::fp8 && !takes_fp8(cs.config)) continue;
    cs.config.precision = precision;
    if (precision == Precision::fp8) cs.name += ", fp8";
    out.push_back(cs);
  }
  return out;
}

// Options::fp8_weight_gradients beside the default bf16 weight gradients: the routed experts' dW1, dW2
// against the oracle (not held to a bound: the measurement behind keeping bf16 the default).
void print_fp8_weight_gradients(const Case& cs, const Problem& p, const Routing* given) {
  Options opt;  // hopper_tc
  opt.ring_rows = 1 << 20;
  opt.fp8_weight_gradients = true;
  const Forward f = forward(cs.config, p.x, p.weights, given, opt);
  const Gradients g = backward(cs.config, p.x, p.weights, f, p.dy, opt);
  for (const OracleCheck& ch : compare_with_oracle(f, g, oracle(oracle_inputs(cs.config, p.x, p.weights, p.dy, f))))
    if (ch.tensor == OracleTensor::d_w1 || ch.tensor == OracleTensor::d_w2)
      std::printf("| %s | fp8 operands (option) | %.2e | %.2e | %.2e%s |\n", to_string(ch.tensor), ch.error.relative,
                  ch.error.max_ref > 0 ? ch.error.max_abs / ch.error.max_ref : 0.0, ch.bound,
                  ch.passed() ? "" : " exceeded");
}

}  // namespace

int tool_main(int argc, char** argv) {
  // It takes no arguments and runs for minutes: a --help, or anything else, must not start it.
  if (argc > 1) {
    const bool help = argc == 2 && (std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help");
    std::fprintf(help ? stdout : stderr,
                 "usage: mok_oracle_errors   (no arguments: the reference against the fp64 oracle, the tables of "
                 "docs/accuracy.md; minutes)\n");
    return help ? 0 : 2;
  }
  bool all_passed = true;
  // worst[model][tensor] = (relative, max_abs / max_ref) over the cases
  std::map<std::string, std::map<int, std::pair<double, double>>> worst;
  for (const Precision precision : {Precision::bf16, Precision::fp8}) {
    for (const Case& cs : cases(precision)) {
      const Problem p = make_problem(cs.config, 7, cs.routing);
      const Routing* given = p.routing ? &*p.routing : nullptr;
      std::printf("\n### %s\n\n| tensor | step | relative | max_abs / max_ref | bound |\n|---|---|---|---|---|\n",
                  cs.name.c_str());
      for (StepModel step : {StepModel::fp32_fma, StepModel::hopper_tc}) {
        Options opt;
        opt.step = step;
        const Forward f = forward(cs.config, p.x, p.weights, given, opt);
        const Gradients g = backward(cs.config, p.x, p.weights, f, p.dy, opt);
        const OracleResult o = oracle(oracle_inputs(cs.config, p.x, p.weights, p.dy, f));
        for (const OracleCheck& ch : compare_with_oracle(f, g, o)) {
          const double max_rel = ch.error.max_ref > 0 ? ch.error.max_abs / ch.error.max_ref : 0.0;
          std::printf("| %s | %s | %.2e | %.2e | %.2e%s |\n", to_string(ch.tensor), step_name(step), ch.error.relative,
                      max_rel, ch.bound, ch.passed() ? "" : " EXCEEDED");
          auto& w = worst[step_name(step)][int(ch.tensor)];
          w = {std::max(w.first, ch.error.relative), std::max(w.second, max_rel)};
          all_passed = all_passed && ch.passed();
        }
      }
      if (precision == Precision::fp8) print_fp8_weight_gradients(cs, p, given);
    }
    std::printf(
        "\n### Worst over all cases, %s\n\n| tensor | bound | fp32_fma relative | fp32_fma max | hopper_tc relative "
        "| hopper_tc max |\n|---|---|---|---|---|---|\n",
        precision == Precision::fp8 ? "fp8" : "bf16");
    for (const auto& [tensor, fp32] : worst["fp32_fma"]) {
      const auto& tc = worst["hopper_tc"][tensor];
      std::printf("| %s | %.2e | %.2e | %.2e | %.2e | %.2e |\n", to_string(OracleTensor(tensor)),
                  oracle_bound(OracleTensor(tensor), precision), fp32.first, fp32.second, tc.first, tc.second);
    }
    worst.clear();
  }
  return all_passed ? 0 : 1;
}

// A report lost to a full disk or a closed pipe is no success.
int main(int argc, char** argv) { return mok::tool_exit_status("mok_oracle_errors", tool_main(argc, argv)); }
