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
    // Unchecked: a destructor cannot throw, and a device that was current a moment ago takes it back.
    if (device_ >= 0) (void)cudaSetDevice(device_);
  }
  KeepCurrentDevice(const KeepCurrentDevice&) = delete;
  KeepCurrentDevice& operator=(const KeepCurrentDevice&) = delete;

 private:
  int device_ = -1;
};

}  // namespace mok::gpu
