#include "mok/fuzz/backend.h"

namespace mok::fuzz {

std::unique_ptr<Backend> make_gpu_backend() {
  throw Error("mok-fuzz: this build has no CUDA (nvcc was not found at configure time): no gpu backend");
}

}  // namespace mok::fuzz
