// An owning device allocation with checked transfers.
#pragma once

#include <vector>

#include "mok/megakernel/check.h"

namespace mok::gpu {

template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n) : n_(n) {
    if (n) MOK_CUDA_CHECK(cudaMalloc(&p_, n * sizeof(T)));
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() {
    if (p_) cudaFree(p_);
  }
  DeviceArray(DeviceArray&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }

  T* get() const { return p_; }
  size_t size() const { return n_; }

  void upload(const std::vector<T>& host) {
    require(host.size() == n_, "device upload of the wrong size");
    if (n_) MOK_CUDA_CHECK(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_) MOK_CUDA_CHECK(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  // All bytes 0xff: NaN for floats and bf16, -1 for ints; an element nothing wrote stays visible.
  void poison() {
    if (n_) MOK_CUDA_CHECK(cudaMemset(p_, 0xff, n_ * sizeof(T)));
  }
  void zero() {
    if (n_) MOK_CUDA_CHECK(cudaMemset(p_, 0, n_ * sizeof(T)));
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace mok::gpu
