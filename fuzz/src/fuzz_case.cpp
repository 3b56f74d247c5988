#include "mok/fuzz/fuzz_case.h"

#include <iterator>
#include <sstream>

#include "mok/golden/golden.h"

namespace mok::fuzz {
namespace {

constexpr const char* kFaultNames[] = {"none",
                                       "combine_order",
                                       "layout_off_by_one",
                                       "tie_higher_index",
                                       "drop_overflow",
                                       "router_grad_sign",
                                       "rank_combine_order",
                                       "ring_combine_order",
                                       "call_combine_order",
                                       "position_combine_order"};

}  // namespace

ref::Problem make_problem(const FuzzCase& fc) {
  return ref::make_problem(fc.config, fc.data_seed, fc.routing, fc.zipf_s);
}

std::string describe(const LayerConfig& c) {
  std::ostringstream os;
  os << "R=" << c.ranks << " T=" << c.tokens_per_rank << " E=" << c.experts << " k=" << c.top_k << " H=" << c.hidden
     << " I=" << c.intermediate << " Is=" << c.shared_intermediate << ' ' << golden::to_string(c.score_mode)
     << " renorm=" << c.renormalize;
  if (c.score_mode == ScoreMode::sigmoid)
    os << " n_group=" << c.n_group << " topk_group=" << c.topk_group << " scale=" << c.routed_scale;
  os << " limit=" << c.swiglu_limit;
  if (c.precision != Precision::bf16) os << ' ' << golden::to_string(c.precision);
  return os.str();
}

std::string describe(const FuzzCase& fc) {
  const ref::Options& o = fc.params.options;
  std::ostringstream os;
  os << describe(fc.config) << " routing=" << ref::to_string(fc.routing);
  if (fc.routing == ref::RoutingKind::zipf) os << " zipf_s=" << fc.zipf_s;
  os << " data_seed=" << fc.data_seed << " step=" << golden::to_string(o.step) << " ring_rows=" << o.ring_rows
     << " recompute=" << o.recompute;
  if (fc.config.precision == Precision::fp8) os << " fp8_weight_gradients=" << o.fp8_weight_gradients;
  os << " aux_seed=" << fc.params.aux_seed;
  if (o.fault != ref::Fault::none) os << " fault=" << to_string(o.fault);
  return os.str();
}

std::string to_string(ref::Fault fault) { return kFaultNames[int(fault)]; }

std::optional<ref::Fault> fault_named(const std::string& name) {
  for (int i = 0; i < int(std::size(kFaultNames)); ++i)
    if (name == kFaultNames[i]) return ref::Fault(i);
  return std::nullopt;
}

std::string unknown_fault(const std::string& name) { return "unknown fault " + quote_input(name); }

ref::Fault fault_from_string(const std::string& name) {
  if (const std::optional<ref::Fault> f = fault_named(name)) return *f;
  throw Error("mok-fuzz: " + unknown_fault(name));
}

const std::vector<ref::Fault>& all_faults() {
  static const std::vector<ref::Fault> faults = {
      ref::Fault::combine_order,      ref::Fault::layout_off_by_one,  ref::Fault::tie_higher_index,
      ref::Fault::drop_overflow,      ref::Fault::router_grad_sign,   ref::Fault::rank_combine_order,
      ref::Fault::ring_combine_order, ref::Fault::call_combine_order, ref::Fault::position_combine_order};
  return faults;
}

}  // namespace mok::fuzz
