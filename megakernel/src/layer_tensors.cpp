#include "mok/megakernel/layer_tensors.h"

namespace mok::gpu {

WeightTensors::WeightTensors(const LayerConfig& c, const LayerWeights& w, int g, int shares) {
  const int64_t H = c.hidden, I = c.intermediate, E = c.experts, Is = c.shared_intermediate;
  router = DeviceTensor(DType::f32, {E, H}, w.router);
  expert_bias = DeviceTensor(DType::f32, {w.expert_bias.empty() ? 0 : E}, w.expert_bias);
  w1 = DeviceTensor(DType::bf16, {E / shares, 2 * I, H}, share_of(w.w1, g, shares));
  w2 = DeviceTensor(DType::bf16, {E / shares, H, I}, share_of(w.w2, g, shares));
  shared_w1 = DeviceTensor(DType::bf16, {2 * Is, H}, w.shared_w1);
  shared_w2 = DeviceTensor(DType::bf16, {H, Is}, w.shared_w2);
}

WeightViews WeightTensors::views() const {
  return {router.view(), expert_bias.view(), w1.view(), w2.view(), shared_w1.view(), shared_w2.view()};
}

ForwardTensors::ForwardTensors(const LayerConfig& c, size_t saved_bytes, int shares) {
  const int64_t N = c.tokens() / shares, H = c.hidden, E = c.experts, k = c.top_k;
  x = DeviceTensor(DType::bf16, {N, H});
  y = DeviceTensor(DType::bf16, {N, H});
  topk_idx = DeviceTensor(DType::i32, {N, k});
  topk_w = DeviceTensor(DType::f32, {N, k});
  logits = DeviceTensor(DType::f32, {N, E});
  saved = DeviceTensor(DType::u8, {int64_t(saved_bytes)});
}

ForwardOutputs ForwardTensors::views(RoutingMode mode) const {
  return {y.view(), topk_idx.view(), topk_w.view(), mode == RoutingMode::given ? TensorView{} : logits.view(),
          saved.view()};
}

void ForwardTensors::poison(RoutingMode mode) {
  for (DeviceTensor* t : {&y, &logits, &saved}) t->poison();
  if (mode == RoutingMode::router) topk_idx.poison();
  if (mode != RoutingMode::given) topk_w.poison();
}

GradTensors::GradTensors(const LayerConfig& c, int shares) {
  const int64_t N = c.tokens() / shares, H = c.hidden, I = c.intermediate, E = c.experts, k = c.top_k;
  const int64_t Is = c.shared_intermediate, Eg = E / shares;
  dy = DeviceTensor(DType::bf16, {N, H});
  dx = DeviceTensor(DType::bf16, {N, H});
  d_topk_w = DeviceTensor(DType::f32, {N, k});
  d_logits = DeviceTensor(DType::f32, {N, E});
  d_router = DeviceTensor(DType::f32, {E, H});
  d_w1 = DeviceTensor(DType::f32, {Eg, 2 * I, H});
  d_w2 = DeviceTensor(DType::f32, {Eg, H, I});
  d_shared_w1 = DeviceTensor(DType::f32, {2 * Is, H});
  d_shared_w2 = DeviceTensor(DType::f32, {H, Is});
}

GradOutputs GradTensors::views(RoutingMode mode, bool accumulate, BackwardScratch scratch) const {
  const bool router = mode != RoutingMode::given;
  return {dx.view(),
          d_topk_w.view(),
          router ? d_logits.view() : TensorView{},
          router ? d_router.view() : TensorView{},
          d_w1.view(),
          d_w2.view(),
          d_shared_w1.view(),
          d_shared_w2.view(),
          accumulate,
          scratch};
}

void GradTensors::poison(bool accumulate) {
  for (DeviceTensor* t : {&dx, &d_topk_w, &d_logits}) t->poison();
  if (!accumulate)
    for (DeviceTensor* t : {&d_router, &d_w1, &d_w2, &d_shared_w1, &d_shared_w2}) t->poison();
}

}  // namespace mok::gpu
