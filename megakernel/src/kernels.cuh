// The persistent kernels, and what their launch needs: the block size, the dynamic shared memory and
// the registers per thread (gemm_geometry.cuh), the parameters (params.cuh), and the layout arithmetic
// the host sizes their workspace with (dispatch_layout.h, saved_layout.h).
#pragma once

#include "gemm_geometry.cuh"
#include "mok/core/dispatch_layout.h"
#include "mok/core/saved_layout.h"
#include "params.cuh"

namespace mok::gpu {

__global__ void forward_kernel(const __grid_constant__ Params p);
__global__ void forward_fp8_kernel(const __grid_constant__ Params p);  // the fp8 mode's forward
// The backward's first phases (the saved layout's check; recompute mode's GEMM1s), then the backward.
__global__ void backward_prologue_kernel(const __grid_constant__ Params p);
__global__ void backward_prologue_fp8_kernel(const __grid_constant__ Params p);
__global__ void backward_kernel(const __grid_constant__ Params p);
__global__ void backward_fp8_kernel(const __grid_constant__ Params p);  // the fp8 mode's backward
// The forward and backward of paired blocks (LaunchConfig::paired_blocks), launched in clusters of two.
__global__ void forward_paired_kernel(const __grid_constant__ Params p);
__global__ void forward_fp8_paired_kernel(const __grid_constant__ Params p);
__global__ void backward_paired_kernel(const __grid_constant__ Params p);
__global__ void backward_fp8_paired_kernel(const __grid_constant__ Params p);
// Across GPUs with a shared expert, after the backward: its weight gradients' relayed chains.
__global__ void relayed_chains_kernel(const __grid_constant__ Params p);

}  // namespace mok::gpu
