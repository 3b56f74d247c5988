// Every CUDA runtime call is checked; a failure becomes mok::Error naming the call and the site.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "mok/core/config.h"

namespace mok::gpu {

// The runtime's last error is cleared first (where the error is not sticky): else a later check of
// cudaGetLastError(), mok's or the caller's, raised it again, blaming its own launch.
inline void check_cuda(cudaError_t status, const char* what, const char* file, int line) {
  if (status == cudaSuccess) return;
  cudaGetLastError();
  throw Error(std::string("mok: CUDA error at ") + file + ":" + std::to_string(line) + " (" + what +
              "): " + cudaGetErrorString(status));
}

// The CUDA devices this process sees: 0 where there is none to see (no device, or no driver at all: a build
// or CI machine), mok::Error for any other failure, so that a broken or too old driver fails loudly instead
// of passing for a machine without a GPU (its tests skipped in silence).
inline int cuda_device_count() {
  int n = 0;
  const cudaError_t status = cudaGetDeviceCount(&n);
  int driver = 0;  // cudaErrorInsufficientDriver is also an installed driver older than the runtime
  const bool no_driver =
      status == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0;
  if (status == cudaErrorNoDevice || no_driver) {
    cudaGetLastError();  // cleared: no later check blames a launch for it
    return 0;
  }
  check_cuda(status, "cudaGetDeviceCount", __FILE__, __LINE__);
  return n;
}

}  // namespace mok::gpu

#define MOK_CUDA_CHECK(call) ::mok::gpu::check_cuda((call), #call, __FILE__, __LINE__)
