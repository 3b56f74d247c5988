// The carried pushes' bf16 forward kernel (forward.cuh; LaunchConfig::carried_pushes).
#include "forward.cuh"

namespace mok::gpu {

__global__ void __launch_bounds__(kThreads, 1) forward_carried_kernel(const __grid_constant__ Params p) {
  forward<false, false, true>(p);
}

}  // namespace mok::gpu
