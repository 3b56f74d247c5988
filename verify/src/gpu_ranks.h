// The gpu backend across processes: a problem's forward and backward over launch.gpus processes, one
// per GPU (mok/tools/process_ranks.h), each on its share; the results assembled in global terms.
#pragma once

#include "mok/golden/golden.h"
#include "mok/megakernel/layer.h"

namespace mok::verify {

// Throws NoGpu without any Hopper GPU, mok::Error when a rank fails (named on stderr) or when the ranks'
// copies of a result every rank computes whole differ.
golden::LayerResults run_over_processes(const ref::Problem& p, const gpu::LaunchConfig& launch, double timeout_s);

}  // namespace mok::verify
