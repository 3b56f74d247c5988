#include "mok/fuzz/backend.h"

namespace mok::fuzz {

ref::Forward ReferenceBackend::forward(const LayerConfig& c, const std::vector<bf16>& x, const ref::LayerWeights& w,
                                       const ref::Routing* given, const ref::Options& opt) {
  return ref::forward(c, x, w, given, opt);
}

ref::Gradients ReferenceBackend::backward(const LayerConfig& c, const std::vector<bf16>& x, const ref::LayerWeights& w,
                                          const ref::Forward& fwd, const std::vector<bf16>& dy,
                                          const ref::Options& opt) {
  return ref::backward(c, x, w, fwd, dy, opt);
}

void require_known_backend(const std::string& name) {
  if (name != "reference" && name != "gpu")
    throw Error("mok-fuzz: unknown backend " + quote_input(name) + " (reference or gpu)");
}

std::unique_ptr<Backend> make_backend(const std::string& name) {
  require_known_backend(name);
  if (name == "reference") return std::make_unique<ReferenceBackend>();
  return make_gpu_backend();
}

}  // namespace mok::fuzz
