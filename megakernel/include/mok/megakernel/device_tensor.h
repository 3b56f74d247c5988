// A device tensor a host program owns (the host-vector wrapper, the GPU tests, mok-procs): contiguous,
// allocated on the device current at construction, seen by the device API through its TensorView.
// Transfers are synchronous and an upload has landed before it returns, so work on any stream (the
// layer's are non-blocking) reads the new bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "mok/megakernel/layer.h"

namespace mok::gpu {

class DeviceTensor {
 public:
  DeviceTensor() = default;
  DeviceTensor(DType dtype, std::vector<int64_t> shape);
  template <class T>
  DeviceTensor(DType dtype, std::vector<int64_t> shape, const std::vector<T>& host) : DeviceTensor(dtype, shape) {
    upload(host);
  }
  ~DeviceTensor();
  DeviceTensor(DeviceTensor&& o) noexcept;
  DeviceTensor& operator=(DeviceTensor&& o) noexcept;

  const TensorView& view() const { return view_; }
  size_t bytes() const { return bytes_; }

  template <class T>
  void upload(const std::vector<T>& host) {
    upload_bytes(host.data(), host.size() * sizeof(T));
  }
  // Elements [first, first + n) as T.
  template <class T>
  std::vector<T> download(size_t first, size_t n) const {
    std::vector<T> host(n);
    download_bytes(host.data(), first * sizeof(T), n * sizeof(T));
    return host;
  }
  template <class T>
  std::vector<T> download() const {
    return download<T>(0, bytes_ / sizeof(T));
  }
  // Every byte 0xff: NaN for floats and bf16, -1 for ints, so an element nothing wrote shows.
  void poison();

 private:
  void upload_bytes(const void* host, size_t bytes);
  void download_bytes(void* host, size_t offset, size_t bytes) const;

  TensorView view_;
  size_t bytes_ = 0;
};

// Share g's part of a tensor whose leading dimension (tokens or experts, in order) splits evenly over
// `shares`.
template <class T>
std::vector<T> share_of(const std::vector<T>& whole, int g, int shares) {
  const size_t n = whole.size() / shares;
  return std::vector<T>(whole.begin() + g * n, whole.begin() + (g + 1) * n);
}

}  // namespace mok::gpu
