#include "mok/core/validate.h"
#include "mok/fuzz/backend.h"
#include "mok/megakernel/megakernel.h"
#include "mok/tools/reference_launch.h"

namespace mok::fuzz {
namespace {

// The case's recompute mode is the megakernel's (LaunchConfig::recompute): its forward then saves no h
// and a, as the reference's, and its backward recomputes them on the GPU. So are its fp8 weight
// gradients (LaunchConfig::fp8_weight_gradients, which the fp8 mode alone takes).
class GpuBackend final : public Backend {
 public:
  GpuBackend() {
    // The machine's lack, not the input's: no "invalid input" prefix.
    if (!gpu::device_available())
      throw Error("mok-fuzz: the gpu backend needs a Hopper GPU (compute capability 9.0); none found");
  }

  std::string name() const override { return "gpu"; }
  std::optional<StepModel> fixed_step() const override { return StepModel::hopper_tc; }

  ref::Forward forward(const LayerConfig& c, const std::vector<bf16>& x, const ref::LayerWeights& w,
                       const ref::Routing* given, const ref::Options& opt) override {
    gpu::Megakernel mk(c, w, launch(c, opt));
    return mk.forward(x, given, opt.replay_ids);
  }

  // The megakernel keeps its forward's state on the device: replay that forward (same bits, D1),
  // with the forward's routing given when it was given (its ids alone with replay_ids), then run the
  // backward.
  ref::Gradients backward(const LayerConfig& c, const std::vector<bf16>& x, const ref::LayerWeights& w,
                          const ref::Forward& fwd, const std::vector<bf16>& dy, const ref::Options& opt) override {
    validate_backward_inputs(c, x, w, fwd, dy, opt.recompute);
    gpu::Megakernel mk(c, w, launch(c, opt));
    mk.forward(x, fwd.logits.empty() || opt.replay_ids ? &fwd.routing : nullptr, opt.replay_ids);
    return mk.backward(dy);
  }

 private:
  static gpu::LaunchConfig launch(const LayerConfig& c, const ref::Options& opt) {
    require(opt.step == StepModel::hopper_tc, "the gpu backend computes the hopper_tc model only");
    require(opt.fault == ref::Fault::none, "the gpu backend has no fault injection");
    return tools::reference_launch(c, opt);
  }
};

}  // namespace

std::unique_ptr<Backend> make_gpu_backend() { return std::make_unique<GpuBackend>(); }

}  // namespace mok::fuzz
