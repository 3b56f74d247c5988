// The host-vector API over the device API: device copies of the weights and of every result in the
// three tables of mok/megakernel/layer_tensors.h (weights, forward, gradients); outputs poisoned before
// each launch, the workspace before each backward; one Layer per GPU (or colocated share of one GPU),
// each holding its share of the tokens and experts, launched on its own stream on every GPU before any
// is waited for (they meet at the barriers across GPUs); the global results assembled from the shares.
#include <algorithm>
#include <cstring>
#include <exception>
#include <string>
#include <utility>

#include "current_device.h"
#include "device_array.cuh"
#include "exchange.h"
#include "mok/megakernel/layer_tensors.h"
#include "mok/megakernel/megakernel.h"
#include "params.cuh"
#include "peer_group.h"

namespace mok::gpu {
namespace {

// Cause first: a GPU that stopped on an error ends the others' launches at their next barrier across
// GPUs (kPeerAborted), or leaves them waiting for it (kPeerTimeout).
constexpr int kErrorPriority[] = {kLogitOverflow, kExpertBias,  kBadRouting,      kSavedLayout,
                                  kCapacity,      kRingCycles,  kPipelineTimeout, kBarrierTimeout,
                                  kRelayTimeout,  kPeerTimeout, kPeerAborted};

// A stream of the wrapper's, one per share: on one stream, or on the legacy default stream (whose work
// waits for all work before it), colocated shares' kernels would run one after another and never meet
// at the barrier across GPUs. Non-blocking, so that nothing on the legacy default stream orders itself
// with them: the wrapper synchronises the device before its launches instead.
class Stream {
 public:
  Stream() { MOK_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() {
    if (s_) (void)cudaStreamDestroy(s_);  // a destructor cannot throw; a device error has been raised before
  }
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}  // the shares' vector moves
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace

bool device_available() { return hopper_gpus() > 0; }

int hopper_gpus() {
  const int n = cuda_device_count();
  int hopper = 0;
  cudaDeviceProp prop;
  for (; hopper < n; ++hopper) {
    // A device the runtime counts but cannot describe is broken, not absent: raised, as
    // cuda_device_count raises, rather than skipping the GPU work in silence.
    MOK_CUDA_CHECK(cudaGetDeviceProperties(&prop, hopper));
    if (prop.major != 9 || prop.minor != 0) break;
  }
  return hopper;
}

// GPU g's share (or colocated share g of one GPU), made with its device current: its Layer, its
// stream, and the wrapper's device copies of its share of the weights and results.
struct GpuShare {
  int index = 0, device = 0;
  Stream stream;
  std::unique_ptr<Layer> layer;
  DeviceTensor workspace;
  WeightTensors weights;
  ForwardTensors fwd;
  GradTensors grad;
  DeviceTensor fp8_weights;  // LaunchConfig::fp8_weights_given: the weights quantized, read by every pass

  GpuShare(int g, int d, const LayerConfig& c, const LayerWeights& w, const LaunchConfig& launch,
           const PeerGroup* peers)
      : index(g),
        device(d),
        layer(std::make_unique<Layer>(c, launch, g, peers)),
        workspace(DType::u8, {int64_t(layer->workspace_bytes(Pass::backward))}),
        weights(c, w, g, launch.gpus),
        fwd(c, layer->saved_bytes(), launch.gpus),
        grad(c, launch.gpus) {
    if (launch.fp8_weights_given) fp8_weights = DeviceTensor(DType::u8, {int64_t(layer->fp8_weights_bytes())});
  }
  void use() const { MOK_CUDA_CHECK(cudaSetDevice(device)); }
  ForwardInputs inputs(RoutingMode mode) const {
    return {fwd.x.view(), weights.views(), mode, {}, {}, fp8_weights.view()};
  }
};

struct Megakernel::Impl {
  LayerConfig c;
  LaunchConfig launch;
  RoutingMode routing = RoutingMode::router;
  bool has_forward = false;
  bool accumulate = false;
  std::shared_ptr<const PeerGroup> peers;  // declared before gpus, so released after them
  std::vector<GpuShare> gpus;

  ~Impl() {
    const KeepCurrentDevice keep;
    while (!gpus.empty()) {  // each GPU's memory freed with that GPU current
      cudaSetDevice(gpus.back().device);
      gpus.pop_back();
    }
  }

  int shares() const { return launch.gpus; }

  // Every GPU's launch is enqueued before any is waited for; then each one's verdict, cause first.
  template <class Launch>
  void run(Launch launch_one) {
    for (GpuShare& s : gpus) {  // the uploads and poisons (legacy default stream) land before the launches
      s.use();
      MOK_CUDA_CHECK(cudaDeviceSynchronize());
    }
    // Every GPU makes the call, whichever throws: a call takes its launch numbers before it may throw, so
    // the GPUs stay numbered alike; those that launched wait for one that did not until their watchdogs
    // end them, and every GPU's recorded error is then cleared. The first GPU's exception is the one thrown.
    std::exception_ptr failed;
    for (GpuShare& s : gpus) try {
        s.use();
        launch_one(s);
      } catch (...) {
        if (!failed) failed = std::current_exception();
      }
    if (failed) {
      for (GpuShare& s : gpus) try {
          s.use();
          s.layer->check();
        } catch (const Error&) {
        }
      std::rethrow_exception(failed);
    }
    std::vector<Layer::DeviceError> errors;
    for (GpuShare& s : gpus) {
      s.use();
      MOK_CUDA_CHECK(cudaDeviceSynchronize());
      errors.push_back(s.layer->poll_error());
    }
    for (int code : kErrorPriority)
      for (const Layer::DeviceError& e : errors)
        if (e.code == code) {
          for (GpuShare& s : gpus) try {  // clear every GPU's record; the cause is the one reported
              s.use();
              s.layer->check();
            } catch (const Error&) {
            }
          throw Error(e.message);
        }
    for (const Layer::DeviceError& e : errors)  // a code the list lacks would be dropped: a bug of mok's
      if (e.code != kNoError)
        fail_internal("device error code " + std::to_string(e.code) + " is not ranked: " + e.message);
  }

  // The [N k, width] layout-row view of h or a: expert e's rows from the GPU that owns it.
  std::vector<bf16> expert_rows(std::vector<bf16> Forward::*field, size_t width, const Forward& layout_of,
                                const std::vector<Forward>& per_gpu) const {
    const int E = c.experts, per_share = E / shares();
    std::vector<bf16> out(size_t(layout_of.layout.offsets[E]) * width);
    for (size_t g = 0; g < gpus.size(); ++g)
      for (int e = int(g) * per_share; e < int(g + 1) * per_share; ++e) {
        const std::vector<bf16>& rows = per_gpu[g].*field;
        const size_t first = size_t(layout_of.layout.offsets[e]) * width,
                     last = size_t(layout_of.layout.offsets[e + 1]) * width;
        std::copy(rows.begin() + first, rows.begin() + last, out.begin() + first);
      }
    return out;
  }
};

namespace {

// One share's part after the shares before it.
template <class T>
void append(std::vector<T>& out, const std::vector<T>& part) {
  out.insert(out.end(), part.begin(), part.end());
}

}  // namespace

Megakernel::Megakernel(const LayerConfig& c, const LayerWeights& w, const LaunchConfig& launch)
    : impl_(std::make_unique<Impl>()) {
  const KeepCurrentDevice keep;
  validate(c);
  validate_weights(c, w);
  // Its GPUs are called one after another from this thread, and a synchronous call would wait for peers
  // not yet called (until the watchdog).
  require(!launch.synchronous || launch.gpus == 1,
          "LaunchConfig::synchronous with gpus = " + std::to_string(launch.gpus) +
              ": this wrapper calls its GPUs one after another from one thread, and a synchronous call would "
              "wait for peers not yet called (a process per GPU may use it; Layer::check() waits here)");
  Impl& m = *impl_;
  m.c = c;
  m.launch = launch;
  m.peers = make_peer_group(c, launch);  // checks the launch; null for simulated ranks
  int current = 0;
  MOK_CUDA_CHECK(cudaGetDevice(&current));
  m.gpus.reserve(launch.gpus);
  for (int g = 0; g < launch.gpus; ++g) {
    const int device = launch.transport == Transport::colocated ? current : g;
    MOK_CUDA_CHECK(cudaSetDevice(device));
    m.gpus.emplace_back(g, device, c, w, launch, m.peers.get());
  }
  if (launch.fp8_weights_given) {
    for (GpuShare& s : m.gpus) {  // what the quantization does not write shows
      s.use();
      s.fp8_weights.poison();
    }
    quantize_weights();
  }
}

void Megakernel::quantize_weights() {
  const KeepCurrentDevice keep;
  Impl& m = *impl_;
  require(m.launch.fp8_weights_given, "quantize_weights needs LaunchConfig::fp8_weights_given");
  m.run([&](GpuShare& s) { s.layer->quantize_weights(s.stream.get(), s.weights.views(), s.fp8_weights.view()); });
}

Megakernel::~Megakernel() = default;  // ~Impl keeps the caller's device

int Megakernel::blocks() const { return impl_->gpus[0].layer->blocks(); }
size_t Megakernel::saved_bytes() const { return impl_->gpus[0].layer->saved_bytes(); }
size_t Megakernel::workspace_bytes(Pass pass) const { return impl_->gpus[0].layer->workspace_bytes(pass); }
size_t Megakernel::fp8_weights_bytes() const { return impl_->gpus[0].layer->fp8_weights_bytes(); }

std::vector<PhaseTime> Megakernel::phase_times() const {
  const KeepCurrentDevice keep;
  impl_->gpus[0].use();
  return impl_->gpus[0].layer->phase_times();
}

void Megakernel::set_input(const std::vector<bf16>& x, const Routing* given, bool replay_ids) {
  const KeepCurrentDevice keep;
  Impl& m = *impl_;
  validate_tokens(m.c, x, "x [N, H]");
  require(given || !replay_ids, "replay_ids needs a given routing");
  if (given) validate_routing(m.c, *given, replay_ids);
  m.routing = !given ? RoutingMode::router : replay_ids ? RoutingMode::replay_ids : RoutingMode::given;
  m.has_forward = false;
  for (GpuShare& s : m.gpus) {
    s.use();
    s.fwd.x.upload(share_of(x, s.index, m.shares()));
    if (given) s.fwd.topk_idx.upload(share_of(given->topk_idx, s.index, m.shares()));
    if (given && !replay_ids) s.fwd.topk_w.upload(share_of(given->topk_w, s.index, m.shares()));
    s.fwd.poison(m.routing);
  }
}

void Megakernel::launch_forward() {
  const KeepCurrentDevice keep;
  Impl& m = *impl_;
  m.run([&](GpuShare& s) {
    s.layer->forward(s.stream.get(), s.workspace.view(), s.inputs(m.routing), s.fwd.views(m.routing));
  });
  m.has_forward = true;
}

Forward Megakernel::read_forward() const {
  const KeepCurrentDevice keep;
  const Impl& m = *impl_;
  require(m.has_forward, "no forward has run");
  const size_t I = m.c.intermediate;
  std::vector<Forward> per_gpu_saved;
  Forward f;
  for (const GpuShare& s : m.gpus) {
    s.use();
    append(f.routing.topk_idx, s.fwd.topk_idx.download<int32_t>());
    append(f.routing.topk_w, s.fwd.topk_w.download<float>());
    if (m.routing != RoutingMode::given) append(f.logits, s.fwd.logits.download<float>());
    append(f.y, s.fwd.y.download<bf16>());
    const RowShare share{m.launch.gpus, s.index, m.launch.capacity_rows};
    per_gpu_saved.push_back(unpack_saved(m.c, s.fwd.saved.download<uint8_t>(), m.launch.recompute, share));
    // Every GPU computed the whole dispatch layout; they must agree (D2).
    const DispatchLayout &mine = per_gpu_saved.back().layout, &first_gpu = per_gpu_saved.front().layout;
    if (mine.offsets != first_gpu.offsets || mine.row_source != first_gpu.row_source ||
        mine.slot_row != first_gpu.slot_row)
      fail_internal("GPU " + std::to_string(s.index) + " computed another dispatch layout than GPU 0");
  }
  const Forward& gpu0 = per_gpu_saved.front();
  f.layout = gpu0.layout;
  if (m.launch.recompute) return f;  // no activations are saved: none, as the reference's
  f.h = m.expert_rows(&Forward::h, 2 * I, gpu0, per_gpu_saved);
  // The shared expert's rows of each GPU's own tokens (it computed a few of the next GPU's too).
  const size_t T = m.c.tokens() / m.launch.gpus, Is = m.c.shared_intermediate;
  const auto own_token_rows = [&](std::vector<bf16> Forward::*field, size_t width) {
    std::vector<bf16> rows = gpu0.*field;
    for (size_t g = 1; g < per_gpu_saved.size(); ++g) {
      const auto first = (per_gpu_saved[g].*field).begin() + long(g * T * width);
      std::copy(first, first + long(T * width), rows.begin() + long(g * T * width));
    }
    return rows;
  };
  f.shared_h = own_token_rows(&Forward::shared_h, 2 * Is);
  f.shared_a = own_token_rows(&Forward::shared_a, Is);
  return f;
}

void Megakernel::set_output_grad(const std::vector<bf16>& dy, bool accumulate) {
  const KeepCurrentDevice keep;
  Impl& m = *impl_;
  require(m.has_forward, "backward before any forward");
  validate_tokens(m.c, dy, "dy [N, H]");
  m.accumulate = accumulate;
  for (GpuShare& s : m.gpus) {
    s.use();
    s.grad.dy.upload(share_of(dy, s.index, m.shares()));
    s.grad.poison(accumulate);
    // What the forward left there is not the backward's to read. Waited for, as the poisons above: no
    // timed backward (mok-bench) includes it.
    s.layer->poison_workspace(nullptr, s.workspace.view());
    MOK_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

void Megakernel::launch_backward() {
  const KeepCurrentDevice keep;
  Impl& m = *impl_;
  // A storing backward keeps its scratch in d_w1, as the PyTorch op's does (so the goldens, mok-verify and the
  // fuzzer run that path); an accumulating one in the workspace.
  m.run([&](GpuShare& s) {
    s.layer->backward(s.stream.get(), s.workspace.view(), s.inputs(m.routing), s.fwd.views(m.routing), s.grad.dy.view(),
                      s.grad.views(m.routing, m.accumulate, {.in_d_w1 = !m.accumulate}));
  });
}

Gradients Megakernel::read_gradients() const {
  const KeepCurrentDevice keep;
  const Impl& m = *impl_;
  const bool router = m.routing != RoutingMode::given;
  Gradients gr;
  for (const GpuShare& s : m.gpus) {
    s.use();
    append(gr.dx, s.grad.dx.download<bf16>());
    append(gr.d_topk_w, s.grad.d_topk_w.download<float>());
    append(gr.d_w1, s.grad.d_w1.download<float>());  // the shares' experts, in order
    append(gr.d_w2, s.grad.d_w2.download<float>());
    // The gradients every GPU holds whole (the last GPU's results of the chains over every token,
    // handed to the others): the same bits on every GPU.
    const auto whole = [&](std::vector<float> Gradients::*field, const DeviceTensor& t, const char* name) {
      const std::vector<float> mine = t.download<float>();
      if (s.index == 0)
        gr.*field = mine;
      else if (!same_bits(mine, gr.*field))
        fail_internal("GPU " + std::to_string(s.index) + " holds another " + name + " than GPU 0");
    };
    whole(&Gradients::d_shared_w1, s.grad.d_shared_w1, "d_shared_w1");
    whole(&Gradients::d_shared_w2, s.grad.d_shared_w2, "d_shared_w2");
    if (!router) continue;
    append(gr.d_logits, s.grad.d_logits.download<float>());
    whole(&Gradients::d_router, s.grad.d_router, "router-weight gradient");
  }
  return gr;
}

Forward Megakernel::forward(const std::vector<bf16>& x, const Routing* given, bool replay_ids) {
  set_input(x, given, replay_ids);
  launch_forward();
  return read_forward();
}

Gradients Megakernel::backward(const std::vector<bf16>& dy, bool accumulate) {
  set_output_grad(dy, accumulate);
  launch_backward();
  return read_gradients();
}

}  // namespace mok::gpu
