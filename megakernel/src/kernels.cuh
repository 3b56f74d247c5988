// The persistent kernels and their phase bodies' shared pieces.
#pragma once

#include "device_common.cuh"
#include "grid_sync.cuh"

namespace mok::gpu {

__global__ void forward_kernel(const __grid_constant__ Params p);
__global__ void backward_kernel(const __grid_constant__ Params p);

}  // namespace mok::gpu
