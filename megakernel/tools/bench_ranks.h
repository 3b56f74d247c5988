// mok-bench --gpus G: each shape over G processes, one rank per GPU on an NCCL communicator (the device
// API's communicator constructor), T tokens per rank; for G > 1 also on one GPU, for the scaling.
#pragma once

#include "bench_common.h"
#include "mok/megakernel/layer.h"
#include "mok/reference/problem.h"

namespace mok::bench {

// The process's exit code (mok/tools/process_ranks.h): 0 measured, 1 a rank failed, 77 no Hopper GPU.
int bench_over_processes(const Options& o, ref::RoutingKind kind, const gpu::LaunchConfig& base);

}  // namespace mok::bench
