// The paired blocks' bf16 backward kernel (backward.cuh; LaunchConfig::paired_blocks).
#include "backward.cuh"

namespace mok::gpu {

__global__ void __launch_bounds__(kThreads, 1) backward_paired_kernel(const __grid_constant__ Params p) {
  backward<false, true>(p);
  ptx::cluster_sync();  // neither block leaves while its peer may still reach its shared memory
}

}  // namespace mok::gpu
