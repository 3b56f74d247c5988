// The carried pushes' bf16 backward kernel (backward.cuh; LaunchConfig::carried_pushes).
#include "backward.cuh"

namespace mok::gpu {

__global__ void __launch_bounds__(kThreads, 1) backward_carried_kernel(const __grid_constant__ Params p) {
  backward<false, false, true>(p);
}

}  // namespace mok::gpu
