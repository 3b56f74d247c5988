#include "mok/verify/backend.h"

#include "mok/core/validate.h"

namespace mok::verify {
namespace {

class ReferenceBackend : public Backend {
 public:
  explicit ReferenceBackend(const BackendFlags& flags) : flags_(flags) {
    require(!flags.gpus, "--gpus applies to the gpu backend only");
  }

  std::string name() const override {
    std::string n = "reference";
    if (flags_.step) n += " step=" + golden::to_string(*flags_.step);
    if (flags_.ring_rows) n += " ring_rows=" + std::to_string(*flags_.ring_rows);
    if (flags_.recompute) n += std::string(" recompute=") + (*flags_.recompute ? "on" : "off");
    return n;
  }

  RunResults run(const golden::GoldenCase& g) override {
    ref::Options o = g.options;
    o.step = flags_.step.value_or(o.step);
    o.ring_rows = flags_.ring_rows.value_or(o.ring_rows);
    o.recompute = flags_.recompute.value_or(o.recompute);
    // The golden read, its problem and the reference's run: 2.6 times the tensors at once, measured.
    require_fits_in_memory(g.config, 3);
    return {golden::run_reference(golden::problem_of(g), o), std::nullopt};
  }

 private:
  BackendFlags flags_;
};

}  // namespace

std::unique_ptr<Backend> make_reference_backend(const BackendFlags& flags) {
  return std::make_unique<ReferenceBackend>(flags);
}

}  // namespace mok::verify
