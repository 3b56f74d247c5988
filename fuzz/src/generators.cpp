#include "mok/fuzz/generators.h"

#include <algorithm>
#include <vector>

namespace mok::fuzz {
namespace {

// rapidcheck's nominal size: inRange draws from its whole range at this size.
constexpr int kFullSize = 100;

// One of `options`, shrinking toward the first.
template <class T>
rc::Gen<T> pick(std::vector<T> options) {
  return rc::gen::map(rc::gen::inRange<size_t>(0, options.size()), [options](size_t i) { return options[i]; });
}

std::vector<int> divisors(int n, int most) {
  std::vector<int> out;
  for (int d = 1; d <= std::min(n, most); ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

constexpr int kMaxTokens = 160;  // N = R T: several of the layout's 32-token chunks, still fast

// Every draw has a fixed range and dependent values are clamped into validity afterwards, so shrinking
// one draw (say E) leaves the others (say k) where they were instead of redrawing them.
LayerConfig draw_config() {
  LayerConfig c;
  c.experts = *pick<int>({1, 2, 4, 8, 16, 3, 6, 12});
  const std::vector<int> ranks = divisors(c.experts, 8);
  // Index ranges as wide as the longest divisor lists (E = 12: five ranks up to 8, six groups), so that
  // every divisor can be drawn; shorter lists clamp the index.
  c.ranks = ranks[std::min<size_t>(*rc::gen::inRange<size_t>(0, 5), ranks.size() - 1)];
  c.tokens_per_rank = *pick<int>({1, 2, 3, 4, 5, 7, 8, 12, 16, 24, 33, 65});
  while (c.ranks * c.tokens_per_rank > kMaxTokens) c.tokens_per_rank = (c.tokens_per_rank + 1) / 2;
  // 448 and 320: past one 128 x 256 GPU tile, with partial last tiles (and a 64-wide last gate tile).
  c.hidden = *pick<int>({64, 128, 448});
  c.intermediate = *pick<int>({64, 128, 320});
  c.score_mode = *pick<ScoreMode>({ScoreMode::softmax, ScoreMode::sigmoid});
  const std::vector<int> groups = divisors(c.experts, c.experts);
  const size_t group_pick = *rc::gen::inRange<size_t>(0, 6);
  const int topk_group = *rc::gen::inRange(1, 17);
  const float routed_scale = *pick<float>({1.0f, 2.5f});
  int max_k = c.experts;
  if (c.score_mode == ScoreMode::sigmoid) {
    c.n_group = groups[std::min(group_pick, groups.size() - 1)];
    c.topk_group = std::min(topk_group, c.n_group);
    c.routed_scale = routed_scale;
    max_k = c.topk_group * (c.experts / c.n_group);
  }
  c.top_k = std::min(*rc::gen::inRange(1, 9), max_k);
  c.renormalize = *pick<bool>({true, false});
  c.swiglu_limit = *pick<float>({0.0f, 7.0f, 0.75f});
  c.shared_intermediate = *pick<int>({0, 64, 128, 192});
  c.precision = *pick<Precision>({Precision::bf16, Precision::bf16, Precision::bf16, Precision::fp8});
  if (c.precision == Precision::fp8)  // whole 128-wide scale blocks; at most two, the fp8 model is slow
    for (int32_t* width : {&c.hidden, &c.intermediate, &c.shared_intermediate})
      *width = std::min((*width + kFp8Block - 1) / kFp8Block * kFp8Block, 2 * kFp8Block);
  return c;
}

ref::Options draw_options() {
  ref::Options o;
  o.step = *pick<StepModel>({StepModel::fp32_fma, StepModel::fp32_fma, StepModel::fp32_fma, StepModel::hopper_tc});
  o.ring_rows = kStepK * *pick<int>({16, 1, 2, 3, 5, 8, 64});
  o.recompute = *pick<bool>({false, true});
  o.fp8_weight_gradients = *pick<bool>({false, true});  // read in the fp8 mode only
  return o;
}

FuzzCase draw_fuzz_case() {
  FuzzCase fc;
  fc.config = *gen_config();
  fc.routing = *gen_routing_kind();
  if (fc.routing == ref::RoutingKind::zipf) fc.zipf_s = *rc::gen::inRange(25, 400) / 100.0;
  fc.data_seed = *rc::gen::noShrink(rc::gen::arbitrary<uint64_t>());
  fc.params.options = *gen_options();
  fc.params.aux_seed = *rc::gen::noShrink(rc::gen::arbitrary<uint64_t>());
  return fc;
}

}  // namespace

rc::Gen<LayerConfig> gen_config() { return rc::gen::resize(kFullSize, rc::gen::exec(draw_config)); }

rc::Gen<ref::RoutingKind> gen_routing_kind() {
  using K = ref::RoutingKind;
  return pick<K>({K::uniform, K::router, K::router_ties, K::zipf, K::one_hot, K::all_to_one, K::sparse});
}

rc::Gen<ref::Options> gen_options() { return rc::gen::resize(kFullSize, rc::gen::exec(draw_options)); }

rc::Gen<FuzzCase> gen_fuzz_case() { return rc::gen::resize(kFullSize, rc::gen::exec(draw_fuzz_case)); }

void showValue(const FuzzCase& fc, std::ostream& os) { os << describe(fc); }

}  // namespace mok::fuzz
