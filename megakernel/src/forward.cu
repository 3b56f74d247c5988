// The bf16 forward kernel (forward.cuh).
#include "forward.cuh"

namespace mok::gpu {

__global__ void __launch_bounds__(kThreads, 1) forward_kernel(const __grid_constant__ Params p) {
  forward<false, false>(p);
}

}  // namespace mok::gpu
