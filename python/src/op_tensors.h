// The ops' tensor arguments: the checks of the CPU and CUDA kernels and of the fake kernels (before any
// work, each a mok::Error naming the tensor), and copies between tensors and the layer's host vectors.
#pragma once

#include <ATen/ATen.h>

#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "op_config.h"

namespace mok::py {

// The forward's inputs as both ops receive them.
struct LayerArgs {
  const at::Tensor& x;
  const at::Tensor& router;
  const std::optional<at::Tensor>& expert_bias;
  const at::Tensor& w1;
  const at::Tensor& w2;
  const std::optional<at::Tensor>& shared_w1;
  const std::optional<at::Tensor>& shared_w2;

  // f(tensor, name) for each tensor given.
  template <class F>
  void for_each(F f) const {
    f(x, "x");
    f(router, "router");
    if (expert_bias) f(*expert_bias, "expert_bias");
    f(w1, "w1");
    f(w2, "w2");
    if (shared_w1) f(*shared_w1, "shared_w1");
    if (shared_w2) f(*shared_w2, "shared_w2");
  }
};

// mok::quantize_weights' arguments as LayerArgs: only the experts' fields (w1, w2 and the shared expert's)
// are meant to be read; x and router are w1, expert_bias absent.
LayerArgs expert_args(const at::Tensor& w1, const at::Tensor& w2, const std::optional<at::Tensor>& shared_w1,
                      const std::optional<at::Tensor>& shared_w2);

// What the forward returned that the backward reads (its y is not needed).
struct SavedArgs {
  const at::Tensor& topk_idx;
  const at::Tensor& topk_w;
  const at::Tensor& logits;
  const at::Tensor& saved;

  // f(tensor, name) for each tensor.
  template <class F>
  void for_each(F f) const {
    f(topk_idx, "topk_idx");
    f(topk_w, "topk_w");
    f(logits, "logits");
    f(saved, "saved");
  }
};

// The weight-gradient accumulators of mok::backward_accumulate: d_router fp32; d_w1, d_w2 and the
// shared expert's all fp32 or all bf16.
struct Accumulators {
  const std::optional<at::Tensor>& d_router;
  const at::Tensor& d_w1;
  const at::Tensor& d_w2;
  const std::optional<at::Tensor>& d_shared_w1;
  const std::optional<at::Tensor>& d_shared_w2;

  // f(tensor, name) for each accumulator given.
  template <class F>
  void for_each(F f) const {
    if (d_router) f(*d_router, "d_router");
    f(d_w1, "d_w1");
    f(d_w2, "d_w2");
    if (d_shared_w1) f(*d_shared_w1, "d_shared_w1");
    if (d_shared_w2) f(*d_shared_w2, "d_shared_w2");
  }
};

// After a kernel added into them: each accumulator's version counter moves, as an in-place op's does, so
// a graph that saved one refuses its backward rather than reading the new values.
void bump_versions(const Accumulators& acc);

// mok::backward_consuming's saved (dh written over its h on the GPU): refused where it has no version counter
// (before any work), its version moved after the call, so that a graph holding it refuses a second backward.
void require_consumable(const at::Tensor& saved);
void consumed(const at::Tensor& saved);

// Shapes of the tensors a routing mode may lack: their first dimension is 0 where the mode has none
// (logits and d_logits [N, E], d_router [E, H] in mode given). With a communicator (Call::gpus = G)
// the per-token tensors are this GPU's N / G tokens and w1, w2 and their gradients its E / G experts;
// router, expert_bias, the shared expert and d_router stay whole.
std::vector<int64_t> logits_shape(const Call& call);
std::vector<int64_t> d_router_shape(const Call& call);

// The kernel whose checks a call gets: the CPU op's (the whole layer in one process: no communicator,
// no quantized weights given), the CUDA op's, or none's (tensors on another device, e.g. meta, which no
// kernel of mok's runs on: the checks every kernel makes, so that such a tensor beside others is refused).
enum class OpKernel { cpu, cuda, none };

// What of a call's tensors can be checked: their data's 16-byte alignment (the CUDA kernels read
// 16-byte units; fake tensors have no data), their shapes and contiguity (symbolic sizes, under
// torch.compile's dynamic shapes, are left to the kernel, which sees them when it runs), and where their
// data lies (the accumulators' overlap; the fake kernels' tensors have no addresses).
struct Checkable {
  bool aligned = false, sizes_known = true, addresses = true;
};

// (name, tensor) pairs in order, as the checks below name them (golden_io.h's NamedTensors: a map by name).
using NamedTensorList = std::vector<std::pair<std::string, at::Tensor>>;

// Refuses two of the (name, contiguous tensor) pairs that share a byte, naming both: mok::backward_accumulate
// adds into each accumulator in turn, so each would take the other's gradient too (on the GPU in no fixed
// order). Disjoint views of one buffer pass. Also mok._C.check_disjoint, which mok.moe calls at the call
// (eager).
void check_disjoint(const NamedTensorList& named);

// Refuses an accumulator (name, contiguous tensor) that shares a byte with one of `reads`, the tensors the
// backward reads, naming both. Also mok._C.check_apart, which mok.moe calls at the call (eager) with the
// inputs known there.
void check_apart(const NamedTensorList& accumulators, const NamedTensorList& reads);

// Each op's checks, before any work, each a mok::Error naming what is wrong: the config and launch
// list (parse_call), then every tensor on x's device, of its dtype and the config's shape, contiguous;
// optional tensors present exactly where the config and mode use them; fp8_weights only in the fp8
// mode (on x's device, uint8, one dimension, contiguous; its size the layer checks); expert_bias only in
// sigmoid mode; backward_accumulate's accumulators disjoint (not in the fakes). The kernels and the
// fake kernels (mok/_ops.py, through mok._C) run these, so tracing raises what the kernel would.
// Returns the call.
Call checked_forward(OpKernel kernel, c10::IntArrayRef config_ints, c10::ArrayRef<double> config_floats,
                     int64_t routing_mode, c10::IntArrayRef launch, const LayerArgs& a,
                     const std::optional<at::Tensor>& topk_idx, const std::optional<at::Tensor>& topk_w,
                     const std::optional<at::Tensor>& fp8_weights, Checkable checkable);
// acc: mok::backward_accumulate's accumulators (null for mok::backward).
Call checked_backward(OpKernel kernel, c10::IntArrayRef config_ints, c10::ArrayRef<double> config_floats,
                      int64_t routing_mode, c10::IntArrayRef launch, const LayerArgs& a, const SavedArgs& s,
                      const at::Tensor& dy, const Accumulators* acc, const std::optional<at::Tensor>& fp8_weights,
                      Checkable checkable);
// mok::quantize_weights' (w1's device for all): the CPU op refuses every call (kCpuQuantizes), after the
// fp8 precision check that both make first (the bf16 reason, as the CUDA op gives it).
Call checked_quantize(OpKernel kernel, c10::IntArrayRef config_ints, c10::ArrayRef<double> config_floats,
                      c10::IntArrayRef launch, const at::Tensor& w1, const at::Tensor& w2,
                      const std::optional<at::Tensor>& shared_w1, const std::optional<at::Tensor>& shared_w2,
                      Checkable checkable);
// The CPU op takes no quantized weights (mok::forward's and mok::backward's fp8_weights): the reference
// quantizes them in each forward and backward.
inline constexpr const char* kCpuQuantizes =
    "the CPU op quantizes the fp8 mode's weights in each forward and backward: fp8_weights (mok.quantize_weights) "
    "is for the CUDA op only";

template <class T>
constexpr at::ScalarType scalar_type_of();
template <>
constexpr at::ScalarType scalar_type_of<bf16>() {
  return at::kBFloat16;  // the same 16 bits as mok::bf16
}
template <>
constexpr at::ScalarType scalar_type_of<float>() {
  return at::kFloat;
}
template <>
constexpr at::ScalarType scalar_type_of<int32_t>() {
  return at::kInt;
}
template <>
constexpr at::ScalarType scalar_type_of<uint8_t>() {
  return at::kByte;
}

// A checked, contiguous CPU tensor's elements.
template <class T>
std::vector<T> values(const at::Tensor& t) {
  require(
      t.scalar_type() == scalar_type_of<T>() && t.is_cpu() && t.is_contiguous(),
      "internal: values() of a tensor that is not a contiguous CPU " + std::string(c10::toString(scalar_type_of<T>())));
  std::vector<T> v(size_t(t.numel()));
  if (!v.empty()) std::memcpy(v.data(), t.data_ptr(), v.size() * sizeof(T));
  return v;
}

template <class T>
std::vector<T> values(const std::optional<at::Tensor>& t) {
  return t ? values<T>(*t) : std::vector<T>();
}

// A new CPU tensor holding `v` (whose size must match the shape).
template <class T>
at::Tensor tensor_of(const std::vector<T>& v, const std::vector<int64_t>& shape) {
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(scalar_type_of<T>()));
  require(size_t(t.numel()) == v.size(), "internal: " + std::to_string(v.size()) + " values for a tensor of " +
                                             std::to_string(t.numel()) + " elements");
  if (!v.empty()) std::memcpy(t.data_ptr(), v.data(), v.size() * sizeof(T));
  return t;
}

// The weights of checked CPU arguments, as the reference takes them.
LayerWeights weights_of(const LayerArgs& a);

// Runs f; a mok::Error becomes a c10::ValueError (Python's ValueError) with its message.
template <class F>
auto value_errors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    C10_THROW_ERROR(ValueError, e.what());
  }
}

}  // namespace mok::py
