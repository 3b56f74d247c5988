// Every CUDA runtime call is checked; a failure becomes mok::Error naming the call and the site.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "mok/core/config.h"

namespace mok::gpu {

inline void check_cuda(cudaError_t status, const char* what, const char* file, int line) {
  if (status != cudaSuccess)
    throw Error(std::string("mok: CUDA error at ") + file + ":" + std::to_string(line) + " (" + what +
                "): " + cudaGetErrorString(status));
}

}  // namespace mok::gpu

#define MOK_CUDA_CHECK(call) ::mok::gpu::check_cuda((call), #call, __FILE__, __LINE__)
