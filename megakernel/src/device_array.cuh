// Device memory with checked transfers: DeviceSpan views memory owned elsewhere (a rank's window),
// DeviceArray owns its allocation (on the device current when it was made).
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

#include "mok/megakernel/check.h"

namespace mok::gpu {

template <class T>
class DeviceSpan {
 public:
  DeviceSpan() = default;
  DeviceSpan(T* p, size_t n) : p_(p), n_(n) {}

  T* get() const { return p_; }
  size_t size() const { return n_; }

  void upload(const std::vector<T>& host) {
    if (host.size() != n_) fail_internal("device upload of the wrong size");
    upload(host.data(), 0, n_);
  }
  // Elements [first, first + n) from host[0, n).
  void upload(const T* host, size_t first, size_t n) {
    if (first + n > n_) fail_internal("device upload past the end");
    if (n) MOK_CUDA_CHECK(cudaMemcpy(p_ + first, host, n * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const { return download(0, n_); }
  std::vector<T> download(size_t first, size_t n) const {
    if (first + n > n_) fail_internal("device download past the end");
    std::vector<T> host(n);
    if (n) MOK_CUDA_CHECK(cudaMemcpy(host.data(), p_ + first, n * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  // All bytes 0xff: NaN for floats and bf16, -1 for ints; an element nothing wrote stays visible.
  void poison() {
    if (n_) MOK_CUDA_CHECK(cudaMemset(p_, 0xff, n_ * sizeof(T)));
  }
  void zero() {
    if (n_) MOK_CUDA_CHECK(cudaMemset(p_, 0, n_ * sizeof(T)));
  }

 protected:
  T* p_ = nullptr;
  size_t n_ = 0;
};

template <class T>
class DeviceArray : public DeviceSpan<T> {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n) {
    if (n) MOK_CUDA_CHECK(cudaMalloc(&this->p_, n * sizeof(T)));
    this->n_ = n;
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { this->upload(host); }
  ~DeviceArray() {
    if (this->p_)
      (void)cudaFree(this->p_);  // a destructor cannot throw: a failed free is the device's error, raised elsewhere
  }
  DeviceArray(DeviceArray&& o) noexcept : DeviceSpan<T>(std::exchange(o.p_, nullptr), std::exchange(o.n_, 0)) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(this->p_, o.p_);
    std::swap(this->n_, o.n_);
    return *this;
  }
};

// Page-locked host memory the device copies into asynchronously (the device error word's host copy).
template <class T>
class PinnedArray {
 public:
  PinnedArray() = default;
  explicit PinnedArray(size_t n) {
    MOK_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&p_), n * sizeof(T), cudaHostAllocDefault));
    std::fill_n(p_, n, T{});
  }
  ~PinnedArray() {
    if (p_) (void)cudaFreeHost(p_);  // a destructor cannot throw (as ~DeviceArray)
  }
  PinnedArray(PinnedArray&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  PinnedArray& operator=(PinnedArray&& o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
};

}  // namespace mok::gpu
