// The calling thread's current CUDA device, restored when this guard goes (host calls that switch
// GPUs leave the caller's device as they found it, also when they throw).
#pragma once

#include <cuda_runtime.h>

namespace mok::gpu {

class KeepCurrentDevice {
 public:
  KeepCurrentDevice() {
    if (cudaGetDevice(&device_) != cudaSuccess) device_ = -1, cudaGetLastError();  // no device: nothing to keep
  }
  ~KeepCurrentDevice() {
    if (device_ >= 0) cudaSetDevice(device_);
  }
  KeepCurrentDevice(const KeepCurrentDevice&) = delete;
  KeepCurrentDevice& operator=(const KeepCurrentDevice&) = delete;

 private:
  int device_ = -1;
};

}  // namespace mok::gpu
