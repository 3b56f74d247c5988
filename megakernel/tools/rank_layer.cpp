#include "mok/tools/rank_layer.h"

#include <cstdio>
#include <utility>

#include "mok/core/fields.h"
#include "mok/core/saved_layout.h"
#include "mok/megakernel/check.h"

namespace mok::tools {
namespace {

using gpu::DeviceTensor;
using gpu::share_of;

// Computed whole by every rank; the rest is split by token or by expert.
bool replicated(const std::string& name) {
  for (const char* n : {"counts", "offsets", "row_source", "slot_row", "d_router", "d_shared_w1", "d_shared_w2"})
    if (name == n) return true;
  return false;
}

template <class S>
S assemble_fields(const std::vector<const S*>& ranks, std::vector<std::string>& problems) {
  S whole = *ranks[0];
  for (size_t g = 1; g < ranks.size(); ++g)
    for_each_field(whole, *ranks[g], [&](const char* name, auto& w, const auto& r) {
      if (!replicated(name)) {
        w.insert(w.end(), r.begin(), r.end());
        return;
      }
      const std::string diff = first_bit_mismatch(name, r, w);
      if (!diff.empty()) problems.push_back("rank " + std::to_string(g) + " vs rank 0: " + diff);
    });
  return whole;
}

}  // namespace

Stream::Stream() { MOK_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }

Stream::~Stream() {
  if (s_ && cudaStreamDestroy(s_) != cudaSuccess) std::fprintf(stderr, "mok: cudaStreamDestroy failed\n");
}

uint64_t device_memory_in_use() {
  size_t free = 0, total = 0;
  MOK_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return total - free;
}

RankTensors::RankTensors(const gpu::Layer& layer, const LayerWeights& w, const gpu::LaunchConfig& launch, int g)
    : c_(layer.config()),
      launch_(launch),
      g_(g),
      weights_(c_, w, g, launch.gpus),
      fwd_(c_, layer.saved_bytes(), launch.gpus),
      grad_(c_, launch.gpus),
      workspace_(gpu::DType::u8, {int64_t(layer.workspace_bytes(gpu::Pass::backward))}) {}

void RankTensors::set_inputs(const std::vector<bf16>& x, const std::vector<bf16>& dy, const Routing* routing,
                             RoutingMode mode) {
  require((mode == RoutingMode::router) == !routing, "a routing is given exactly in modes replay_ids and given");
  const int G = launch_.gpus;
  mode_ = mode;
  fwd_.x.upload(share_of(x, g_, G));
  grad_.dy.upload(share_of(dy, g_, G));
  if (routing) fwd_.topk_idx.upload(share_of(routing->topk_idx, g_, G));
  if (mode == RoutingMode::given) fwd_.topk_w.upload(share_of(routing->topk_w, g_, G));
}

// A given routing is read in place from the forward's topk_idx and topk_w (set_inputs filled them).
gpu::ForwardInputs RankTensors::inputs() const {
  gpu::ForwardInputs in;
  in.x = fwd_.x.view();
  in.weights = weights_.views();
  in.routing = mode_;
  return in;
}

void RankTensors::poison() {
  fwd_.poison(mode_);
  grad_.poison(false);
}

void RankTensors::forward(gpu::Layer& layer, cudaStream_t stream) {
  layer.forward(stream, workspace_.view(), inputs(), fwd_.views(mode_));
}

void RankTensors::backward(gpu::Layer& layer, cudaStream_t stream) {
  layer.backward(stream, workspace_.view(), inputs(), fwd_.views(mode_), grad_.dy.view(), grad_.views(mode_, false));
}

RankResults RankTensors::download() const {
  RankResults r;
  Forward& f = r.fwd;
  f.routing.topk_idx = fwd_.topk_idx.download<int32_t>();
  f.routing.topk_w = fwd_.topk_w.download<float>();
  if (mode_ != RoutingMode::given) f.logits = fwd_.logits.download<float>();
  const RowShare share{launch_.gpus, g_, launch_.capacity_rows};
  f.layout = unpack_saved(c_, fwd_.saved.download<uint8_t>(), launch_.recompute, share).layout;
  f.y = fwd_.y.download<bf16>();
  Gradients& d = r.grads;
  d.dx = grad_.dx.download<bf16>();
  d.d_topk_w = grad_.d_topk_w.download<float>();
  if (mode_ != RoutingMode::given) {
    d.d_logits = grad_.d_logits.download<float>();
    d.d_router = grad_.d_router.download<float>();
  }
  d.d_w1 = grad_.d_w1.download<float>();
  d.d_w2 = grad_.d_w2.download<float>();
  d.d_shared_w1 = grad_.d_shared_w1.download<float>();
  d.d_shared_w2 = grad_.d_shared_w2.download<float>();
  return r;
}

TensorBytes RankTensors::bytes() const {
  TensorBytes b;
  const gpu::WeightTensors& w = weights_;
  for (const DeviceTensor* t : {&w.router, &w.expert_bias, &w.w1, &w.w2, &w.shared_w1, &w.shared_w2, &grad_.d_router,
                                &grad_.d_w1, &grad_.d_w2, &grad_.d_shared_w1, &grad_.d_shared_w2})
    b.weights += t->bytes();
  for (const DeviceTensor* t : {&fwd_.x, &grad_.dy, &fwd_.y, &fwd_.topk_idx, &fwd_.topk_w, &fwd_.logits, &grad_.dx,
                                &grad_.d_topk_w, &grad_.d_logits})
    b.activations += t->bytes();
  b.saved = fwd_.saved.bytes();
  b.workspace = workspace_.bytes();
  return b;
}

RankResults assemble(const std::vector<RankResults>& ranks, std::vector<std::string>& problems) {
  std::vector<const Forward*> fwds;
  std::vector<const Gradients*> grads;
  for (const RankResults& r : ranks) fwds.push_back(&r.fwd), grads.push_back(&r.grads);
  return {assemble_fields(fwds, problems), assemble_fields(grads, problems)};
}

void put_results(ResultWriter& file, const RankResults& r) {
  file.put_fields(r.fwd);
  file.put_fields(r.grads);
}

RankResults get_results(ResultReader& file) {
  RankResults r;
  file.get_fields(r.fwd);
  file.get_fields(r.grads);
  return r;
}

std::string first_difference(const RankResults& a, const RankResults& b) {
  return first_step_mismatch(a.fwd, a.grads, b.fwd, b.grads);
}

}  // namespace mok::tools
