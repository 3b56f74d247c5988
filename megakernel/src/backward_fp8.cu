// The fp8 mode's backward kernels (backward.cuh).
#include "backward.cuh"

namespace mok::gpu {

__global__ void __launch_bounds__(kThreads, 1) backward_prologue_fp8_kernel(const __grid_constant__ Params p) {
  backward_prologue<true>(p);
}
__global__ void __launch_bounds__(kThreads, 1) backward_fp8_kernel(const __grid_constant__ Params p) {
  backward<true, false>(p);
}

}  // namespace mok::gpu
