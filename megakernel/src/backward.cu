// The bf16 backward's kernels (backward.cuh), and the relayed chains' kernel across GPUs.
#include "backward.cuh"

namespace mok::gpu {

__global__ void __launch_bounds__(kThreads, 1) backward_prologue_kernel(const __grid_constant__ Params p) {
  backward_prologue<false>(p);
}
__global__ void __launch_bounds__(kThreads, 1) backward_kernel(const __grid_constant__ Params p) {
  backward<false, false>(p);
}

// Across GPUs, after the backward kernel, which leaves them out: the shared expert's weight gradients,
// whose chains run GPU after GPU (relayed_shared_weight_grads). A kernel of their own: in the backward
// kernel, their tile phase (a chain continued from loaded accumulators) raised its register pressure
// and spilled in the other phases' epilogues.
__global__ void __launch_bounds__(kThreads, 1) relayed_chains_kernel(const __grid_constant__ Params p) {
  // After the backward stopped on an error (or a peer's abort) nothing is relayed: the peers meet the
  // abort mark in their waits.
  if (__syncthreads_or(error_recorded(p.barrier))) return;
  Pipeline pipe = pipeline_init();
  relayed_shared_weight_grads<false>(pipe, p);
  if (p.barrier.peers.me < p.barrier.peers.gpus - 1) relayed_shared_weight_grads<true>(pipe, p);
}

}  // namespace mok::gpu
