// The paired blocks' fp8 forward kernel (forward.cuh; LaunchConfig::paired_blocks).
#include "forward.cuh"

namespace mok::gpu {

__global__ void __launch_bounds__(kThreads, 1) forward_fp8_paired_kernel(const __grid_constant__ Params p) {
  forward<true, true>(p);
  ptx::cluster_sync();  // neither block leaves while its peer may still reach its shared memory
}

}  // namespace mok::gpu
