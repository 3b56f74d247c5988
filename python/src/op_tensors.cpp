#include "op_tensors.h"

#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstdint>
#include <iterator>

namespace mok::py {
namespace {

std::string shape_text(at::IntArrayRef shape) { return mok::shape_text({shape.data(), shape.size()}); }

// The bytes of its storage a contiguous tensor reaches to, its offset's included.
size_t spanned_bytes(const at::Tensor& t) { return size_t(t.storage_offset() + t.numel()) * t.itemsize(); }

// Refuses a contiguous tensor whose storage does not hold every byte of it (a storage resized to 0 has no data
// at all).
void require_holds_its_bytes(const at::Tensor& t, const std::string& name) {
  if (t.numel() == 0) return;
  const bool has_data = t.has_storage() && t.storage().data() != nullptr;
  require(has_data && spanned_bytes(t) <= t.storage().nbytes(), [&] {
    // A fake or meta tensor's storage has its size but no data: "holds N bytes, fewer than its N" said nothing.
    if (!has_data)
      return name +
             "'s storage has no data (freed, as FSDP frees a sharded parameter's, or a fake or meta "
             "tensor's among real ones)";
    return name + "'s storage holds " + std::to_string(t.storage().nbytes()) + " bytes, fewer than its " +
           std::to_string(spanned_bytes(t)) + " (shrunk: the layer would read past it)";
  });
}

// Checks every tensor of one call against x's device.
class Checker {
 public:
  // `first`: the tensor whose device the others must have (x; w1 for mok::quantize_weights).
  Checker(const at::Tensor& first, Checkable checkable, const char* first_name = "x")
      : device_(first.device()), checkable_(checkable), first_(first_name) {}

  // Whether the tensors' data pointers are real (with their sizes, which the spans need).
  bool addresses() const { return checkable_.addresses && checkable_.sizes_known; }

  // `dims` names the shape in the layer's terms, e.g. "[E, 2I, H]".
  // The messages are built only on failure: this runs for every tensor of every call.
  void operator()(const at::Tensor& t, const std::string& name, at::ScalarType dtype, at::IntArrayRef shape,
                  const char* dims) const {
    const auto refuse = [&](const std::string& what) { require(false, name + what); };
    if (t.device() != device_)
      refuse(" is on " + t.device().str() + " but " + first_ + " is on " + device_.str() +
             " (all tensors of a call must be on one device)");
    if (t.scalar_type() != dtype)
      refuse(std::string(" must be ") + c10::toString(dtype) + ", got " + c10::toString(t.scalar_type()));
    if (!checkable_.sizes_known) return;
    if (t.sizes() != shape)
      refuse(" must have shape " + shape_text(shape) + " = " + dims + " for this config, got " + shape_text(t.sizes()));
    if (!t.is_contiguous()) refuse(" is not contiguous (mok does not copy its inputs: pass .contiguous())");
    if (checkable_.addresses) require_holds_its_bytes(t, name);
    if (checkable_.aligned && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0)
      refuse("'s data is not 16-byte aligned (the GPU kernels read it in 16-byte units)");
  }

  // An optional tensor: present exactly when `wanted` (`why()` says when it is, built only on failure).
  template <class Why>
  void optional(const std::optional<at::Tensor>& t, bool wanted, Why why, const std::string& name, at::ScalarType dtype,
                at::IntArrayRef shape, const char* dims) const {
    require(t.has_value() == wanted, [&] { return name + (wanted ? " is missing: " : " must be None: ") + why(); });
    if (t) (*this)(*t, name, dtype, shape, dims);
  }

 private:
  at::Device device_;
  Checkable checkable_;
  const char* first_;
};

const char* mode_name(RoutingMode m) { return kRoutingModes[int(m)]; }

// A share's dimensions in the messages: the whole tensor's on one GPU, the share's over G > 1
// (the device API's names, docs/multi-gpu.md).
const char* dims(const Call& call, const char* whole, const char* share) { return call.gpus > 1 ? share : whole; }

void check_experts(const Checker& check, const Call& call, const LayerArgs& a);

void check_layer(const Checker& check, const Call& call, const LayerArgs& a) {
  const LayerConfig& c = call.config;
  const int64_t N = call.own_tokens(), H = c.hidden, E = c.experts;
  check(a.x, "x", at::kBFloat16, {N, H}, dims(call, "[N, H]", "[N/G, H]"));
  check(a.router, "router", at::kFloat, {E, H}, "[E, H]");
  if (a.expert_bias) check(*a.expert_bias, "expert_bias", at::kFloat, {E}, "[E]");
  validate_expert_bias_given(c, a.expert_bias.has_value());
  check_experts(check, call, a);
}

// The weights the fp8 mode quantizes: w1, w2 and the shared expert's.
void check_experts(const Checker& check, const Call& call, const LayerArgs& a) {
  const LayerConfig& c = call.config;
  const int64_t H = c.hidden, I = c.intermediate, Eg = call.own_experts(), Is = c.shared_intermediate;
  check(a.w1, "w1", at::kBFloat16, {Eg, 2 * I, H}, dims(call, "[E, 2I, H]", "[E/G, 2I, H]"));
  check(a.w2, "w2", at::kBFloat16, {Eg, H, I}, dims(call, "[E, H, I]", "[E/G, H, I]"));
  const auto shared_rule = [&] { return "the config's shared_intermediate is " + std::to_string(Is); };
  check.optional(a.shared_w1, c.has_shared(), shared_rule, "shared_w1", at::kBFloat16, {2 * Is, H}, "[2Is, H]");
  check.optional(a.shared_w2, c.has_shared(), shared_rule, "shared_w2", at::kBFloat16, {H, Is}, "[H, Is]");
}

void check_forward_args(const Checker& check, const Call& call, const LayerArgs& a,
                        const std::optional<at::Tensor>& topk_idx, const std::optional<at::Tensor>& topk_w) {
  check_layer(check, call, a);
  const int64_t N = call.own_tokens(), k = call.config.top_k;
  const auto rule = [&] { return std::string("routing mode ") + mode_name(call.mode); };
  const char* nk = dims(call, "[N, k]", "[N/G, k]");
  check.optional(topk_idx, call.mode != RoutingMode::router, rule, "topk_idx", at::kInt, {N, k}, nk);
  check.optional(topk_w, call.mode == RoutingMode::given, rule, "topk_w", at::kFloat, {N, k}, nk);
}

void check_backward_args(const Checker& check, const Call& call, const LayerArgs& a, const SavedArgs& s,
                         const at::Tensor& dy) {
  check_layer(check, call, a);
  const LayerConfig& c = call.config;
  const int64_t N = call.own_tokens(), k = c.top_k;
  const char* nk = dims(call, "[N, k]", "[N/G, k]");
  check(s.topk_idx, "topk_idx", at::kInt, {N, k}, nk);
  check(s.topk_w, "topk_w", at::kFloat, {N, k}, nk);
  check(s.logits, "logits", at::kFloat, logits_shape(call),
        dims(call, "[N, E] ([0, E] in mode given)", "[N/G, E] ([0, E] in mode given)"));
  check(s.saved, "saved", at::kByte, {int64_t(saved_of(call).bytes)}, "[saved_bytes]");
  check(dy, "dy", at::kBFloat16, {N, c.hidden}, dims(call, "[N, H]", "[N/G, H]"));
}

// The tensors of LayerArgs, SavedArgs or Accumulators, with their names.
template <class Tensors>
NamedTensorList named(const Tensors& tensors) {
  NamedTensorList named;
  tensors.for_each([&](const at::Tensor& t, const char* name) { named.emplace_back(name, t); });
  return named;
}

// No accumulator shares a byte with a tensor the backward reads (all checked contiguous): on the GPU the
// kernels would add into memory other blocks still read, in no fixed order.
void check_accumulators_apart(const Accumulators& acc, const LayerArgs& a, const SavedArgs& s, const at::Tensor& dy,
                              const std::optional<at::Tensor>& fp8_weights) {
  NamedTensorList reads = named(a);
  std::ranges::move(named(s), std::back_inserter(reads));
  reads.emplace_back("dy", dy);
  if (fp8_weights) reads.emplace_back("fp8_weights", *fp8_weights);
  check_apart(named(acc), reads);
}

void check_accumulators(const Checker& check, const Call& call, const Accumulators& acc) {
  const LayerConfig& c = call.config;
  const int64_t H = c.hidden, I = c.intermediate, E = c.experts, Eg = call.own_experts(), Is = c.shared_intermediate;
  check.optional(
      acc.d_router, call.mode != RoutingMode::given,
      [&] { return std::string("routing mode ") + mode_name(call.mode); }, "d_router", at::kFloat, {E, H}, "[E, H]");
  // The expert weights' accumulators: all fp32, or all bf16 (d_w1's dtype decides).
  const at::ScalarType wd = acc.d_w1.scalar_type() == at::kBFloat16 ? at::kBFloat16 : at::kFloat;
  check(acc.d_w1, "d_w1", wd, {Eg, 2 * I, H}, dims(call, "[E, 2I, H]", "[E/G, 2I, H]"));
  check(acc.d_w2, "d_w2", wd, {Eg, H, I}, dims(call, "[E, H, I]", "[E/G, H, I]"));
  const auto shared_rule = [&] { return "the config's shared_intermediate is " + std::to_string(Is); };
  check.optional(acc.d_shared_w1, c.has_shared(), shared_rule, "d_shared_w1", wd, {2 * Is, H}, "[2Is, H]");
  check.optional(acc.d_shared_w2, c.has_shared(), shared_rule, "d_shared_w2", wd, {H, Is}, "[H, Is]");
  // The kernels add into them and move their version counters (bump_versions): an inference tensor has
  // none, so it is refused here, before anything is added (torch.compile skips mok.moe's own check).
  acc.for_each([](const at::Tensor& t, const char* name) {
    require(!t.is_inference(), [&] {
      return std::string(name) +
             " is an inference tensor (made under torch.inference_mode), which no backward may write";
    });
  });
  if (check.addresses()) check_disjoint(named(acc));  // checked contiguous above
}

// The fp8 mode's quantized weights (their size the layer checks); the CPU op takes none.
void check_fp8_weights(OpKernel kernel, const Call& call, const at::Tensor& x,
                       const std::optional<at::Tensor>& fp8_weights) {
  if (!fp8_weights) return;
  require(call.config.precision == Precision::fp8,
          "fp8_weights is given, but the config's precision is bf16 (only the fp8 mode reads quantized weights)");
  const at::Tensor& q = *fp8_weights;
  require(q.device() == x.device(),
          [&] { return "fp8_weights is on " + q.device().str() + " but x is on " + x.device().str(); });
  require(q.scalar_type() == at::kByte && q.dim() == 1 && q.is_contiguous(),
          "fp8_weights must be a contiguous one-dimensional uint8 tensor (mok.quantize_weights' result)");
  require(kernel != OpKernel::cpu, kCpuQuantizes);
}

// parse_call, and the CPU op's refusal of a communicator.
Call parse_op_call(OpKernel kernel, c10::IntArrayRef config_ints, c10::ArrayRef<double> config_floats,
                   int64_t routing_mode, c10::IntArrayRef launch) {
  Call call = parse_call(config_ints, config_floats, routing_mode, launch);
  require(kernel != OpKernel::cpu || call.comm == 0,
          "a call on a communicator (comm != 0: a torch.distributed process group's share of the layer) runs on "
          "the GPU only; the CPU op computes the whole layer in one process (pass group=None and every token "
          "and expert)");
  return call;
}

}  // namespace

std::vector<int64_t> logits_shape(const Call& call) {
  return {call.mode == RoutingMode::given ? 0 : call.own_tokens(), call.config.experts};
}

std::vector<int64_t> d_router_shape(const Call& call) {
  return {call.mode == RoutingMode::given ? 0 : int64_t(call.config.experts), call.config.hidden};
}

Call checked_forward(OpKernel kernel, c10::IntArrayRef config_ints, c10::ArrayRef<double> config_floats,
                     int64_t routing_mode, c10::IntArrayRef launch, const LayerArgs& a,
                     const std::optional<at::Tensor>& topk_idx, const std::optional<at::Tensor>& topk_w,
                     const std::optional<at::Tensor>& fp8_weights, Checkable checkable) {
  const Call call = parse_op_call(kernel, config_ints, config_floats, routing_mode, launch);
  check_forward_args(Checker(a.x, checkable), call, a, topk_idx, topk_w);
  check_fp8_weights(kernel, call, a.x, fp8_weights);
  return call;
}

Call checked_backward(OpKernel kernel, c10::IntArrayRef config_ints, c10::ArrayRef<double> config_floats,
                      int64_t routing_mode, c10::IntArrayRef launch, const LayerArgs& a, const SavedArgs& s,
                      const at::Tensor& dy, const Accumulators* acc, const std::optional<at::Tensor>& fp8_weights,
                      Checkable checkable) {
  const Call call = parse_op_call(kernel, config_ints, config_floats, routing_mode, launch);
  const Checker check(a.x, checkable);
  check_backward_args(check, call, a, s, dy);
  if (acc) check_accumulators(check, call, *acc);
  check_fp8_weights(kernel, call, a.x, fp8_weights);
  if (acc && check.addresses()) check_accumulators_apart(*acc, a, s, dy, fp8_weights);
  return call;
}

Call checked_quantize(OpKernel kernel, c10::IntArrayRef config_ints, c10::ArrayRef<double> config_floats,
                      c10::IntArrayRef launch, const at::Tensor& w1, const at::Tensor& w2,
                      const std::optional<at::Tensor>& shared_w1, const std::optional<at::Tensor>& shared_w2,
                      Checkable checkable) {
  const Call call = parse_call(config_ints, config_floats, int64_t(RoutingMode::router), launch);
  require(call.config.precision == Precision::fp8,
          "quantize_weights: the config's precision is bf16 (only the fp8 mode quantizes its weights)");
  require(kernel != OpKernel::cpu, kCpuQuantizes);
  check_experts(Checker(w1, checkable, "w1"), call, expert_args(w1, w2, shared_w1, shared_w2));
  return call;
}

LayerWeights weights_of(const LayerArgs& a) {
  return LayerWeights{values<float>(a.router), values<float>(a.expert_bias), values<bf16>(a.w1),
                      values<bf16>(a.w2),      values<bf16>(a.shared_w1),    values<bf16>(a.shared_w2)};
}

LayerArgs expert_args(const at::Tensor& w1, const at::Tensor& w2, const std::optional<at::Tensor>& shared_w1,
                      const std::optional<at::Tensor>& shared_w2) {
  static const std::optional<at::Tensor> none;  // referenced by the result
  return LayerArgs{w1, w1, none, w1, w2, shared_w1, shared_w2};
}

namespace {

// A contiguous tensor's bytes [begin, end) and its name in messages.
struct NamedSpan {
  uintptr_t begin, end;
  std::string name;
};

NamedSpan span_of(const at::Tensor& t, std::string name) {
  require(t.is_contiguous(), [&] { return name + " is not contiguous (its bytes are not one span)"; });
  require_holds_its_bytes(t, name);  // two freed ones were named as overlapping
  const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  return NamedSpan{begin, begin + t.nbytes(), std::move(name)};
}

}  // namespace

void check_disjoint(const NamedTensorList& named) {
  std::vector<NamedSpan> spans;
  for (const auto& [name, t] : named) spans.push_back(span_of(t, name));
  // Sorted by start (ties in the given order, so the message is the same run to run), an overlap shows
  // between two neighbours. An empty span overlaps nothing.
  std::erase_if(spans, [](const NamedSpan& s) { return s.begin == s.end; });
  std::stable_sort(spans.begin(), spans.end(),
                   [](const NamedSpan& a, const NamedSpan& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < spans.size(); ++i)
    require(spans[i].begin >= spans[i - 1].end, [&] {
      return spans[i].name + " overlaps " + spans[i - 1].name +
             " in memory: the backward would add both gradients into the shared elements (give each its own memory)";
    });
}

void check_apart(const NamedTensorList& accumulators, const NamedTensorList& reads) {
  std::vector<NamedSpan> read_spans;
  for (const auto& [name, t] : reads) read_spans.push_back(span_of(t, name));
  for (const auto& [name, t] : accumulators) {
    const NamedSpan a = span_of(t, name);
    for (const NamedSpan& r : read_spans)
      require(a.begin >= r.end || r.begin >= a.end || a.begin == a.end || r.begin == r.end, [&] {
        return a.name + " overlaps " + r.name +
               " in memory: the backward would add into memory it reads (give the accumulator its own memory)";
      });
  }
}

void bump_versions(const Accumulators& acc) {
  acc.for_each([](const at::Tensor& t, const char*) { torch::autograd::impl::bump_version(t); });
}

void require_consumable(const at::Tensor& saved) {
  require(!saved.is_inference(),
          "saved is an inference tensor (made under torch.inference_mode), which mok::backward_consuming may not "
          "write: use mok::backward");
}

void consumed(const at::Tensor& saved) { torch::autograd::impl::bump_version(saved); }

}  // namespace mok::py
