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

// One compared step of `layer`: a step of `other` (its results left on the GPU: nothing read back), then one of
// `in` whose results are read back; with `accumulate` the second's weight gradients are added into the first's
// (GradOutputs::accumulate), else stored.
Step step_after(gpu::Megakernel& layer, const Inputs& other, const Inputs& in, bool accumulate) {
  layer.set_input(other.x, other.given());
  layer.launch_forward();
  layer.set_output_grad(other.dy);
  layer.launch_backward();
  Step s;
  s.fwd = layer.forward(in.x, in.given());
  s.grads = layer.backward(in.dy, accumulate);
  return s;
}

// What is wrong with got against the first step: an element no launch wrote, or the first difference; "" when
// nothing is.
std::string failure(const Step& got, const Step* first) {
  for (const std::string& poisoned : {first_poisoned_field(got.fwd), first_poisoned_field(got.grads)})
    if (!poisoned.empty()) return poisoned + " holds the poison: no launch wrote it";
  if (!first) return "";
  const std::string diff = first_step_mismatch(got.fwd, got.grads, first->fwd, first->grads);
  return diff.empty() ? "" : "differs from step 1 at " + diff + " (this step's bits first)";
}

}  // namespace

bool same_bits(const char* shape, const LayerConfig& c, const LayerWeights& weights, gpu::LaunchConfig launch,
               gpu::Megakernel& mk, const std::vector<Inputs>& inputs, int steps, bool accumulate) {
  const auto failed = [&](const std::string& which, const std::string& why) {
    std::printf("  same bits FAILED: %s: %s\n", which.c_str(), why.c_str());
    return false;
  };
  Step first;
  for (int i = 1; i <= steps; ++i) {
    std::fprintf(stderr, "%s: same-bits step %d of %d...\n", shape, i, steps);
    Step got = step_after(mk, inputs[1], inputs[0], accumulate);
    if (const std::string why = failure(got, i == 1 ? nullptr : &first); !why.empty())
      return failed("step " + std::to_string(i) + " of " + std::to_string(steps), why);
    if (i == 1) first = std::move(got);
  }
  // D3: another block count changes which block computes a tile, never how. Paired blocks come in twos.
  launch.blocks = mk.blocks() / 2 + 1;
  if (launch.paired_blocks) launch.blocks += launch.blocks % 2;
  std::fprintf(stderr, "%s: same-bits step on %d blocks...\n", shape, launch.blocks);
  gpu::Megakernel fewer(c, weights, launch);
  if (const std::string why = failure(step_after(fewer, inputs[1], inputs[0], accumulate), &first); !why.empty())
    return failed("the step on " + std::to_string(launch.blocks) + " blocks", why);
  std::printf(
      "  same bits: %d steps on input set 0 (each after one on set 1%s) and one on %d blocks (of %d): every result "
      "and gradient the first step's, bit for bit, and every element written\n",
      steps, accumulate ? ", set 0's weight gradients added into set 1's" : "", launch.blocks, mk.blocks());
  return true;
}

}  // namespace mok::bench
