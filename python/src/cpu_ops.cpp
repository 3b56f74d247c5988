// The ops on the CPU: the reference layer (mok::ref) with the tensor-core step model, so every output
// bit equals the GPU's. The tensors are copied into the reference's vectors and the results back; the
// saved buffer has the GPU's layout (mok/core/saved_layout.h), so either device's backward reads it.
#include <torch/library.h>

#include "mok/core/gradient_add.h"
#include "mok/reference/layer.h"
#include "op_tensors.h"
#include "reference_options.h"

namespace mok::py {
namespace {

using Tensor = at::Tensor;
using OptTensor = std::optional<at::Tensor>;

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> forward_cpu(const Tensor& x, const Tensor& router,
                                                               const OptTensor& expert_bias, const Tensor& w1,
                                                               const Tensor& w2, const OptTensor& shared_w1,
                                                               const OptTensor& shared_w2, const OptTensor& topk_idx,
                                                               const OptTensor& topk_w, at::IntArrayRef config_ints,
                                                               at::ArrayRef<double> config_floats, int64_t routing_mode,
                                                               at::IntArrayRef launch, const OptTensor& fp8_weights) {
  return value_errors([&] {
    const LayerArgs args{x, router, expert_bias, w1, w2, shared_w1, shared_w2};
    const Call call = checked_forward(OpKernel::cpu, config_ints, config_floats, routing_mode, launch, args, topk_idx,
                                      topk_w, fp8_weights, {});
    const LayerConfig& c = call.config;
    const int64_t N = c.tokens(), k = c.top_k;
    const std::vector<bf16> xs = values<bf16>(x);
    const Routing given{values<int32_t>(topk_idx), values<float>(topk_w)};
    const Forward f = ref::forward(c, xs, weights_of(args), call.mode == RoutingMode::router ? nullptr : &given,
                                   reference_options(call));
    const std::vector<uint8_t> saved = pack_saved(c, f, xs, call.recompute);
    return std::make_tuple(tensor_of(f.y, {N, c.hidden}), tensor_of(f.routing.topk_idx, {N, k}),
                           tensor_of(f.routing.topk_w, {N, k}), tensor_of(f.logits, logits_shape(call)),
                           tensor_of(saved, {int64_t(saved.size())}));
  });
}

// The weight gradients mok::backward returns: bf16, each fp32 gradient rounded once (the GPU's bf16
// weight-gradient epilogue).
std::vector<bf16> rounded(const std::vector<float>& g) {
  std::vector<bf16> r(g.size());
  for (size_t i = 0; i < g.size(); ++i) r[i] = to_bf16(g[i]);
  return r;
}

// The reference's gradients for the op's inputs (checked by the caller).
Gradients reference_backward(const Call& call, const LayerArgs& args, const SavedArgs& s, const Tensor& dy) {
  const LayerConfig& c = call.config;
  Forward f = unpack_saved(c, values<uint8_t>(s.saved), call.recompute);  // checks the layout it reads by
  f.routing = Routing{values<int32_t>(s.topk_idx), values<float>(s.topk_w)};
  f.logits = values<float>(s.logits);  // empty in mode given: no router gradients
  return ref::backward(c, values<bf16>(args.x), weights_of(args), f, values<bf16>(dy), reference_options(call));
}

// dx, d_topk_w and d_logits of the reference's gradients as the op's tensors.
std::tuple<Tensor, Tensor, Tensor> input_gradients(const Call& call, const Gradients& g) {
  const LayerConfig& c = call.config;
  return {tensor_of(g.dx, {int64_t(c.tokens()), c.hidden}), tensor_of(g.d_topk_w, {int64_t(c.tokens()), c.top_k}),
          tensor_of(g.d_logits, logits_shape(call))};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> backward_cpu(
    const Tensor& x, const Tensor& router, const OptTensor& expert_bias, const Tensor& w1, const Tensor& w2,
    const OptTensor& shared_w1, const OptTensor& shared_w2, const Tensor& topk_idx, const Tensor& topk_w,
    const Tensor& logits, const Tensor& saved, const Tensor& dy, at::IntArrayRef config_ints,
    at::ArrayRef<double> config_floats, int64_t routing_mode, at::IntArrayRef launch, const OptTensor& fp8_weights) {
  return value_errors([&] {
    const LayerArgs args{x, router, expert_bias, w1, w2, shared_w1, shared_w2};
    const SavedArgs s{topk_idx, topk_w, logits, saved};
    const Call call = checked_backward(OpKernel::cpu, config_ints, config_floats, routing_mode, launch, args, s, dy,
                                       nullptr, fp8_weights, {});
    const Gradients g = reference_backward(call, args, s, dy);
    const LayerConfig& c = call.config;
    const int64_t H = c.hidden, I = c.intermediate, E = c.experts, Is = c.shared_intermediate;
    return std::tuple_cat(
        input_gradients(call, g),
        std::make_tuple(tensor_of(g.d_router, d_router_shape(call)), tensor_of(rounded(g.d_w1), {E, 2 * I, H}),
                        tensor_of(rounded(g.d_w2), {E, H, I}), tensor_of(rounded(g.d_shared_w1), {2 * Is, H}),
                        tensor_of(rounded(g.d_shared_w2), {H, Is})));
  });
}

// The CPU op reads saved without writing it; its version moves as the GPU op's does (one autograd rule).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> backward_consuming_cpu(
    const Tensor& x, const Tensor& router, const OptTensor& expert_bias, const Tensor& w1, const Tensor& w2,
    const OptTensor& shared_w1, const OptTensor& shared_w2, const Tensor& topk_idx, const Tensor& topk_w,
    const Tensor& logits, const Tensor& saved, const Tensor& dy, at::IntArrayRef config_ints,
    at::ArrayRef<double> config_floats, int64_t routing_mode, at::IntArrayRef launch, const OptTensor& fp8_weights) {
  value_errors([&] { require_consumable(saved); });
  auto gradients = backward_cpu(x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w, logits, saved,
                                dy, config_ints, config_floats, routing_mode, launch, fp8_weights);
  consumed(saved);
  return gradients;
}

// acc += g as the GPU's GradOutputs::accumulate adds (core gradient_add.h): in fp32 one rounding per
// element, in bf16 autograd's two.
void add_into(const OptTensor& acc, const std::vector<float>& g) {
  if (!acc) return;
  if (acc->scalar_type() == at::kBFloat16) {
    auto* out = static_cast<bf16*>(acc->data_ptr());
    for (size_t i = 0; i < g.size(); ++i) out[i] = add_bf16_gradient(out[i], g[i]);
    return;
  }
  float* out = acc->data_ptr<float>();
  for (size_t i = 0; i < g.size(); ++i) out[i] = add_f32_gradient(out[i], g[i]);
}

std::tuple<Tensor, Tensor, Tensor> backward_accumulate_cpu(
    const Tensor& x, const Tensor& router, const OptTensor& expert_bias, const Tensor& w1, const Tensor& w2,
    const OptTensor& shared_w1, const OptTensor& shared_w2, const Tensor& topk_idx, const Tensor& topk_w,
    const Tensor& logits, const Tensor& saved, const Tensor& dy, const OptTensor& d_router, const Tensor& d_w1,
    const Tensor& d_w2, const OptTensor& d_shared_w1, const OptTensor& d_shared_w2, at::IntArrayRef config_ints,
    at::ArrayRef<double> config_floats, int64_t routing_mode, at::IntArrayRef launch, const OptTensor& fp8_weights) {
  return value_errors([&] {
    const LayerArgs args{x, router, expert_bias, w1, w2, shared_w1, shared_w2};
    const SavedArgs s{topk_idx, topk_w, logits, saved};
    const Accumulators acc{d_router, d_w1, d_w2, d_shared_w1, d_shared_w2};
    const Call call = checked_backward(OpKernel::cpu, config_ints, config_floats, routing_mode, launch, args, s, dy,
                                       &acc, fp8_weights, {});
    const Gradients g = reference_backward(call, args, s, dy);
    add_into(d_router, g.d_router);
    add_into(d_w1, g.d_w1);
    add_into(d_w2, g.d_w2);
    add_into(d_shared_w1, g.d_shared_w1);
    add_into(d_shared_w2, g.d_shared_w2);
    bump_versions(acc);
    return input_gradients(call, g);
  });
}

Tensor quantize_weights_cpu(const Tensor& w1, const Tensor& w2, const OptTensor& shared_w1, const OptTensor& shared_w2,
                            at::IntArrayRef config_ints, at::ArrayRef<double> config_floats, at::IntArrayRef launch) {
  return value_errors([&]() -> Tensor {
    checked_quantize(OpKernel::cpu, config_ints, config_floats, launch, w1, w2, shared_w1, shared_w2, {});
    fail_internal("the CPU op's quantize_weights checks passed a call (they refuse every one)");
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(mok, CPU, m) {
  m.impl("quantize_weights", &quantize_weights_cpu);
  m.impl("forward", &forward_cpu);
  m.impl("backward", &backward_cpu);
  m.impl("backward_consuming", &backward_consuming_cpu);
  m.impl("backward_accumulate", &backward_accumulate_cpu);
}

}  // namespace mok::py
