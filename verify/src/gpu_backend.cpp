#include "mok/megakernel/megakernel.h"
#include "mok/verify/backend.h"

namespace mok::verify {
namespace {

class GpuBackend : public Backend {
 public:
  explicit GpuBackend(const BackendFlags& flags) : flags_(flags) {
    require(!flags.step || *flags.step == StepModel::hopper_tc, "the gpu backend computes the hopper_tc model only");
    require(!flags.recompute.value_or(false), "the gpu backend has no recompute mode");
    require(gpu::device_available(), "the gpu backend needs a Hopper GPU (compute capability 9.0); none found");
  }

  std::string name() const override {
    return flags_.ring_rows ? "gpu ring_rows=" + std::to_string(*flags_.ring_rows) : "gpu";
  }

  golden::LayerResults run(const golden::GoldenCase& g) override {
    require(g.options.step == StepModel::hopper_tc, "golden '" + g.name + "' was made with step " +
                                                        golden::to_string(g.options.step) +
                                                        "; the GPU computes hopper_tc");
    const ref::Problem p = golden::problem_of(g);
    gpu::LaunchConfig launch;
    launch.ring_rows = gpu::whole_tile_ring_rows(flags_.ring_rows.value_or(g.options.ring_rows));
    gpu::Megakernel mk(p.config, p.weights, launch);
    const Forward f = mk.forward(p.x, p.routing ? &*p.routing : nullptr);
    return golden::results_of(p, f, mk.backward(p.dy));
  }

 private:
  BackendFlags flags_;
};

}  // namespace

std::unique_ptr<Backend> make_gpu_backend(const BackendFlags& flags) { return std::make_unique<GpuBackend>(flags); }

}  // namespace mok::verify
