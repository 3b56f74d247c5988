// The ops on the GPU: mok::gpu::Layer (mok/megakernel/layer.h) on the op's tensors, enqueued on
// PyTorch's current stream with the workspace from PyTorch's caching allocator, so calls are
// stream-ordered, never wait for the device and can be captured in a CUDA graph. Errors the kernels
// find (router-logit overflow, a given id out of range, a watchdog) are raised by the layer's next
// call or by mok.check() (check_cuda_layers). A call with a communicator (launch's comm, a
// torch.distributed process group's ncclComm_t) runs this GPU's share of an expert-parallel layer on a
// Layer built on that communicator (mok/megakernel/layer.h; docs/python.md, "torch.distributed").
#include <ATen/cuda/EmptyTensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>

#include "cuda_layers.h"
#include "mok/megakernel/layer.h"
#include "mok/megakernel/nccl.h"
#include "op_tensors.h"

namespace mok::py {
namespace {

using Tensor = at::Tensor;
using OptTensor = std::optional<at::Tensor>;

// A Layer holds only the config, launch settings and a few device words of its own (on a communicator
// also its window), so one per (device, config, launch, communicator) serves every call; its mutex
// keeps two threads from enqueueing on it at once.
struct CachedLayer {
  CachedLayer(const LayerConfig& c, const gpu::LaunchConfig& l) : layer(c, l) {}
  CachedLayer(const LayerConfig& c, const gpu::LaunchConfig& l, ncclComm_t comm) : layer(c, l, comm) {}
  std::mutex mutex;
  gpu::Layer layer;
};

// A cached Layer's key. Keys of one communicator differ only in config and launch across its ranks, so
// the map's order is the same on every rank: release_cuda_layers destroys them in the same order
// everywhere, as NCCL wants. fp8_weights_given: the Layer of the fp8 forwards and backwards given
// quantized weights (and of mok::quantize_weights), whose workspace holds none.
struct LayerKey {
  c10::DeviceIndex device;
  std::vector<int64_t> config_ints, launch;  // pack_config's ints; pack_launch
  std::vector<double> config_floats;
  bool fp8_weights_given;
  auto operator<=>(const LayerKey&) const = default;
  uintptr_t comm() const { return static_cast<uintptr_t>(launch[kComm]); }
};

std::mutex cache_mutex;
// Never destroyed: at interpreter exit the CUDA context may already be gone, and a Layer's destructor
// frees device memory.
auto* const layers = new std::map<LayerKey, std::unique_ptr<CachedLayer>>();
// Communicators mok.distributed.communicator handed out (register_communicator), until released.
auto* const known_comms = new std::set<uintptr_t>();
// Communicators on which a call failed on this rank since their Layers were last released.
auto* const failed_comms = new std::set<uintptr_t>();
void mark_failed_locked(uintptr_t comm) { failed_comms->insert(comm); }  // cache_mutex held

// An op's call, f(), its mok::Errors raised as ValueError (value_errors). Where its launch list names a
// communicator, a call that fails on this rank (an argument refused, an allocation, a kernel's error
// raised) may leave its Layers a launch behind their peers' (a call refused before its Layer ran takes no
// launch numbers), whose barriers would then pass on other launches' flags: the communicator is marked,
// and its calls are refused until this rank has released its Layers there (mok.distributed.release, which
// every rank calls; docs/python.md, "Collective calls").
template <class F>
auto op_errors(at::IntArrayRef launch, F&& f) -> decltype(f()) {
  const uintptr_t comm = launch.size() > kComm ? static_cast<uintptr_t>(launch[kComm]) : 0;
  if (!comm) return value_errors(f);
  {
    const std::lock_guard lock(cache_mutex);
    TORCH_CHECK(!failed_comms->count(comm),
                "mok: an earlier call on this process group failed on this rank, so its layers may be a launch "
                "behind their peers': call mok.distributed.release(group) on every rank before the next call");
  }
  try {
    return value_errors(f);
  } catch (...) {
    mark_communicator_failed(comm);
    throw;
  }
}

// The communicator's size must be the call's gpus (the argument checks used it for the shares' shapes).
void check_communicator(const Call& call) {
  const auto comm = reinterpret_cast<ncclComm_t>(call.comm);
  int count = 0;
  MOK_NCCL_CHECK(ncclCommCount(comm, &count));
  require(count == call.gpus, "gpus = " + std::to_string(call.gpus) + " but the communicator (comm) has " +
                                  std::to_string(count) + " ranks");
}

// The Layer's launch options for the call (without a communicator parse_call left gpus 1, capacity 0):
// on a communicator those the Layer runs (its constructor's on_communicator: windowed, one GPU's too),
// so layer_memory sizes that Layer.
gpu::LaunchConfig launch_config(const Call& call, bool fp8_weights_given) {
  gpu::LaunchConfig launch;
  launch.ring_rows = call.ring_rows;
  launch.blocks = call.blocks;
  launch.recompute = call.recompute;
  launch.gpus = call.gpus;
  if (call.comm) launch = gpu::on_communicator(launch, call.gpus);  // a process group's Layer
  launch.capacity_rows = call.capacity_rows;
  launch.fp8_weights_given = fp8_weights_given;
  launch.fp8_weight_gradients = call.fp8_weight_gradients;
  return launch;
}

// A Layer allocates device memory when it is built, which a CUDA graph capture on the stream makes fail
// with CUDA's error, naming neither the layer nor the fix. A process group's Layer is never captured
// (Layer::forward refuses it): its first call says so.
void refuse_building_in_capture(const Call& call, c10::DeviceIndex device) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(device).stream(), &status));
  if (status == cudaStreamCaptureStatusNone) return;
  require(!call.comm,
          std::string("a call on a process group (a peer group's Layer) ") + gpu::peer_group_capture_refusal);
  throw Error(
      "a CUDA graph is capturing this call, the first of its config and launch on this device (a call autograd "
      "does not record runs in recompute mode, and calls given fp8_weights on a Layer of their own), which "
      "builds that Layer, and a Layer allocates device memory. Make the same call once before capturing");
}

CachedLayer& layer_for(const Call& call, c10::DeviceIndex device, bool fp8_weights_given = false) {
  const auto [ints, floats] = pack_config(call.config);
  const LayerKey key{device, ints, pack_launch(call), floats, fp8_weights_given};
  const std::lock_guard lock(cache_mutex);
  auto it = layers->find(key);
  if (it == layers->end()) {
    refuse_building_in_capture(call, device);
    const gpu::LaunchConfig launch = launch_config(call, fp8_weights_given);
    // The caller's CUDAGuard made `device` current: a Layer lives on the device current at construction
    // (on a communicator, the communicator's device must be it: the Layer checks).
    std::unique_ptr<CachedLayer> made;
    if (call.comm) {
      require(known_comms->count(call.comm), [&] {
        return "comm = " + std::to_string(call.comm) +
               " is not a communicator mok.distributed.communicator handed out (or it was released since)";
      });
      check_communicator(call);
      // Collective: every rank of the communicator builds this Layer in the same order (its first call).
      made = std::make_unique<CachedLayer>(call.config, launch, reinterpret_cast<ncclComm_t>(call.comm));
    } else {
      made = std::make_unique<CachedLayer>(call.config, launch);
    }
    it = layers->emplace(key, std::move(made)).first;
  }
  return *it->second;
}

gpu::DType dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16:
      return gpu::DType::bf16;
    case at::kFloat:
      return gpu::DType::f32;
    case at::kInt:
      return gpu::DType::i32;
    case at::kByte:
      return gpu::DType::u8;
    default:
      throw Error("internal: no mok dtype for " + std::string(c10::toString(t)));
  }
}

// A tensor without elements is absent (data nullptr): the optional inputs, and the outputs a mode
// lacks (logits in mode given, the shared gradients without a shared expert).
gpu::TensorView view(const Tensor& t) {
  return gpu::TensorView{t.numel() ? t.data_ptr() : nullptr, dtype_of(t.scalar_type()), t.sizes().vec()};
}
gpu::TensorView view(const OptTensor& t) { return t ? view(*t) : gpu::TensorView{}; }

gpu::WeightViews weight_views(const LayerArgs& a) {
  return gpu::WeightViews{view(a.router), view(a.expert_bias), view(a.w1),
                          view(a.w2),     view(a.shared_w1),   view(a.shared_w2)};
}
// The layer's inputs; a given routing (forward only) and the fp8 mode's quantized weights are read by
// the kernel from the caller's tensors.
gpu::ForwardInputs inputs(const Call& call, const LayerArgs& a, const OptTensor& topk_idx = std::nullopt,
                          const OptTensor& topk_w = std::nullopt, const OptTensor& fp8_weights = std::nullopt) {
  return gpu::ForwardInputs{view(a.x), weight_views(a), call.mode, view(topk_idx), view(topk_w), view(fp8_weights)};
}

// The backward's: no given routing (the forward's routing is in its saved topk_idx and topk_w).
gpu::ForwardInputs backward_inputs(const Call& call, const LayerArgs& a, const OptTensor& fp8_weights) {
  return inputs(call, a, std::nullopt, std::nullopt, fp8_weights);
}

// set_poison_outputs: the tests' switch.
std::atomic<bool> poison_outputs{false};

// Outputs and the workspace without the fill that torch.use_deterministic_algorithms(True) gives
// at::empty: it writes every byte, 0.74 ms of a 2.8 ms olmoe forward (results/2026-12-01-h200-g).
// The kernels write every byte of their outputs (the saved buffer's gaps and spare rows included),
// and the workspace is theirs alone. Under set_poison_outputs each is filled with 0xff bytes on the
// current stream first, so an element the kernels leave unwritten shows instead of a freed block's bits.
Tensor uninitialized(at::IntArrayRef sizes, const at::TensorOptions& options) {
  Tensor t(at::detail::empty_cuda(sizes, options));
  if (poison_outputs.load(std::memory_order_relaxed) && t.nbytes() > 0)
    C10_CUDA_CHECK(
        cudaMemsetAsync(t.data_ptr(), 0xff, t.nbytes(), c10::cuda::getCurrentCUDAStream(t.device().index()).stream()));
  return t;
}

cudaStream_t current_stream(const Tensor& x) { return c10::cuda::getCurrentCUDAStream(x.device().index()).stream(); }

Tensor workspace(const gpu::Layer& layer, gpu::Pass pass, const Tensor& x, gpu::BackwardScratch scratch = {}) {
  return uninitialized({int64_t(layer.workspace_bytes(pass, scratch))}, x.options().dtype(at::kByte));
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> forward_cuda(
    const Tensor& x, const Tensor& router, const OptTensor& expert_bias, const Tensor& w1, const Tensor& w2,
    const OptTensor& shared_w1, const OptTensor& shared_w2, const OptTensor& topk_idx, const OptTensor& topk_w,
    at::IntArrayRef config_ints, at::ArrayRef<double> config_floats, int64_t routing_mode, at::IntArrayRef launch,
    const OptTensor& fp8_weights) {
  return op_errors(launch, [&] {
    const LayerArgs args{x, router, expert_bias, w1, w2, shared_w1, shared_w2};
    const Call call = checked_forward(OpKernel::cuda, config_ints, config_floats, routing_mode, launch, args, topk_idx,
                                      topk_w, fp8_weights, {.aligned = true});
    const c10::cuda::CUDAGuard guard(x.device());
    // Given quantized weights, the Layer whose workspace holds none.
    CachedLayer& cached = layer_for(call, x.device().index(), fp8_weights.has_value());
    const LayerConfig& c = call.config;
    const int64_t N = call.own_tokens(), k = c.top_k;
    const at::TensorOptions f32 = x.options().dtype(at::kFloat);
    // A given routing (checked contiguous, of the outputs' dtype and shape) is copied into these by the kernel.
    Tensor idx = uninitialized({N, k}, x.options().dtype(at::kInt));
    Tensor w = uninitialized({N, k}, f32);
    Tensor y = uninitialized({N, c.hidden}, x.options());
    Tensor logits = uninitialized(logits_shape(call), f32);
    const size_t saved_bytes = saved_of(call).bytes;  // the fake kernel's size
    Tensor saved = uninitialized({int64_t(saved_bytes)}, x.options().dtype(at::kByte));
    const std::lock_guard lock(cached.mutex);
    require(cached.layer.saved_bytes() == saved_bytes, "internal: the layer's saved size differs");
    const Tensor ws = workspace(cached.layer, gpu::Pass::forward, x);
    cached.layer.forward(current_stream(x), view(ws), inputs(call, args, topk_idx, topk_w, fp8_weights),
                         gpu::ForwardOutputs{view(y), view(idx), view(w), view(logits), view(saved)});
    return std::make_tuple(y, idx, w, logits, saved);
  });
}

// The fp8 mode's weights quantized on the current stream into a new uint8 tensor (every byte written),
// by the Layer of the forwards that read them.
Tensor quantize_weights_cuda(const Tensor& w1, const Tensor& w2, const OptTensor& shared_w1, const OptTensor& shared_w2,
                             at::IntArrayRef config_ints, at::ArrayRef<double> config_floats, at::IntArrayRef launch) {
  // Its first call on a group may build the Layer, collectively: a failure marks the group as the others' do.
  return op_errors(launch, [&] {
    const Call call = checked_quantize(OpKernel::cuda, config_ints, config_floats, launch, w1, w2, shared_w1, shared_w2,
                                       {.aligned = true});
    const c10::cuda::CUDAGuard guard(w1.device());
    CachedLayer& cached = layer_for(call, w1.device().index(), true);
    const std::lock_guard lock(cached.mutex);
    Tensor q = uninitialized({int64_t(cached.layer.fp8_weights_bytes())}, w1.options().dtype(at::kByte));
    cached.layer.quantize_weights(current_stream(w1), weight_views(expert_args(w1, w2, shared_w1, shared_w2)), view(q));
    return q;
  });
}

// dx, d_topk_w and d_logits of a backward, uninitialized (the kernels write every element).
std::tuple<Tensor, Tensor, Tensor> input_gradients(const Call& call, const Tensor& x) {
  const LayerConfig& c = call.config;
  const at::TensorOptions f32 = x.options().dtype(at::kFloat);
  return {uninitialized({call.own_tokens(), c.hidden}, x.options()), uninitialized({call.own_tokens(), c.top_k}, f32),
          uninitialized(logits_shape(call), f32)};
}

// The saved outputs as the layer's backward reads them; y is not kept by the op.
gpu::ForwardOutputs forward_of(const SavedArgs& s) {
  return gpu::ForwardOutputs{gpu::TensorView{}, view(s.topk_idx), view(s.topk_w), view(s.logits), view(s.saved)};
}

// The Layer's backward of a checked call, on x's device (made current by the caller's guard): dx, d topk_w
// and d logits made here, the weight gradients into grads' views (stored, or added into with
// grads.accumulate).
std::tuple<Tensor, Tensor, Tensor> layer_backward(const Call& call, const LayerArgs& args, const SavedArgs& s,
                                                  const Tensor& dy, const OptTensor& fp8_weights,
                                                  gpu::GradOutputs grads) {
  const Tensor& x = args.x;
  // Given the forward's quantized weights, the forward's Layer: its workspace holds no W and W^T, which
  // the backward reads from fp8_weights instead of quantizing them again.
  CachedLayer& cached = layer_for(call, x.device().index(), fp8_weights.has_value());
  auto [dx, d_topk_w, d_logits] = input_gradients(call, x);
  grads.dx = view(dx), grads.d_topk_w = view(d_topk_w), grads.d_logits = view(d_logits);
  const std::lock_guard lock(cached.mutex);
  const Tensor ws = workspace(cached.layer, gpu::Pass::backward, x, grads.scratch);
  cached.layer.backward(current_stream(x), view(ws), backward_inputs(call, args, fp8_weights), forward_of(s), view(dy),
                        grads);
  return {dx, d_topk_w, d_logits};
}

using BackwardOutputs = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

// mok::backward, and with kConsume mok::backward_consuming: dh over saved's h (BackwardScratch), its version
// moved.
template <bool kConsume>
BackwardOutputs storing_backward(const Tensor& x, const Tensor& router, const OptTensor& expert_bias, const Tensor& w1,
                                 const Tensor& w2, const OptTensor& shared_w1, const OptTensor& shared_w2,
                                 const Tensor& topk_idx, const Tensor& topk_w, const Tensor& logits,
                                 const Tensor& saved, const Tensor& dy, at::IntArrayRef config_ints,
                                 at::ArrayRef<double> config_floats, int64_t routing_mode, at::IntArrayRef launch,
                                 const OptTensor& fp8_weights) {
  return op_errors(launch, [&] {
    const LayerArgs args{x, router, expert_bias, w1, w2, shared_w1, shared_w2};
    const SavedArgs s{topk_idx, topk_w, logits, saved};
    const Call call = checked_backward(OpKernel::cuda, config_ints, config_floats, routing_mode, launch, args, s, dy,
                                       nullptr, fp8_weights, {.aligned = true});
    if (kConsume) require_consumable(saved);
    const c10::cuda::CUDAGuard guard(x.device());
    const LayerConfig& c = call.config;
    const int64_t H = c.hidden, I = c.intermediate, E = call.own_experts(), Is = c.shared_intermediate;
    Tensor d_router = uninitialized(d_router_shape(call), x.options().dtype(at::kFloat));
    // bf16 as the weights: the epilogue rounds each fp32 gradient once (no fp32 copy, no cast pass). d_w1 holds
    // the backward's scratch until dW1's tiles overwrite it (BackwardScratch::in_d_w1): a smaller workspace.
    Tensor d_w1 = uninitialized({E, 2 * I, H}, w1.options());
    Tensor d_w2 = uninitialized({E, H, I}, w1.options());
    Tensor d_shared_w1 = uninitialized({2 * Is, H}, w1.options());
    Tensor d_shared_w2 = uninitialized({H, Is}, w1.options());
    const gpu::GradOutputs grads{.d_router = view(d_router),
                                 .d_w1 = view(d_w1),
                                 .d_w2 = view(d_w2),
                                 .d_shared_w1 = view(d_shared_w1),
                                 .d_shared_w2 = view(d_shared_w2),
                                 .scratch = {.in_d_w1 = true, .dh_over_saved_h = kConsume}};
    auto [dx, d_topk_w, d_logits] = layer_backward(call, args, s, dy, fp8_weights, grads);
    if (kConsume) consumed(saved);
    return std::make_tuple(dx, d_topk_w, d_logits, d_router, d_w1, d_w2, d_shared_w1, d_shared_w2);
  });
}

std::tuple<Tensor, Tensor, Tensor> backward_accumulate_cuda(
    const Tensor& x, const Tensor& router, const OptTensor& expert_bias, const Tensor& w1, const Tensor& w2,
    const OptTensor& shared_w1, const OptTensor& shared_w2, const Tensor& topk_idx, const Tensor& topk_w,
    const Tensor& logits, const Tensor& saved, const Tensor& dy, const OptTensor& d_router, const Tensor& d_w1,
    const Tensor& d_w2, const OptTensor& d_shared_w1, const OptTensor& d_shared_w2, at::IntArrayRef config_ints,
    at::ArrayRef<double> config_floats, int64_t routing_mode, at::IntArrayRef launch, const OptTensor& fp8_weights) {
  return op_errors(launch, [&] {
    const LayerArgs args{x, router, expert_bias, w1, w2, shared_w1, shared_w2};
    const SavedArgs s{topk_idx, topk_w, logits, saved};
    const Accumulators acc{d_router, d_w1, d_w2, d_shared_w1, d_shared_w2};
    const Call call = checked_backward(OpKernel::cuda, config_ints, config_floats, routing_mode, launch, args, s, dy,
                                       &acc, fp8_weights, {.aligned = true});
    const c10::cuda::CUDAGuard guard(x.device());
    auto gradients = layer_backward(
        call, args, s, dy, fp8_weights,
        gpu::GradOutputs{
            {}, {}, {}, view(d_router), view(d_w1), view(d_w2), view(d_shared_w1), view(d_shared_w2), true});
    bump_versions(acc);
    return gradients;
  });
}

}  // namespace

// layer_memory's sizes, those the call's Layer takes (its own arithmetic, no device asked): a size query
// needs no GPU (torch's current_device() raised its AcceleratorError without one), builds no Layer and on a
// communicator makes no collective call.
WorkspaceBytes cuda_workspace_bytes(const Call& call) {
  const gpu::LaunchConfig launch = launch_config(call, false);
  const gpu::LayerMemory m = gpu::layer_memory(call.config, launch);
  const auto storing = [&](bool consume) {
    return gpu::layer_memory(call.config, launch, {.in_d_w1 = true, .dh_over_saved_h = consume}).workspace_backward;
  };
  return {m.workspace_forward, storing(false), storing(true), m.workspace_backward};
}

size_t cuda_fp8_weights_bytes(const Call& call) {
  return gpu::layer_memory(call.config, launch_config(call, false)).fp8_weights;
}

void release_cuda_layers(uintptr_t comm) {
  const std::lock_guard lock(cache_mutex);
  for (auto it = layers->begin(); it != layers->end();) {
    if (it->first.comm() != comm) {
      ++it;
      continue;
    }
    // A Layer is destroyed only after its last call's work is done (its stream may be any of the device's).
    const c10::cuda::CUDAGuard guard(it->first.device);
    c10::cuda::device_synchronize();
    it = layers->erase(it);  // on a communicator: deregisters its window (collective)
  }
  failed_comms->erase(comm);
  known_comms->erase(comm);
}

void register_communicator(uintptr_t comm) {
  const std::lock_guard lock(cache_mutex);
  known_comms->insert(comm);
}

void mark_communicator_failed(uintptr_t comm) {
  const std::lock_guard lock(cache_mutex);
  mark_failed_locked(comm);
}

void set_poison_outputs(bool on) { poison_outputs.store(on, std::memory_order_relaxed); }

void check_cuda_layers() {
  const std::lock_guard lock(cache_mutex);
  for (auto& [key, cached] : *layers) {
    const c10::cuda::CUDAGuard guard(key.device);
    const std::lock_guard layer_lock(cached->mutex);
    try {
      cached->layer.check();
    } catch (...) {
      if (key.comm()) mark_failed_locked(key.comm());  // as op_errors'
      throw;
    }
  }
}

TORCH_LIBRARY_IMPL(mok, CUDA, m) {
  m.impl("forward", &forward_cuda);
  m.impl("quantize_weights", &quantize_weights_cuda);
  m.impl("backward", &storing_backward<false>);
  m.impl("backward_consuming", &storing_backward<true>);
  m.impl("backward_accumulate", &backward_accumulate_cuda);
}

}  // namespace mok::py
