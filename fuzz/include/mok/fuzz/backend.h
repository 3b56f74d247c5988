// What the fuzzer's properties run: the layer's forward and backward behind one small interface, so
// the same driver fuzzes the CPU reference and the megakernel (src/gpu_backend.cpp).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mok/reference/layer.h"

namespace mok::fuzz {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // The step model this backend computes when it computes only one (the driver then draws no other).
  virtual std::optional<StepModel> fixed_step() const { return std::nullopt; }
  // As ref::forward and ref::backward: same arguments, same results, mok::Error on bad input.
  virtual ref::Forward forward(const LayerConfig& c, const std::vector<bf16>& x, const ref::LayerWeights& w,
                               const ref::Routing* given, const ref::Options& opt) = 0;
  virtual ref::Gradients backward(const LayerConfig& c, const std::vector<bf16>& x, const ref::LayerWeights& w,
                                  const ref::Forward& fwd, const std::vector<bf16>& dy, const ref::Options& opt) = 0;
};

class ReferenceBackend final : public Backend {
 public:
  std::string name() const override { return "reference"; }
  ref::Forward forward(const LayerConfig& c, const std::vector<bf16>& x, const ref::LayerWeights& w,
                       const ref::Routing* given, const ref::Options& opt) override;
  ref::Gradients backward(const LayerConfig& c, const std::vector<bf16>& x, const ref::LayerWeights& w,
                          const ref::Forward& fwd, const std::vector<bf16>& dy, const ref::Options& opt) override;
};

// The megakernel on one Hopper GPU (hopper_tc only; the case's recompute mode and fp8 weight gradients are
// the megakernel's, LaunchConfig::recompute and fp8_weight_gradients). mok::Error without CUDA in the build or without
// a GPU.
std::unique_ptr<Backend> make_gpu_backend();

// mok::Error for a backend name make_backend does not know (the tool checks it with the flags, before
// --list or --help).
void require_known_backend(const std::string& name);
// "reference" or "gpu"; mok::Error for an unknown name.
std::unique_ptr<Backend> make_backend(const std::string& name);

}  // namespace mok::fuzz
