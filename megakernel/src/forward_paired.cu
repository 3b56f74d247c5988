// The paired blocks' bf16 forward kernel (forward.cuh; LaunchConfig::paired_blocks).
#include "forward.cuh"

namespace mok::gpu {

__global__ void __launch_bounds__(kThreads, 1) forward_paired_kernel(const __grid_constant__ Params p) {
  forward<false, true>(p);
  ptx::cluster_sync();  // neither block leaves while its peer may still reach its shared memory
}

}  // namespace mok::gpu
