// The fp8 mode's forward kernel (forward.cuh).
#include "forward.cuh"

namespace mok::gpu {

__global__ void __launch_bounds__(kThreads, 1) forward_fp8_kernel(const __grid_constant__ Params p) {
  forward<true, false>(p);
}

}  // namespace mok::gpu
