#include "mok/megakernel/device_tensor.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <utility>

#include "mok/megakernel/check.h"

namespace mok::gpu {

DeviceTensor::DeviceTensor(DType dtype, std::vector<int64_t> shape) : bytes_(tensor_bytes(dtype, shape)) {
  if (bytes_) MOK_CUDA_CHECK(cudaMalloc(&view_.data, bytes_));
  view_.dtype = dtype;
  view_.shape = std::move(shape);
}

DeviceTensor::~DeviceTensor() {
  // A destructor cannot throw; a failed free is worth a line, not an abort.
  if (view_.data && cudaFree(view_.data) != cudaSuccess) std::fprintf(stderr, "mok: cudaFree of a tensor failed\n");
}

DeviceTensor::DeviceTensor(DeviceTensor&& o) noexcept
    : view_(std::exchange(o.view_, {})), bytes_(std::exchange(o.bytes_, 0)) {}

DeviceTensor& DeviceTensor::operator=(DeviceTensor&& o) noexcept {
  std::swap(view_, o.view_);
  std::swap(bytes_, o.bytes_);
  return *this;
}

void DeviceTensor::upload_bytes(const void* host, size_t bytes) {
  if (bytes != bytes_)
    fail_internal("an upload of " + std::to_string(bytes) + " bytes into a tensor of " + std::to_string(bytes_));
  if (!bytes) return;
  MOK_CUDA_CHECK(cudaMemcpy(view_.data, host, bytes, cudaMemcpyHostToDevice));
  MOK_CUDA_CHECK(cudaDeviceSynchronize());  // a pageable copy may still be in flight when cudaMemcpy returns
}

void DeviceTensor::download_bytes(void* host, size_t offset, size_t bytes) const {
  if (offset + bytes > bytes_) fail_internal("a download past a tensor's end");
  if (bytes)
    MOK_CUDA_CHECK(cudaMemcpy(host, static_cast<const uint8_t*>(view_.data) + offset, bytes, cudaMemcpyDeviceToHost));
}

void DeviceTensor::poison() {
  if (!bytes_) return;
  MOK_CUDA_CHECK(cudaMemset(view_.data, 0xff, bytes_));
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace mok::gpu
