#include "gpu_ranks.h"
#include "mok/megakernel/layer.h"
#include "mok/megakernel/megakernel.h"
#include "mok/tools/reference_launch.h"
#include "mok/verify/backend.h"

namespace mok::verify {
namespace {

constexpr double kDefaultTimeoutS = 300;

class GpuBackend : public Backend {
 public:
  explicit GpuBackend(const BackendFlags& flags) : flags_(flags) {
    require(!flags.step || *flags.step == StepModel::hopper_tc, "the gpu backend computes the hopper_tc model only");
    // Across processes the GPUs are counted in a child at the first run: CUDA stays uninitialised
    // here, since a context does not survive the fork of the ranks.
    // The machine's lack, not the input's: no "invalid input" prefix. With --gpus N (one process too) the
    // goldens' runs find it (NoGpu: exit 77, after every golden is read, as across processes).
    if (!flags.gpus && !gpu::device_available())
      throw Error("the gpu backend needs a Hopper GPU (compute capability 9.0); none found");
  }

  std::string name() const override {
    std::string n = "gpu";
    if (flags_.ring_rows) n += " ring_rows=" + std::to_string(*flags_.ring_rows);
    if (flags_.recompute) n += std::string(" recompute=") + (*flags_.recompute ? "on" : "off");
    if (flags_.gpus)
      n += " gpus=" + std::to_string(*flags_.gpus) + (across_processes() ? " (processes)" : " (nccl, one process)");
    return n;
  }

  RunResults run(const golden::GoldenCase& g) override {
    require(g.options.step == StepModel::hopper_tc, "golden '" + g.name + "' was made with step " +
                                                        golden::to_string(g.options.step) +
                                                        "; the GPU computes hopper_tc");
    if (flags_.gpus && !across_processes() && !gpu::device_available())
      throw NoGpu("mok: no Hopper GPU (--gpus N --one-process drives N Hopper GPUs from this process)");
    const ref::Problem p = spread(golden::problem_of(g));
    ref::Options options = g.options;
    options.ring_rows = flags_.ring_rows.value_or(options.ring_rows);
    options.recompute = flags_.recompute.value_or(options.recompute);
    gpu::LaunchConfig launch = tools::reference_launch(p.config, options);
    if (flags_.gpus) {
      launch.gpus = *flags_.gpus;
      launch.transport = gpu::Transport::nccl;
    }
    if (across_processes())
      return {run_over_processes(p, launch, flags_.timeout_s.value_or(kDefaultTimeoutS)), std::nullopt};
    gpu::Megakernel mk(p.config, p.weights, launch);
    const Forward f = mk.forward(p.x, p.routing ? &*p.routing : nullptr);
    return {golden::results_of(p, f, mk.backward(p.dy)), std::nullopt};
  }

 private:
  bool across_processes() const { return flags_.gpus && !flags_.one_process; }

  // Across GPUs, a golden whose ranks do not split over them runs as the same global batch on one rank
  // per GPU (D2: the bits do not depend on R), when its tokens and experts split evenly.
  ref::Problem spread(ref::Problem p) const {
    const int gpus = flags_.gpus.value_or(1);
    LayerConfig& c = p.config;
    if (c.ranks % gpus == 0) return p;
    require(c.tokens() % gpus == 0 && c.experts % gpus == 0,
            "the golden's R=" + std::to_string(c.ranks) + " ranks do not split over " + std::to_string(gpus) +
                " GPUs, nor do its " + std::to_string(c.tokens()) + " tokens and " + std::to_string(c.experts) +
                " experts (one rank per GPU): use a --gpus that divides R, or N and E");
    c.tokens_per_rank = c.tokens() / gpus;
    c.ranks = gpus;
    return p;
  }

  BackendFlags flags_;
};

}  // namespace

std::unique_ptr<Backend> make_gpu_backend(const BackendFlags& flags) { return std::make_unique<GpuBackend>(flags); }

}  // namespace mok::verify
