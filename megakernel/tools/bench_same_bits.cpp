#include "bench_same_bits.h"

#include <cstdio>
#include <string>
#include <utility>

#include "mok/core/fields.h"

namespace mok::bench {
namespace {

struct Step {
  Forward fwd;
  Gradients grads;
};

Step step(gpu::Megakernel& mk, const Inputs& in) {
  Step s;
  s.fwd = mk.forward(in.x, in.given());
  s.grads = mk.backward(in.dy);
  return s;
}

// The first difference of got from first (every field), or got's first unwritten element; "" when none.
std::string first_difference(const Step& got, const Step& first) {
  for (const std::string& poisoned : {first_poisoned_field(got.fwd), first_poisoned_field(got.grads)})
    if (!poisoned.empty()) return poisoned + " holds the poison: no launch wrote it";
  const std::string diff = first_field_mismatch(got.fwd, first.fwd);
  return diff.empty() ? first_field_mismatch(got.grads, first.grads) : diff;
}

}  // namespace

bool same_bits(const char* shape, const LayerConfig& c, const LayerWeights& weights, gpu::LaunchConfig launch,
               gpu::Megakernel& mk, const std::vector<Inputs>& inputs, int steps) {
  const Inputs& other = inputs.size() > 1 ? inputs[1] : inputs[0];
  const auto differs = [&](const std::string& which, const std::string& diff) {
    std::printf("  same bits: %s DIFFERS from step 1: %s\n", which.c_str(), diff.c_str());
    return false;
  };
  Step first;
  for (int i = 1; i <= steps; ++i) {
    std::fprintf(stderr, "%s: same-bits step %d of %d...\n", shape, i, steps);
    step(mk, other);
    Step got = step(mk, inputs[0]);
    if (const std::string diff = first_difference(got, i == 1 ? got : first); !diff.empty())
      return differs("step " + std::to_string(i) + " of " + std::to_string(steps), diff);
    if (i == 1) first = std::move(got);
  }
  // D3: another block count changes which block computes a tile, never how. Paired blocks come in twos.
  launch.blocks = mk.blocks() / 2 + 1;
  if (launch.paired_blocks) launch.blocks += launch.blocks % 2;
  std::fprintf(stderr, "%s: same-bits step on %d blocks...\n", shape, launch.blocks);
  gpu::Megakernel fewer(c, weights, launch);
  if (const std::string diff = first_difference(step(fewer, inputs[0]), first); !diff.empty())
    return differs("the step on " + std::to_string(launch.blocks) + " blocks", diff);
  std::printf(
      "  same bits: %d steps on input set 0 (each after one on set %d) and one on %d blocks (of %d): every result "
      "and gradient the first step's, bit for bit, and every element written\n",
      steps, inputs.size() > 1 ? 1 : 0, launch.blocks, mk.blocks());
  return true;
}

}  // namespace mok::bench
