// mok-bench --same-bits N (bench.cpp): the determinism contract's run to run (D1) and launch (D3) points
// checked at a benchmark shape's full size, beyond the small layers of the GPU tests: N training steps of
// one input set give the same bits, and so does a layer on other blocks (docs/determinism.md).
#pragma once

#include <vector>

#include "bench_common.h"
#include "mok/megakernel/megakernel.h"

namespace mok::bench {

// N steps of mk (the forward, then the backward) on inputs[0], each after a step on inputs[1] (at least two
// sets: a step that found the last step's buffers already holding its results would agree by chance), every
// result and gradient compared bit for bit with the first step's and none left unwritten (first_poisoned_field);
// then the same step by a layer of the same weights on about half of mk's blocks. With `accumulate` each
// step's weight gradients are added into those of the step before it (GradOutputs::accumulate), else stored.
// Holds two steps' results on the host (kimi-k2's: about 6 GB each) and, for the last step, a second layer on
// the GPU. Prints a line (and progress to stderr); false at the first failure, which the line names.
bool same_bits(const char* shape, const LayerConfig& c, const LayerWeights& weights, gpu::LaunchConfig launch,
               gpu::Megakernel& mk, const std::vector<Inputs>& inputs, int steps, bool accumulate);

}  // namespace mok::bench
