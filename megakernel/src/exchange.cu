#include "chain_relay.cuh"
#include "exchange.h"
#include "mok/megakernel/check.h"
#include "peer_group.h"

namespace mok::gpu {
namespace {

template <class T>
T* at_offset(uint8_t* base, size_t offset) {
  return reinterpret_cast<T*>(base + offset);
}

// The mode's given routing: the caller's input, or (absent) the output read in place.
const TensorView& given(const TensorView& input, const TensorView& output) { return input.data ? input : output; }

}  // namespace

Exchange::WindowLayout Exchange::window_layout(const LayerConfig& c, int gpus) {
  const size_t N = c.tokens(), H = c.hidden, k = c.top_k, S = shared_rows_capacity(c, gpus);
  WindowLayout l{};
  Sections sections(4096);
  l.x = sections.take(S * H * sizeof(bf16));
  l.dy = sections.take(S * H * sizeof(bf16));
  l.topk_idx = sections.take(N * k * sizeof(int32_t));
  l.topk_w = sections.take(N * k * sizeof(float));
  l.slots = sections.take(N / gpus * k * H * sizeof(bf16));
  l.d_topk_w = sections.take(N * k * sizeof(float));
  l.flags = sections.take(kMaxGpus * sizeof(unsigned int));
  l.abort = sections.take(sizeof(unsigned long long));
  const RelaySizes relay = relay_sizes(c);
  l.relay = sections.take(gpus > 1 ? relay.floats * sizeof(float) : 0);
  l.relay_flags = sections.take(gpus > 1 ? relay.units() * sizeof(unsigned int) : 0);
  l.relay_zeros = sections.take(gpus > 1 ? kHalfTileFloats * sizeof(float) : 0);  // zeroed with the window
  l.bytes = sections.bytes();
  return l;
}

Exchange::Exchange(const LayerConfig& c, int gpu, const PeerGroup* peers)
    : c_(c), gpu_(gpu), at_(window_layout(c, peers ? peers->gpus() : 1)) {
  if (peers == nullptr) return;
  gpus_ = peers->gpus();
  own_ = peers->local(gpu);
  windows_ = peers->peers(gpu);
}

PeerSync Exchange::peer_sync(unsigned long long launches, unsigned int* count) const {
  PeerSync s{};
  s.gpus = gpus_, s.me = gpu_;
  for (int j = 0; j < gpus_ && windowed(); ++j) {
    s.flags[j] = at_offset<unsigned int>(windows_[j], at_.flags);
    s.abort[j] = at_offset<unsigned long long>(windows_[j], at_.abort);
  }
  s.epoch = launches * kEpochStride;
  s.count = count;
  return s;
}

// The relay's flags hold this launch's values only after this launch raised them: a launch's values
// are above every earlier launch's (32 bits, compared by difference).
ChainRelay Exchange::relay(unsigned long long launches) const {
  ChainRelay r{};
  if (!windowed()) return r;
  r.in = at_offset<float>(own_, at_.relay);
  r.in_flags = at_offset<unsigned int>(own_, at_.relay_flags);
  r.zeros = at_offset<float>(own_, at_.relay_zeros);
  for (int j = 0; j < gpus_; ++j) {
    r.out[j] = at_offset<float>(windows_[j], at_.relay);
    r.out_flags[j] = at_offset<unsigned int>(windows_[j], at_.relay_flags);
  }
  r.partial = unsigned(launches) * 2 + 1;
  r.result = r.partial + 1;
  return r;
}

RankBuffers Exchange::rank_buffers(int r) const {
  const int per_gpu = c_.ranks / gpus_, owner = r / per_gpu, local = r % per_gpu;
  uint8_t* base = owner == gpu_ ? own_ : windows_[owner];
  const size_t T = c_.tokens_per_rank, H = c_.hidden, k = c_.top_k;
  return RankBuffers{
      at_offset<bf16>(base, at_.x) + local * T * H,         at_offset<bf16>(base, at_.dy) + local * T * H,
      at_offset<int32_t>(base, at_.topk_idx) + r * T * k,   at_offset<float>(base, at_.topk_w) + r * T * k,
      at_offset<bf16>(base, at_.slots) + local * T * k * H, at_offset<float>(base, at_.d_topk_w) + r * T * k};
}

// Windowed: the views are this GPU's window (its own ranks through the same address as the
// views: the window's peer mapping is another address of the same bytes, and a launch that wrote
// through one must not read through the other).
void Exchange::bind_window(Params& p) const {
  uint8_t* own = own_;
  for (int r = 0; r < c_.ranks; ++r) p.rank[r] = rank_buffers(r);
  p.x = at_offset<bf16>(own, at_.x);
  p.dy = at_offset<bf16>(own, at_.dy);
  p.topk_idx = at_offset<int32_t>(own, at_.topk_idx);
  p.topk_w = at_offset<float>(own, at_.topk_w);
}

void Exchange::copy_in(cudaStream_t stream, void* view, const TensorView& local, size_t bytes_per_token,
                       size_t first_token) const {
  MOK_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(view) + first_token * bytes_per_token, local.data,
                                 own_tokens() * bytes_per_token, cudaMemcpyDeviceToDevice, stream));
}

void Exchange::copy_out(cudaStream_t stream, const TensorView& local, const void* view, size_t bytes_per_token) const {
  const size_t bytes = own_tokens() * bytes_per_token;
  MOK_CUDA_CHECK(cudaMemcpyAsync(local.data, static_cast<const uint8_t*>(view) + own_first_token() * bytes_per_token,
                                 bytes, cudaMemcpyDeviceToDevice, stream));
}

void Exchange::bind_forward(Params& p, cudaStream_t stream, const ForwardInputs& in, const ForwardOutputs& out,
                            uint8_t* slots) const {
  const size_t T = c_.tokens_per_rank, H = c_.hidden, k = c_.top_k;
  if (!windowed()) {
    p.x = ptr<bf16>(in.x);
    p.topk_idx = ptr<int32_t>(out.topk_idx);
    p.topk_w = ptr<float>(out.topk_w);
    p.given_topk_idx = ptr<int32_t>(given(in.topk_idx, out.topk_idx));
    p.given_topk_w = ptr<float>(given(in.topk_w, out.topk_w));
    for (int r = 0; r < c_.ranks; ++r)
      p.rank[r] = RankBuffers{p.x + r * T * H,
                              nullptr,
                              p.topk_idx + r * T * k,
                              p.topk_w + r * T * k,
                              reinterpret_cast<bf16*>(slots) + r * T * k * H,
                              nullptr};
    return;
  }
  bind_window(p);
  copy_in(stream, p.x, in.x, H * sizeof(bf16), 0);
  // A given routing arrives per GPU; the kernel gathers every token's (every GPU lays out all).
  if (in.routing != RoutingMode::router)
    copy_in(stream, p.topk_idx, given(in.topk_idx, out.topk_idx), k * sizeof(int32_t), own_first_token());
  if (in.routing == RoutingMode::given)
    copy_in(stream, p.topk_w, given(in.topk_w, out.topk_w), k * sizeof(float), own_first_token());
  p.given_topk_idx = p.topk_idx;
  p.given_topk_w = p.topk_w;
}

void Exchange::after_forward(cudaStream_t stream, const ForwardInputs& in, const ForwardOutputs& out) const {
  if (!windowed()) return;
  const size_t k = c_.top_k;
  // The outputs already hold what was read in place from them.
  if (in.routing == RoutingMode::router || in.topk_idx.data)
    copy_out(stream, out.topk_idx, own_ + at_.topk_idx, k * sizeof(int32_t));
  if (in.routing != RoutingMode::given || in.topk_w.data)
    copy_out(stream, out.topk_w, own_ + at_.topk_w, k * sizeof(float));
}

void Exchange::bind_backward(Params& p, cudaStream_t stream, const ForwardInputs& in, const ForwardOutputs& fwd,
                             const TensorView& dy, const GradOutputs& grads, uint8_t* slots) const {
  const size_t T = c_.tokens_per_rank, H = c_.hidden, k = c_.top_k;
  p.d_logits = ptr<float>(grads.d_logits);  // this GPU's tokens' (the router-weight gradient's chains are relayed)
  if (!windowed()) {
    p.x = ptr<bf16>(in.x);
    p.dy = ptr<bf16>(dy);
    p.topk_idx = ptr<int32_t>(fwd.topk_idx);
    p.topk_w = ptr<float>(fwd.topk_w);
    float* d_topk_w = ptr<float>(grads.d_topk_w);
    for (int r = 0; r < c_.ranks; ++r)
      p.rank[r] = RankBuffers{p.x + r * T * H,
                              p.dy + r * T * H,
                              p.topk_idx + r * T * k,
                              p.topk_w + r * T * k,
                              reinterpret_cast<bf16*>(slots) + r * T * k * H,
                              d_topk_w + r * T * k};
    return;
  }
  bind_window(p);
  copy_in(stream, p.x, in.x, H * sizeof(bf16), 0);
  copy_in(stream, p.dy, dy, H * sizeof(bf16), 0);
  copy_in(stream, p.topk_idx, fwd.topk_idx, k * sizeof(int32_t), own_first_token());
  copy_in(stream, p.topk_w, fwd.topk_w, k * sizeof(float), own_first_token());
}

void Exchange::after_backward(cudaStream_t stream, const GradOutputs& grads) const {
  if (!windowed()) return;
  copy_out(stream, grads.d_topk_w, own_ + at_.d_topk_w, c_.top_k * sizeof(float));
}

}  // namespace mok::gpu
