#include "mok/verify/backend.h"

namespace mok::verify {

std::unique_ptr<Backend> make_gpu_backend(const BackendFlags&) {
  throw Error("mok: this build has no CUDA (nvcc was not found at configure time): no gpu backend");
}

}  // namespace mok::verify
