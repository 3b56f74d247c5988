// The autograd formula of mok::forward, in C++ (the Autograd dispatch key), so a call under autograd
// goes from the dispatcher to the device's kernel without a Python frame: y is the only differentiable
// output; its backward is mok::backward_consuming (traced, mok::backward). topk_idx, topk_w, logits and saved carry no
// gradient (the backward derives the router's from dy alone; docs/python.md).
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include "op_config.h"
#include "op_tensors.h"

namespace mok::py {
namespace {

using Tensor = at::Tensor;
using OptTensor = std::optional<at::Tensor>;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using ForwardOutputs = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;
using BackwardOutputs = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

// mok::forward below the Autograd key.
ForwardOutputs forward_below_autograd(const Tensor& x, const Tensor& router, const OptTensor& expert_bias,
                                      const Tensor& w1, const Tensor& w2, const OptTensor& shared_w1,
                                      const OptTensor& shared_w2, const OptTensor& topk_idx, const OptTensor& topk_w,
                                      at::IntArrayRef config_ints, at::ArrayRef<double> config_floats,
                                      int64_t routing_mode, at::IntArrayRef launch, const OptTensor& fp8_weights) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mok::forward", "")
          .typed<ForwardOutputs(const Tensor&, const Tensor&, const OptTensor&, const Tensor&, const Tensor&,
                                const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&, at::IntArrayRef,
                                at::ArrayRef<double>, int64_t, at::IntArrayRef, const OptTensor&)>();
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w, config_ints, config_floats,
                 routing_mode, launch, fp8_weights);
}

// Whether `holds` is true of any tensor input but topk_idx (the layer's tensors and a given topk_w).
template <class Predicate>
bool any_input(Predicate holds, const LayerArgs& a, const OptTensor& topk_w) {
  bool any = topk_w && holds(*topk_w);
  a.for_each([&](const Tensor& t, const char*) { any = any || holds(t); });
  return any;
}

bool requires_grad(const Tensor& t) { return t.requires_grad(); }

// A tensor of a trace (a fake or functional tensor, a proxy's: a Python dispatch key) rather than of an eager call.
bool traced(const Tensor& t) {
  return t.unsafeGetTensorImpl()->is_python_dispatch() || at::functionalization::impl::isFunctionalTensor(t);
}

// A forward-mode tangent (forward_ad.make_dual, torch.func.jvp), which the layer has no formula for.
bool has_tangent(const Tensor& t) { return t._fw_grad(/*level=*/0).defined(); }

// python/mok/functional.py's _IntoAccumulators (accumulate_into) saves the same tensors and gives the
// same gradients but the weights': keep the two in step.
class MoEFunction : public torch::autograd::Function<MoEFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& router,
                               const OptTensor& expert_bias, const Tensor& w1, const Tensor& w2,
                               const OptTensor& shared_w1, const OptTensor& shared_w2, const OptTensor& topk_idx,
                               const OptTensor& topk_w, at::IntArrayRef config_ints, at::ArrayRef<double> config_floats,
                               int64_t routing_mode, at::IntArrayRef launch, const OptTensor& fp8_weights) {
    auto [y, idx, w, logits, saved] =
        forward_below_autograd(x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w, config_ints,
                               config_floats, routing_mode, launch, fp8_weights);
    ctx->mark_non_differentiable({idx, w, logits, saved});
    // Else autograd fills a zero gradient for every output the loss did not reach before the backward:
    // one of saved's size (1,769 MiB on kimi-k2, filled twice under deterministic algorithms).
    ctx->set_materialize_grads(false);
    // Absent optional inputs are saved as undefined tensors. The backward reads the forward's fp8_weights
    // rather than quantizing the weights again. expert_bias is not saved: it only selects the experts, whose
    // ids the backward reads from idx, and saved it made a balancing update of the bias in place between
    // the forward and the backward (aux-loss-free balancing) fail autograd's version check.
    ctx->save_for_backward({x, router, Tensor(), w1, w2, shared_w1.value_or(Tensor()), shared_w2.value_or(Tensor()),
                            idx, w, logits, saved, fp8_weights.value_or(Tensor())});
    ctx->saved_data["config_ints"] = config_ints.vec();
    ctx->saved_data["config_floats"] = config_floats.vec();
    ctx->saved_data["routing_mode"] = routing_mode;
    ctx->saved_data["launch"] = launch.vec();
    return {y, idx, w, logits, saved};
  }

  static constexpr size_t kInputs = 14;  // forward's, after ctx

  // One gradient per input of forward (undefined: none). Eager, mok::backward_consuming: on the GPU dh is written
  // over saved's h (a smaller workspace). Traced (torch.compile, opcheck: saved is a fake, functional or proxy
  // tensor), mok::backward, which writes no input: AOTAutograd's partitioner cannot keep a forward output that
  // the backward writes. Either way a second backward of this forward (retain_graph) is refused.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // y's gradient, the only one read. Undefined where none reached y: then no input gets one either.
    if (!grads[0].defined()) return variable_list(kInputs);
    TORCH_CHECK(ctx->saved_data.count("consumed") == 0,
                "mok: this forward's backward already ran, and it consumed the saved activations (its dh is written "
                "over h); run the forward again for another backward (retain_graph cannot keep them)");
    using Signature =
        BackwardOutputs(const Tensor&, const Tensor&, const OptTensor&, const Tensor&, const Tensor&, const OptTensor&,
                        const OptTensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        at::IntArrayRef, at::ArrayRef<double>, int64_t, at::IntArrayRef, const OptTensor&);
    const auto find = [](const char* name) {
      return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
    };
    static const auto consuming = find("mok::backward_consuming"), keeping = find("mok::backward");
    const variable_list s = ctx->get_saved_variables();
    const auto& op = traced(s[10]) ? keeping : consuming;
    ctx->saved_data["consumed"] = true;  // before the call: an error after its launch may leave h part dh
    const auto optional = [](const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; };
    const std::vector<int64_t> ints = ctx->saved_data["config_ints"].toIntVector();
    const std::vector<double> floats = ctx->saved_data["config_floats"].toDoubleVector();
    const std::vector<int64_t> launch = ctx->saved_data["launch"].toIntVector();
    const int64_t mode = ctx->saved_data["routing_mode"].toInt();
    const Tensor dy = grads[0].contiguous();
    const auto [dx, d_topk_w, d_logits, d_router, d_w1, d_w2, d_shared_w1, d_shared_w2] =
        op.call(s[0], s[1], optional(s[2]), s[3], s[4], optional(s[5]), optional(s[6]), s[7], s[8], s[9], s[10], dy,
                ints, floats, mode, launch, optional(s[11]));
    const bool given = mode == int64_t(RoutingMode::given);
    const bool shared = s[5].defined();
    return {dx,
            given ? Tensor() : d_router,  // a given routing does not read the router
            Tensor(),                     // expert_bias only selects experts: no gradient
            d_w1,
            d_w2,
            shared ? d_shared_w1 : Tensor(),
            shared ? d_shared_w2 : Tensor(),
            Tensor(),                     // topk_idx
            given ? d_topk_w : Tensor(),  // the given weights' gradient; the router's own are internal
            Tensor(),
            Tensor(),
            Tensor(),
            Tensor(),
            Tensor()};  // fp8_weights: w1 and w2 quantized, whose gradients are w1's and w2's
  }
};

ForwardOutputs forward_autograd(const Tensor& x, const Tensor& router, const OptTensor& expert_bias, const Tensor& w1,
                                const Tensor& w2, const OptTensor& shared_w1, const OptTensor& shared_w2,
                                const OptTensor& topk_idx, const OptTensor& topk_w, at::IntArrayRef config_ints,
                                at::ArrayRef<double> config_floats, int64_t routing_mode, at::IntArrayRef launch,
                                const OptTensor& fp8_weights) {
  // Else the call below returned the primal alone and autograd took the tangent of y as zero (a jvp of 0, or
  // no tangent, without a word).
  const LayerArgs inputs{x, router, expert_bias, w1, w2, shared_w1, shared_w2};
  TORCH_CHECK_NOT_IMPLEMENTED(
      !any_input(has_tangent, inputs, topk_w),
      "mok::forward has no forward-mode derivative (forward_ad dual tensors, torch.func.jvp): use reverse mode "
      "(backward, torch.autograd.grad)");
  // With no gradient to record (no_grad, or no input requiring one) the call skips the autograd
  // Function: its bookkeeping is about a tenth of a small call's host time (docs/benchmarks.md).
  if (!at::GradMode::is_enabled() || !any_input(requires_grad, inputs, topk_w))
    return forward_below_autograd(x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w, config_ints,
                                  config_floats, routing_mode, launch, fp8_weights);
  const variable_list out = MoEFunction::apply(x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w,
                                               config_ints, config_floats, routing_mode, launch, fp8_weights);
  return {out[0], out[1], out[2], out[3], out[4]};
}

}  // namespace

// The backward ops have no derivative: under create_graph their outputs carry a node that raises if a
// second backward reaches it (rather than no node, which autograd would pass by with a None gradient).
TORCH_LIBRARY_IMPL(mok, Autograd, m) {
  m.impl("forward", &forward_autograd);
  m.impl("backward", torch::autograd::autogradNotImplementedFallback());
  m.impl("backward_consuming", torch::autograd::autogradNotImplementedFallback());
  m.impl("backward_accumulate", torch::autograd::autogradNotImplementedFallback());
}

}  // namespace mok::py
