// The device API (mok/megakernel/layer.h): argument checks, the workspace and the transport's
// buffers laid out from the config, kernel parameters from the call's pointers, cooperative launches
// on the caller's stream, device errors copied behind each launch and raised by the next call; the
// peer groups of several GPUs (this process's, colocated, or on a caller's communicator).
#include <algorithm>
#include <bit>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "alignment.h"
#include "current_device.h"
#include "device_array.cuh"
#include "exchange.h"
#include "kernels.cuh"
#include "mok/core/fields.h"
#include "mok/core/fnv1a.h"
#include "mok/core/saved_layout.h"
#include "mok/core/validate.h"
#include "mok/megakernel/layer.h"
#include "mok/megakernel/nccl.h"
#include "nan_fill.h"
#include "peer_group.h"
#include "quantize_fp8.h"
#include "tensor_map.h"
#include "workspace_layout.h"

namespace mok::gpu {
namespace {

// A tensor the call needs: present (unless optional), of this dtype and shape, 16-byte aligned.
void check_view(const TensorView& v, const char* name, DType dtype, std::initializer_list<int64_t> shape,
                bool optional = false) {
  const auto refuse = [&](const std::string& what) { require(false, std::string(name) + what); };
  if (v.data == nullptr) {
    if (!optional) refuse(" is missing");
    return;
  }
  if (v.dtype != dtype) refuse(std::string(" has dtype ") + dtype_name(v.dtype) + ", expected " + dtype_name(dtype));
  if (!std::ranges::equal(v.shape, shape))
    refuse(" has shape " + shape_text(v.shape) + ", expected " + shape_text({shape.begin(), shape.size()}));
  require_aligned16(v.data, name);
}

// The caller's workspace: present, bytes, at least `needed` of them (a smaller one was written past its
// end), and aligned as every tensor (its sections start at multiples of 256 bytes from it).
uint8_t* checked_workspace(const TensorView& workspace, size_t needed, Pass pass) {
  require(workspace.data != nullptr, "workspace is missing");
  require(workspace.dtype == DType::u8 && workspace.shape.size() == 1, [&] {
    return std::string("workspace has dtype ") + dtype_name(workspace.dtype) + " and shape " +
           shape_text(workspace.shape) + ", expected uint8 [n] bytes";
  });
  require(workspace.shape[0] >= 0 && size_t(workspace.shape[0]) >= needed, [&] {
    const std::string name = pass == Pass::forward ? "forward" : "backward";
    return "workspace has " + std::to_string(workspace.shape[0]) + " bytes, the " + name + " needs " +
           std::to_string(needed) + " (workspace_bytes(Pass::" + name +
           (pass == Pass::backward ? ", GradOutputs::scratch))" : "))");
  });
  require_aligned16(workspace.data, "workspace");
  return static_cast<uint8_t*>(workspace.data);
}

// One tensor of a call as the bytes it spans (none where it is absent), and whether the call writes it.
struct CallBytes {
  const char* name;
  uintptr_t begin = 0, end = 0;
  bool written = false;
};

CallBytes bytes_of(const char* name, const TensorView& v, bool written) {
  if (!v.data) return {name, 0, 0, written};
  const auto begin = reinterpret_cast<uintptr_t>(v.data);
  return {name, begin, begin + tensor_bytes(v.dtype, v.shape), written};
}

// No tensor a call writes shares a byte with another of its tensors or with its workspace: the kernels
// would read what they had written (dx over dy gave wrong weight gradients without a word) or race.
// Tensors the call only reads may share memory.
void require_apart(const std::vector<CallBytes>& t) {
  for (size_t i = 0; i < t.size(); ++i)
    for (size_t j = i + 1; j < t.size(); ++j) {
      const CallBytes &a = t[i], &b = t[j];
      if ((a.written || b.written) && std::max(a.begin, b.begin) < std::min(a.end, b.end))
        require(false, std::string(a.name) + " and " + b.name + " share memory, and the call writes " +
                           (a.written ? a.name : b.name) + " (no tensor a call writes may overlap another)");
    }
}

// Whether `stream` is capturing into a CUDA graph (asked once a call: its checks take the answer).
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  MOK_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// Every tensor of a call is device memory of the Layer's GPU, or managed memory: host memory or another
// GPU's failed inside the kernels as an illegal address, which ends the context. Its first byte asked
// only (a call has two dozen tensors). Not asked of a call being captured: memory the capture allocates
// (cudaMallocAsync in the graph) is mapped when the graph runs, and what the driver says of it before is
// not documented.
void require_on_gpu(const std::vector<CallBytes>& t, int device, bool captured) {
  if (captured) return;
  const auto where = [](const cudaPointerAttributes& a) -> std::string {
    switch (a.type) {
      case cudaMemoryTypeUnregistered:
        return "host memory";
      case cudaMemoryTypeHost:
        return "pinned host memory";
      default:
        return "memory of GPU " + std::to_string(a.device);
    }
  };
  for (const CallBytes& b : t) {
    if (b.begin == b.end) continue;
    cudaPointerAttributes a{};
    MOK_CUDA_CHECK(cudaPointerGetAttributes(&a, reinterpret_cast<const void*>(b.begin)));
    // A managed allocation's device is the one current when it was made, not where its pages are.
    const bool on = a.type == cudaMemoryTypeManaged || (a.type == cudaMemoryTypeDevice && a.device == device);
    require(on, [&] {
      return std::string(b.name) + " is " + where(a) + ", not memory of the Layer's GPU " + std::to_string(device);
    });
  }
}

using NamedViews = std::initializer_list<std::pair<const char*, const TensorView&>>;

// Each of `views` into t, all read or all written by the call.
void add_tensors(std::vector<CallBytes>& t, NamedViews views, bool written) {
  for (const auto& [name, v] : views) t.push_back(bytes_of(name, v, written));
}

void add_weights(std::vector<CallBytes>& t, const WeightViews& w, const TensorView& fp8_weights) {
  add_tensors(t,
              {{"router", w.router},
               {"expert_bias", w.expert_bias},
               {"w1", w.w1},
               {"w2", w.w2},
               {"shared_w1", w.shared_w1},
               {"shared_w2", w.shared_w2},
               {"fp8_weights", fp8_weights}},
              false);
}

// The caller's stream is on the Layer's GPU: another GPU's failed at the launch as "invalid resource
// handle", after the barrier words' reset was enqueued. Not asked of a capturing stream, where the query
// is refused and would invalidate the capture (a stream of another GPU still fails at the launch).
void require_stream_on(cudaStream_t stream, int device, bool captured) {
  if (captured) return;
  int on = 0;
  MOK_CUDA_CHECK(cudaStreamGetDevice(stream, &on));
  require(on == device, [&] {
    return "the stream is on GPU " + std::to_string(on) + ", the Layer's on GPU " + std::to_string(device);
  });
}

// The kernels' launch of `blocks` blocks on `stream` with `count` attributes.
cudaLaunchConfig_t launch_config(int blocks, cudaStream_t stream, cudaLaunchAttribute* attributes, unsigned count) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmemBytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = count;
  return config;
}
// Clusters of two blocks (LaunchConfig::paired_blocks).
cudaLaunchAttribute pair_clusters() {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim = {2, 1, 1};
  return a;
}

// A pass's megakernel (the backward's after its prologue) by precision and block pairing.
const void* megakernel_of(Pass pass, bool fp8, bool paired) {
  // [pass][fp8][paired]
  static const void* const kernels[2][2][2] = {
      {{(const void*)forward_kernel, (const void*)forward_paired_kernel},
       {(const void*)forward_fp8_kernel, (const void*)forward_fp8_paired_kernel}},
      {{(const void*)backward_kernel, (const void*)backward_paired_kernel},
       {(const void*)backward_fp8_kernel, (const void*)backward_fp8_paired_kernel}}};
  return kernels[pass == Pass::backward][fp8][paired];
}

// The small kernels a call launches beside the megakernels (resident_blocks loads those), loaded on the
// current device now. CUDA loads a kernel at its first launch (lazy loading, the default), and a load may
// wait for the work running on the GPU: a colocated share's first NaN fill, launched behind its megakernel,
// which waits at its start for the next share's megakernel, launched after it, would hold the calls until
// that megakernel's watchdog; a stream held by a host function would hold the call itself.
void load_small_kernels() {
  for (const void* kernel : {nan_fill_kernel(), quantize_kernel()}) {
    cudaFuncAttributes attributes{};
    MOK_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  }
}

// Persistent blocks on the current device: `asked`, or (0) as many as are co-resident; with `shares`
// colocated Layers, whose kernels must be resident at once, that many per share; paired: in clusters of
// two blocks (LaunchConfig::paired_blocks), as many as whole clusters co-reside, the paired kernels' too.
int resident_blocks(int asked, int shares, bool paired) {
  int dev = 0, sms = 0, per_sm = std::numeric_limits<int>::max(), pairs = std::numeric_limits<int>::max();
  MOK_CUDA_CHECK(cudaGetDevice(&dev));
  MOK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  std::vector<const void*> kernels = {(const void*)backward_prologue_kernel, (const void*)backward_prologue_fp8_kernel,
                                      (const void*)relayed_chains_kernel};
  for (const Pass pass : {Pass::forward, Pass::backward})
    for (const bool fp8 : {false, true})
      for (const bool in_pairs : {false, true})
        if (!in_pairs || paired) kernels.push_back(megakernel_of(pass, fp8, in_pairs));
  for (const void* kernel : kernels) {
    MOK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
    // The GEMM phases' setmaxnreg hand-over balances only from this count (tile_gemm.cuh); a build
    // that gave the kernels fewer registers would hang in it.
    cudaFuncAttributes attributes{};
    MOK_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    if (attributes.numRegs != kKernelRegisters)
      fail_internal("the kernels were built with " + std::to_string(attributes.numRegs) +
                    " registers per thread, not " + std::to_string(kKernelRegisters) + " (check -maxrregcount, -G)");
    int blocks = 0;
    MOK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, kSmemBytes));
    per_sm = std::min(per_sm, blocks);
    if (!paired) continue;
    cudaLaunchAttribute cluster = pair_clusters();
    const cudaLaunchConfig_t config = launch_config(2, nullptr, &cluster, 1);
    int clusters = 0;
    MOK_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
    pairs = std::min(pairs, clusters);
  }
  const int resident = paired ? 2 * pairs : sms * per_sm / shares;
  require(resident >= 1,
          "no block of the kernels fits on this device" +
              std::string(shares > 1 ? " per colocated share (" + std::to_string(shares) + " shares)" : ""));
  require(asked <= resident, "blocks = " + std::to_string(asked) + " exceeds the " + std::to_string(resident) +
                                 " co-resident blocks of this device" + (shares > 1 ? " per colocated share" : ""));
  return asked ? asked : resident;
}

void validate_capacity(const LayerConfig& c, const LaunchConfig& launch) {
  const long most = most_own_rows(c, launch.gpus);
  require(launch.capacity_rows >= 0 && launch.capacity_rows <= most,
          "capacity_rows = " + std::to_string(launch.capacity_rows) + " is outside [0, " + std::to_string(most) +
              "] (0: the most rows a GPU's experts can receive, N min(k, E/G) = " + std::to_string(most) + ")");
}

void validate_fp8_options(const LayerConfig& c, const LaunchConfig& launch) {
  require(!launch.fp8_weights_given || c.precision == Precision::fp8,
          "fp8_weights_given needs precision = fp8 (the bf16 forward reads the bf16 weights)");
  require(!launch.fp8_weight_gradients || c.precision == Precision::fp8,
          "fp8_weight_gradients needs precision = fp8 (the bf16 backward's weight gradients are bf16 chains)");
}

// The current device, the Layer's, is a Hopper GPU. (device_available() looks at devices 0, 1, ... in a
// row: a Layer on a Hopper GPU after another kind was refused, and one on another kind after a Hopper GPU
// failed at its first CUDA call with "no kernel image".)
void require_hopper_current_device() {
  require(cuda_device_count() > 0, "no CUDA device of compute capability 9.0 (Hopper) is available");
  int device = 0;
  MOK_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop;
  MOK_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  require(prop.major == 9 && prop.minor == 0, "GPU " + std::to_string(device) + " (" + prop.name +
                                                  ") is of compute capability " + std::to_string(prop.major) + "." +
                                                  std::to_string(prop.minor) + "; mok's kernels run on 9.0 (Hopper)");
}

// What every Layer's config and launch must be, no device asked (layer_memory checks as much), but for
// the most GPUs a launch spans.
void validate_launch_config(const LayerConfig& c, const LaunchConfig& launch) {
  validate(c);
  require(c.ranks <= kMaxRanks, "ranks R = " + std::to_string(c.ranks) + " exceeds " + std::to_string(kMaxRanks));
  if (launch.ring_rows) validate_ring_rows(launch.ring_rows, kTileRows);
  // Its upper bound, the co-resident blocks, needs the device (resident_blocks).
  require(launch.blocks >= 0, "blocks = " + std::to_string(launch.blocks) + " is negative (0: all co-resident)");
  require(!launch.paired_blocks || launch.blocks % 2 == 0,
          "blocks = " + std::to_string(launch.blocks) + " is odd: paired_blocks runs the blocks in pairs");
  require(!launch.paired_blocks || launch.gpus == 1, "paired_blocks runs on one GPU (gpus = 1)");
  // Nanoseconds in 64 bits on the device (GridBarrier::timeout_ns): a bound far below their range.
  require(std::isfinite(launch.watchdog_seconds) && launch.watchdog_seconds > 0 &&
              launch.watchdog_seconds <= kMaxWatchdogSeconds,
          "watchdog_seconds = " + std::to_string(launch.watchdog_seconds) + " is outside (0, " +
              std::to_string(int(kMaxWatchdogSeconds)) + "]");
  require(launch.gpus >= 1, "gpus = " + std::to_string(launch.gpus) + " is below 1");
  require(c.ranks % launch.gpus == 0,
          "ranks R = " + std::to_string(c.ranks) + " is not a multiple of gpus = " + std::to_string(launch.gpus));
  require(launch.gpus == 1 || launch.transport != Transport::simulated,
          "gpus > 1 needs the nccl or the colocated transport");
  validate_capacity(c, launch);
  validate_fp8_options(c, launch);
}

// ... and a device to run on (checked before anything is built: a Layer on a communicator checks
// before its collective window registration).
void validate_launch(const LayerConfig& c, const LaunchConfig& launch) {
  check_launch(c, launch);
  require_hopper_current_device();
}

// A section of a buffer (the workspace, or the quantized weights) as the kernels read it.
Fp8Columns in_buffer(uint8_t* buffer, const ColumnsSection& at) {
  const auto section = [&](size_t offset) -> uint8_t* { return offset ? buffer + offset : nullptr; };  // 0: none
  return {reinterpret_cast<fp8_e4m3*>(buffer + at.values), reinterpret_cast<int8_t*>(section(at.exps)),
          reinterpret_cast<float*>(section(at.scales)), reinterpret_cast<int4*>(section(at.exp_range))};
}
Fp8Matrix in_buffer(uint8_t* buffer, const Fp8Section& at) {
  return {reinterpret_cast<fp8_e4m3*>(buffer + at.values), reinterpret_cast<int32_t*>(buffer + at.exps)};
}

std::string phase_name(int phase) { return phase >= 0 && phase < kPhaseCount ? kPhaseNames[phase] : "?"; }

}  // namespace

size_t dtype_bytes(DType t) { return t == DType::bf16 ? 2 : t == DType::u8 ? 1 : 4; }

size_t tensor_bytes(DType dtype, const std::vector<int64_t>& shape) {
  size_t bytes = dtype_bytes(dtype);
  for (const int64_t d : shape) bytes *= size_t(d);
  return bytes;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::bf16:
      return "bfloat16";
    case DType::f32:
      return "float32";
    case DType::i32:
      return "int32";
    case DType::u8:
      return "uint8";
  }
  return "?";
}

struct Layer::Impl {
  std::unique_ptr<PeerGroup> comm_peers;  // the window on a caller's communicator; outlives the rest
  LayerConfig c;
  LaunchConfig launch;
  int gpu = 0, device = 0, blocks = 0;
  int rank_begin = 0, rank_end = 0;
  SavedLayout saved;
  WorkspaceLayout layouts[4];        // a backward's given each BackwardScratch (backward_layout; ws(): none)
  Fp8WeightLayout fp8w;              // the quantized weights' buffer (no bytes in bf16)
  Exchange exchange;                 // where the ranks' shared buffers live (exchange.h)
  unsigned long long launches = 0;   // this Layer's, enqueued
  unsigned long long numbered = 0;   // this Layer's launch numbers taken, without a group
  const PeerGroup* group = nullptr;  // numbers the launches across GPUs (take_launches), or none
  cudaStream_t last_stream = nullptr;
  DeviceArray<KernelError> error;  // sticky: the kernels record only into an empty word
  TensorMapCache map_cache[2];     // per Pass: a forward's maps are the last forward's, mostly
  PinnedArray<KernelError> host_error;
  DeviceArray<long long> clock_ns;
  DeviceArray<int> clock_phase, clock_count;

  // Everything but the checks, which each constructor makes first (the communicator's before its
  // collective window registration).
  void init(const LayerConfig& config, const LaunchConfig& l, int g, const PeerGroup* peers) {
    c = config;
    launch = l;
    launch.ring_rows = resolved_ring_rows(c, launch);
    gpu = g;
    MOK_CUDA_CHECK(cudaGetDevice(&device));
    rank_begin = g * (c.ranks / launch.gpus), rank_end = rank_begin + c.ranks / launch.gpus;
    blocks = resident_blocks(launch.blocks, launch.transport == Transport::colocated ? launch.gpus : 1,
                             launch.paired_blocks);
    load_small_kernels();
    saved = saved_layout(c, launch.recompute, row_share());
    exchange = Exchange(c, g, peers);
    group = peers;
    for (int i = 0; i < 4; ++i)
      layouts[i] = workspace_layout(c, launch, !exchange.windowed(), BackwardScratch{bool(i & 1), bool(i & 2)});
    fp8w = fp8_weight_layout(c, own_experts());
    error = DeviceArray<KernelError>(1);
    error.zero();
    host_error = PinnedArray<KernelError>(1);
    clock_ns = DeviceArray<long long>(kClockEntries);
    clock_phase = DeviceArray<int>(kClockEntries);
    clock_count = DeviceArray<int>(1);
    clock_count.zero();
  }

  const WorkspaceLayout& backward_layout(BackwardScratch s) const {
    return layouts[int(s.in_d_w1) + 2 * int(s.dh_over_saved_h)];
  }
  const WorkspaceLayout& ws() const { return layouts[0]; }  // the forward's, and a backward's given no scratch
  RowShare row_share() const { return RowShare{launch.gpus, gpu, launch.capacity_rows}; }
  long shared_capacity() const { return shared_rows_capacity(c, launch.gpus); }
  long own_padded() const { return own_padded_rows(c, launch.gpus, launch.capacity_rows); }

  // ---- argument checks ----
  // This GPU's share of the tokens and of the experts (all of them on one GPU).
  int64_t own_tokens() const { return c.tokens() / launch.gpus; }
  int64_t own_experts() const { return c.experts / launch.gpus; }
  // A tensor's name in the messages: the whole tensor's on one GPU, the share's over several.
  const char* named(const char* whole, const char* share) const { return launch.gpus > 1 ? share : whole; }

  void check_weights(const WeightViews& w) const {
    const int64_t H = c.hidden, E = c.experts;
    check_view(w.router, "router weight [E, H]", DType::f32, {E, H});
    check_view(w.expert_bias, "expert_bias [E]", DType::f32, {E}, true);
    validate_expert_bias_given(c, w.expert_bias.data != nullptr);
    check_expert_weights(w);
  }
  // The weights the fp8 mode quantizes.
  void check_expert_weights(const WeightViews& w) const {
    const int64_t H = c.hidden, I = c.intermediate, Eg = own_experts(), Is = c.shared_intermediate;
    check_view(w.w1, named("w1 [E, 2I, H]", "w1 [E/G, 2I, H]"), DType::bf16, {Eg, 2 * I, H});
    check_view(w.w2, named("w2 [E, H, I]", "w2 [E/G, H, I]"), DType::bf16, {Eg, H, I});
    check_view(w.shared_w1, "shared_w1 [2Is, H]", DType::bf16, {2 * Is, H}, Is == 0);
    check_view(w.shared_w2, "shared_w2 [H, Is]", DType::bf16, {H, Is}, Is == 0);
  }
  void check_forward(const ForwardInputs& in, const ForwardOutputs& out, bool results) const {
    const int64_t N = own_tokens(), H = c.hidden, E = c.experts, k = c.top_k;
    check_view(in.x, named("x [N, H]", "x [N/G, H]"), DType::bf16, {N, H});
    check_weights(in.weights);
    if (results) check_view(out.y, named("y [N, H]", "y [N/G, H]"), DType::bf16, {N, H});
    check_view(out.topk_idx, named("topk_idx [N, k]", "topk_idx [N/G, k]"), DType::i32, {N, k});
    check_view(out.topk_w, named("topk_w [N, k]", "topk_w [N/G, k]"), DType::f32, {N, k});
    check_view(out.logits, named("logits [N, E]", "logits [N/G, E]"), DType::f32, {N, E},
               in.routing == RoutingMode::given);
    require(in.routing != RoutingMode::given || !out.logits.data,
            "logits is given, but routing mode given has no router to compute them: pass none (nothing would "
            "write it)");
    check_view(out.saved, "saved", DType::u8, {int64_t(saved.bytes)});
    const bool fp8 = c.precision == Precision::fp8;
    require(fp8 || !in.fp8_weights.data,
            "fp8_weights is given, but precision is bf16 (only the fp8 mode reads quantized weights)");
    if (fp8) {
      require(in.fp8_weights.data || !launch.fp8_weights_given,
              "fp8_weights is missing: with LaunchConfig::fp8_weights_given the forward and the backward read "
              "the weights quantized by Layer::quantize_weights (their workspace holds none)");
      check_fp8_weights(in.fp8_weights, true);
    }
    if (!results) return;
    const bool ids = in.routing != RoutingMode::router, weights = in.routing == RoutingMode::given;
    require(ids || !in.topk_idx.data, "a given topk_idx needs routing mode replay_ids or given");
    require(weights || !in.topk_w.data, "a given topk_w needs routing mode given");
    check_view(in.topk_idx, named("given topk_idx [N, k]", "given topk_idx [N/G, k]"), DType::i32, {N, k}, true);
    check_view(in.topk_w, named("given topk_w [N, k]", "given topk_w [N/G, k]"), DType::f32, {N, k}, true);
  }
  void check_fp8_weights(const TensorView& q, bool optional) const {
    check_view(q, "fp8_weights [fp8_weights_bytes()]", DType::u8, {int64_t(fp8w.bytes)}, optional);
  }
  // Where the forward reads the quantized weights: the caller's buffer, or the workspace's section.
  uint8_t* quantized_weights(uint8_t* workspace, const ForwardInputs& in) const {
    return in.fp8_weights.data ? static_cast<uint8_t*>(in.fp8_weights.data) : workspace + ws().fp8_weights;
  }

  void check_grads(const ForwardInputs& in, const TensorView& dy, const GradOutputs& g) const {
    const int64_t N = own_tokens(), H = c.hidden, I = c.intermediate, E = c.experts, Eg = own_experts();
    const int64_t k = c.top_k, Is = c.shared_intermediate;
    const bool router = in.routing != RoutingMode::given;
    check_view(dy, named("dy [N, H]", "dy [N/G, H]"), DType::bf16, {N, H});
    check_view(g.dx, named("dx [N, H]", "dx [N/G, H]"), DType::bf16, {N, H});
    check_view(g.d_topk_w, named("d_topk_w [N, k]", "d_topk_w [N/G, k]"), DType::f32, {N, k});
    check_view(g.d_logits, named("d_logits [N, E]", "d_logits [N/G, E]"), DType::f32, {N, E}, !router);
    check_view(g.d_router, "d_router [E, H]", DType::f32, {E, H}, !router);
    require(!router || (g.d_logits.data && g.d_router.data), "d_logits and d_router are missing");
    require(router || (!g.d_logits.data && !g.d_router.data),
            "d_logits or d_router is given, but routing mode given has no router: pass neither (nothing would "
            "write them)");
    const DType wd = g.d_w1.dtype == DType::bf16 ? DType::bf16 : DType::f32;  // the weight gradients' one dtype
    check_view(g.d_w1, named("d_w1 [E, 2I, H]", "d_w1 [E/G, 2I, H]"), wd, {Eg, 2 * I, H});
    check_view(g.d_w2, named("d_w2 [E, H, I]", "d_w2 [E/G, H, I]"), wd, {Eg, H, I});
    check_view(g.d_shared_w1, "d_shared_w1 [2Is, H]", wd, {2 * Is, H}, Is == 0);
    check_view(g.d_shared_w2, "d_shared_w2 [H, Is]", wd, {H, Is}, Is == 0);
    require(!g.accumulate || !g.scratch.in_d_w1,
            "GradOutputs::scratch.in_d_w1 with accumulate: d_w1 holds the sums this backward adds into, so it cannot "
            "hold its scratch");
  }

  // Each call's tensors apart (require_apart) and on the Layer's GPU (require_on_gpu). A given routing that
  // is its own output is the routing read in place.
  void check_forward_memory(bool captured, const TensorView& workspace, const ForwardInputs& in,
                            const ForwardOutputs& out) const {
    std::vector<CallBytes> t{bytes_of("x", in.x, false)};
    add_weights(t, in.weights, in.fp8_weights);
    if (in.topk_idx.data != out.topk_idx.data) t.push_back(bytes_of("given topk_idx", in.topk_idx, false));
    if (in.topk_w.data != out.topk_w.data) t.push_back(bytes_of("given topk_w", in.topk_w, false));
    add_tensors(t,
                {{"y", out.y},
                 {"topk_idx", out.topk_idx},
                 {"topk_w", out.topk_w},
                 {"logits", out.logits},
                 {"saved", out.saved},
                 {"workspace", workspace}},
                true);
    require_apart(t);
    require_on_gpu(t, device, captured);
  }
  void check_backward_memory(bool captured, const TensorView& workspace, const ForwardInputs& in,
                             const ForwardOutputs& fwd, const TensorView& dy, const GradOutputs& g) const {
    std::vector<CallBytes> t{bytes_of("x", in.x, false)};
    add_weights(t, in.weights, in.fp8_weights);
    add_tensors(t, {{"topk_idx", fwd.topk_idx}, {"topk_w", fwd.topk_w}, {"logits", fwd.logits}, {"dy", dy}}, false);
    // dh over its h (BackwardScratch::dh_over_saved_h): then written, so apart from every other tensor.
    add_tensors(t, {{"saved", fwd.saved}}, backward_layout(g.scratch).dh_over_h);
    add_tensors(t,
                {{"dx", g.dx},
                 {"d_topk_w", g.d_topk_w},
                 {"d_logits", g.d_logits},
                 {"d_router", g.d_router},
                 {"d_w1", g.d_w1},
                 {"d_w2", g.d_w2},
                 {"d_shared_w1", g.d_shared_w1},
                 {"d_shared_w2", g.d_shared_w2},
                 {"workspace", workspace}},
                true);
    require_apart(t);
    require_on_gpu(t, device, captured);
  }

  // ---- kernel parameters ----
  // `layout`: ws(), or a backward's given scratch (backward_layout), whose sections in d_w1 (in_d_w1) are
  // `d_w1`'s bytes.
  Params params(Pass pass, const WorkspaceLayout& layout, uint8_t* workspace, uint8_t* d_w1, const ForwardInputs& in,
                const ForwardOutputs& out, unsigned long long number) const {
    Params p{};
    p.c = c;
    p.ring_rows = pass == Pass::forward ? forward_cycle_rows(c) : launch.ring_rows;
    p.routing = in.routing;
    p.rank_begin = rank_begin, p.rank_end = rank_end;
    p.gpus = launch.gpus;
    p.padded_rows = own_padded();
    p.shared_tokens = shared_token_rows(c, launch.gpus, gpu);
    p.shared_capacity = shared_capacity();
    auto* words = reinterpret_cast<unsigned int*>(workspace + layout.barrier);
    p.barrier = GridBarrier{words,
                            words + 1,
                            error.get(),
                            (long long)(launch.watchdog_seconds * 1e9),
                            PhaseClock{clock_ns.get(), clock_phase.get(), clock_count.get()},
                            {}};
    p.claimed_tiles = words + 3;
    p.claimed_weight_grads = words + 4;
    stamp_launch(p, number);
    const WeightViews& w = in.weights;
    p.router_w = ptr<float>(w.router);
    p.expert_bias = ptr<float>(w.expert_bias);
    p.logits = ptr<float>(out.logits);
    uint8_t* s = ptr<uint8_t>(out.saved);
    const long shared_a_bytes = launch.recompute ? 0 : shared_capacity() * c.shared_intermediate * long(sizeof(bf16));
    const long end = long(saved.shared_a) + shared_a_bytes;
    p.saved_gaps = SavedGaps{s, long(saved.xe), end, long(saved.bytes)};
    p.offsets = reinterpret_cast<int32_t*>(s + saved.offsets);
    p.tile_offsets = reinterpret_cast<int32_t*>(s + saved.tile_offsets);
    p.row_source = reinterpret_cast<int32_t*>(s + saved.row_source);
    p.slot_row = reinterpret_cast<int32_t*>(s + saved.slot_row);
    p.recompute = launch.recompute;
    p.one_ring_cycle = layout.one_cycle;
    p.fp8_weight_gradients = launch.fp8_weight_gradients;
    // In recompute mode xe, h and the shared expert's h and a are the workspace's (the saved buffer
    // holds none), and so is xe wherever the saved buffer holds none (saves_xe); the routed a always is
    // (no saved buffer holds it); the maps read p.xe, p.a and p.shared_a.
    const auto activation = [&](size_t in_workspace, size_t in_saved, bool is_saved) {
      return reinterpret_cast<bf16*>(is_saved ? s + in_saved : workspace + in_workspace);
    };
    const bool saving = !launch.recompute;
    // The fp8 forward neither reads nor writes xe and a (its GEMMs read xq and aq): null, their maps empty.
    const bool fp8_forward = pass == Pass::forward && c.precision == Precision::fp8;
    p.xe = fp8_forward ? nullptr : activation(layout.xe, saved.xe, saves_xe(c, launch.recompute));
    p.h = activation(layout.h, saved.h, saving);
    uint8_t* const scratch = layout.scratch_base(workspace, d_w1);
    p.a = fp8_forward ? nullptr : reinterpret_cast<bf16*>(scratch + layout.a);
    p.shared_h = activation(layout.shared_h, saved.shared_h, saving);
    p.shared_a = activation(layout.shared_a, saved.shared_a, saving);
    p.chunk_counts = reinterpret_cast<int32_t*>(workspace + layout.chunk_counts);
    p.chunk_base = reinterpret_cast<int32_t*>(workspace + layout.chunk_base);
    p.tile_expert = reinterpret_cast<int32_t*>(workspace + layout.tile_expert);
    p.shared_y = reinterpret_cast<bf16*>(workspace + layout.shared_y);
    p.y = ptr<bf16>(out.y);
    if (c.precision == Precision::fp8) {
      const auto matrix = [&](const Fp8Section& at) { return in_buffer(workspace, at); };
      const Fp8Sections& f = layout.fp8;
      p.xq = matrix(f.xq), p.aq = matrix(f.aq), p.shared_xq = matrix(f.shared_xq), p.shared_aq = matrix(f.shared_aq);
      uint8_t* q = quantized_weights(workspace, in);
      p.w1_exp = in_buffer(q, fp8w.w1).exps, p.w2_exp = in_buffer(q, fp8w.w2).exps;
      p.shared_w1_exp = in_buffer(q, fp8w.shared_w1).exps, p.shared_w2_exp = in_buffer(q, fp8w.shared_w2).exps;
    }
    if (pass == Pass::forward) return p;  // its workspace ends before the backward's sections
    p.g = reinterpret_cast<float*>(scratch + layout.g);
    p.dh = layout.dh_over_h ? p.h : reinterpret_cast<bf16*>(workspace + layout.dh);
    p.dye = reinterpret_cast<bf16*>(scratch + layout.dye);
    p.shared_dh = reinterpret_cast<bf16*>(workspace + layout.shared_dh);
    p.dw2_first = layout.in_d_w1;
    if (c.precision != Precision::fp8) {
      p.ring = reinterpret_cast<bf16*>(scratch + layout.ring);
      return p;
    }
    p.ringq = in_buffer(workspace, layout.ringq), p.dhq = in_buffer(workspace, layout.dhq);
    p.shared_dyq = in_buffer(workspace, layout.shared_dyq), p.shared_dhq = in_buffer(workspace, layout.shared_dhq);
    uint8_t* q = quantized_weights(workspace, in);
    p.w1t_exp = in_buffer(q, fp8w.w1t).exps, p.w2t_exp = in_buffer(q, fp8w.w2t).exps;
    p.shared_w1t_exp = in_buffer(q, fp8w.shared_w1t).exps, p.shared_w2t_exp = in_buffer(q, fp8w.shared_w2t).exps;
    if (launch.fp8_weight_gradients) {
      p.dhtq = in_buffer(workspace, layout.dhtq), p.xetq = in_buffer(workspace, layout.xetq);
      p.dyetq = in_buffer(workspace, layout.dyetq), p.atq = in_buffer(workspace, layout.atq);
    }
    return p;
  }

  // quantized: the fp8 mode's quantized weights (quantized_weights), unused in bf16; grads: the
  // backward's outputs (none in the forward).
  void encode_maps(Pass pass, Params& p, const WeightViews& w, uint8_t* quantized, const GradOutputs& grads = {}) {
    const long H = c.hidden, I = c.intermediate, E = own_experts(), Is = c.shared_intermediate;
    const long P = own_padded(), S = p.shared_tokens.rows();  // the shared expert's maps end at its last token
    TensorMaps& maps = p.maps;
    int slot = 0;  // the maps in a fixed order, each with its slot in the cache
    const auto encode = [&](CUtensorMap& out, const void* base, long rows, long cols) {
      map_cache[int(pass)].encode(slot++, out, base, rows, cols);
    };
    // The backward's own buffers are null in the forward: their maps stay empty.
    encode(maps.ring, p.ring, p.ring ? long(rank_end - rank_begin) * launch.ring_rows : 0, H);
    encode(maps.w1, w.w1.data, E * 2 * I, H);
    encode(maps.w2, w.w2.data, E * H, I);
    encode(maps.a, p.a, p.a ? P : 0, I);
    encode(maps.dh, p.dh, p.dh ? P : 0, 2 * I);
    encode(maps.dye, p.dye, p.dye ? P : 0, H);
    encode(maps.xe, p.xe, p.xe ? P : 0, H);
    encode(maps.x, p.x, S, H);
    encode(maps.dy, p.dy, p.dy ? S : 0, H);
    // Without a shared expert (Is = 0) its maps are empty.
    encode(maps.shared_w1, w.shared_w1.data, 2 * Is, H);
    encode(maps.shared_w2, w.shared_w2.data, H, Is);
    encode(maps.shared_a, p.shared_a, S, Is);
    encode(maps.shared_dh, p.shared_dh, p.shared_dh ? S : 0, 2 * Is);
    // The weight gradients, stored or added by the TMA (none in the forward: empty maps).
    const MapElement grad_element = p.grads_bf16 ? MapElement::bf16_out : MapElement::f32;
    const auto gradient = [&](CUtensorMap& out, const TensorView& g, long rows, long cols) {
      map_cache[int(pass)].encode(slot++, out, g.data, g.data ? rows : 0, cols, grad_element);
    };
    gradient(maps.d_w1, grads.d_w1, E * 2 * I, H);
    gradient(maps.d_w2, grads.d_w2, E * H, I);
    gradient(maps.d_shared_w1, grads.d_shared_w1, 2 * Is, H);
    gradient(maps.d_shared_w2, grads.d_shared_w2, H, Is);
    if (c.precision != Precision::fp8) return;
    const auto e4m3 = [&](CUtensorMap& out, const void* base, long rows, long cols) {
      map_cache[int(pass)].encode(slot++, out, base, rows, cols, MapElement::e4m3);
    };
    const auto weights = [&](const Fp8Section& at) { return in_buffer(quantized, at).values; };
    e4m3(maps.xq, p.xq.values, P, H);
    e4m3(maps.aq, p.aq.values, P, I);
    e4m3(maps.w1q, weights(fp8w.w1), E * 2 * I, H);
    e4m3(maps.w2q, weights(fp8w.w2), E * H, I);
    e4m3(maps.shared_xq, p.shared_xq.values, Is ? S : 0, H);
    e4m3(maps.shared_aq, p.shared_aq.values, S, Is);
    e4m3(maps.shared_w1q, weights(fp8w.shared_w1), 2 * Is, H);
    e4m3(maps.shared_w2q, weights(fp8w.shared_w2), H, Is);
    // The backward's: null in the forward, whose workspace holds no transposed weights either.
    const bool backward = pass == Pass::backward;
    e4m3(maps.ringq, p.ringq.values, p.ringq.values ? long(rank_end - rank_begin) * launch.ring_rows : 0, H);
    e4m3(maps.dhq, p.dhq.values, p.dhq.values ? long(rank_end - rank_begin) * launch.ring_rows : 0, 2 * I);
    e4m3(maps.shared_dyq, p.shared_dyq.values, p.shared_dyq.values && Is ? S : 0, H);
    e4m3(maps.shared_dhq, p.shared_dhq.values, p.shared_dhq.values ? S : 0, 2 * Is);
    e4m3(maps.w2tq, weights(fp8w.w2t), backward ? E * I : 0, H);
    e4m3(maps.w1tq, weights(fp8w.w1t), backward ? E * H : 0, 2 * I);
    e4m3(maps.shared_w2tq, weights(fp8w.shared_w2t), backward ? Is : 0, H);
    e4m3(maps.shared_w1tq, weights(fp8w.shared_w1t), backward && Is ? H : 0, 2 * Is);
    // The fp8 weight gradients' operands, [cols, P]: null unless LaunchConfig::fp8_weight_gradients.
    const auto columns = [&](CUtensorMap& out, const Fp8Columns& q, long cols) {
      e4m3(out, q.values, q.values ? cols : 0, P);
    };
    columns(maps.dhtq, p.dhtq, 2 * I);
    columns(maps.xetq, p.xetq, H);
    columns(maps.dyetq, p.dyetq, H);
    columns(maps.atq, p.atq, I);
  }

  // ---- the fp8 mode's weights ----
  // The weights quantized on the stream into `quantized` (Fp8WeightLayout: the caller's buffer, or the
  // workspace's section): the forward's copies, and with `transposed` the backward's too (one pass
  // over each weight writes both), with the exponent tables' padding (fp8_weight_layout), which no
  // phase writes, zeroed: a tile's half past a matrix's last row reads it for columns never stored.
  // With `transposed` every byte of the buffer is written (the sections' alignment gaps too), so a
  // caller's buffer holds the same bytes whatever it held before.
  void quantize_weights(cudaStream_t stream, uint8_t* quantized, const WeightViews& w, bool transposed) const {
    const int E = int(own_experts()), H = c.hidden, I = c.intermediate, Is = c.shared_intermediate;
    const size_t B = kFp8Block;
    const auto weight = [&](const TensorView& v, int matrices, int rows, int cols, const Fp8Section& at,
                            const Fp8Section& at_t) {
      const Fp8Matrix q = in_buffer(quantized, at), q_t = transposed ? in_buffer(quantized, at_t) : Fp8Matrix{};
      quantize_weights_fp8(stream, ptr<bf16>(v), matrices, rows, cols, q.values, q_t.values, q.exps, q_t.exps);
      // The padding block row and the gap to the section's aligned end (the values' sections have none).
      const size_t stored = size_t(matrices) * rows / B * (cols / B) * sizeof(int32_t);
      const auto pad = [&](int32_t* exps, const Fp8Section& s) {
        MOK_CUDA_CHECK(cudaMemsetAsync(reinterpret_cast<uint8_t*>(exps) + stored, 0, s.exp_bytes - stored, stream));
      };
      pad(q.exps, at);
      if (transposed) pad(q_t.exps, at_t);
    };
    weight(w.w1, E, 2 * I, H, fp8w.w1, fp8w.w1t);
    weight(w.w2, E, H, I, fp8w.w2, fp8w.w2t);
    if (Is == 0) return;
    weight(w.shared_w1, 1, 2 * Is, H, fp8w.shared_w1, fp8w.shared_w1t);
    weight(w.shared_w2, 1, H, Is, fp8w.shared_w2, fp8w.shared_w2t);
  }
  // ---- launches and device errors ----
  // A peer group's Layer numbers each launch's barriers across GPUs and relay values on the host
  // (stamp_launch), and the peers' flags only grow: a CUDA graph's replay would launch with the captured
  // numbers, which the flags have passed, and its barriers would not wait. So it is not captured.
  void refuse_capture(bool captured) const {
    if (!exchange.windowed()) return;
    require(!captured, std::string("a Layer of a peer group (gpus > 1, or the nccl or colocated transport) ") +
                           peer_group_capture_refusal);
  }
  // The call's `count` launch numbers (the first returned), taken before anything that may throw: a call
  // refused on one GPU of a group still uses its numbers, so its peers' launches of them time out and every
  // GPU's next call has the same numbers (taken after a refusal, a GPU's calls would stay behind its peers'
  // for good, and its barriers would pass on their older flags).
  unsigned long long take_launches(unsigned count) {
    if (group) return group->take_launches(gpu, count);
    return std::exchange(numbered, numbered + count);
  }
  // Launch `number`'s values in p: its epoch across GPUs and its relay values (each launch's are above
  // every earlier launch's; 64 bits: the epoch of the abort marks never wraps, PeerSync).
  void stamp_launch(Params& p, unsigned long long number) const {
    p.relay = exchange.relay(number);
    p.barrier.peers = exchange.peer_sync(number, p.barrier.arrived + 2);
  }
  void launch_kernel(const void* kernel, cudaStream_t stream, Params& p) {
    MOK_CUDA_CHECK(cudaMemsetAsync(p.barrier.arrived, 0, kBarrierWords * sizeof(unsigned int), stream));
    void* args[] = {&p};
    if (launch.paired_blocks) {
      cudaLaunchAttribute attributes[2] = {pair_clusters(), {}};
      attributes[1].id = cudaLaunchAttributeCooperative;
      attributes[1].val.cooperative = 1;
      const cudaLaunchConfig_t config = launch_config(blocks, stream, attributes, 2);
      MOK_CUDA_CHECK(cudaLaunchKernelExC(&config, kernel, args));
    } else {
      MOK_CUDA_CHECK(cudaLaunchCooperativeKernel(kernel, dim3(blocks), dim3(kThreads), args, kSmemBytes, stream));
    }
    MOK_CUDA_CHECK(cudaMemcpyAsync(host_error.get(), error.get(), sizeof(KernelError), cudaMemcpyDeviceToHost, stream));
    ++launches;
    last_stream = stream;
  }

  // The recorded error as a message ("" for none). The host copy lands behind each launch.
  Layer::DeviceError describe(const KernelError& e) const {
    if (e.code == kNoError) return {};
    const std::string where = launch.gpus > 1 ? " on GPU " + std::to_string(gpu) : "";
    const std::string secs = std::to_string(launch.watchdog_seconds);
    std::string m;
    if (e.code == kLogitOverflow)
      m = "mok: invalid input: router logit of token " + std::to_string(e.bad_token()) + " overflows";
    else if (e.code == kBadRouting)
      m = "mok: invalid input: the given routing of token " + std::to_string(e.bad_token()) +
          " has an expert id outside [0, E = " + std::to_string(c.experts) +
          "), an expert twice, or a non-finite weight";
    else if (e.code == kExpertBias)
      m = "mok: invalid input: expert_bias of expert " + std::to_string(e.detail) + " is NaN or Inf";
    else if (e.code == kSavedLayout)  // a bad row, or tables of no layout: no token (past the last)
      m = "mok: invalid input: " + (e.bad_token() < unsigned(c.tokens())
                                        ? saved_of_another_routing(e.bad_token(), where)
                                        : saved_holds_no_layout(where));
    else if (e.code == kRingCycles)
      m = "mok: internal: the backward" + where + " needs " + std::to_string(e.detail) +
          " ring cycles, but its layout lays dh or the routed a over the ring, which allows one "
          "(LaunchConfig::ring_rows = " +
          std::to_string(launch.ring_rows) + " holds every rank's tiles whatever the routing, by the layout's bound)";
    else if (e.code == kCapacity)
      m = "mok: capacity: the routing gives GPU " + std::to_string(e.cycle) + "'s experts " + std::to_string(e.detail) +
          " tiles of " + std::to_string(kTileRows) + " rows, more than its buffers hold (" +
          std::to_string(own_padded() / kTileRows) +
          " tiles: LaunchConfig::capacity_rows = " + std::to_string(launch.capacity_rows) +
          "); capacity_rows >= " + std::to_string(long(kTileRows) * (e.detail - c.experts / launch.gpus)) +
          " holds them";
    else if (e.code == kPipelineTimeout)
      m = "mok: watchdog: block " + std::to_string(e.detail) + where + " waited more than " + secs +
          " s for its operand pipeline in phase '" + phase_name(e.phase) + "'";
    else if (e.code == kBarrierTimeout)
      m = "mok: watchdog: block " + std::to_string(e.detail) + where + " waited more than " + secs +
          " s at the grid barrier after phase '" + phase_name(e.phase) + "', ring cycle " + std::to_string(e.cycle);
    else if (e.code == kRelayTimeout)
      m = "mok: watchdog: GPU " + std::to_string(gpu) + " waited more than " + secs + " s for GPU " +
          std::to_string(e.detail) + "'s sums of the chains over every token in phase '" + phase_name(e.phase) + "'";
    else if (e.code == kPeerTimeout)
      m = "mok: watchdog: GPU " + std::to_string(gpu) + " waited more than " + secs + " s for GPU " +
          std::to_string(e.detail) + " at the barrier across GPUs after phase '" + phase_name(e.phase) + "'";
    else  // kPeerAborted: the failed GPU's own Layer raises the cause
      m = "mok: GPU " + std::to_string(e.detail) + " stopped on an error (raised by GPU " + std::to_string(e.detail) +
          "'s Layer); GPU " + std::to_string(gpu) + "'s launch ended waiting for it after phase '" +
          phase_name(e.phase) + "'";
    return {e.code, m};
  }

  // Throws a recorded error after clearing it. The GPU is drained first, so the copy is whole, whichever
  // stream the launch ran on (a graph's replay: the stream it was captured on may be gone), and again
  // after the reset, which is done before the next call enqueues anything.
  void raise_pending() {
    // volatile: the device's copies land behind the compiler's back.
    if (*reinterpret_cast<volatile int*>(&host_error.get()->code) == kNoError) return;
    MOK_CUDA_CHECK(cudaDeviceSynchronize());
    const DeviceError e = describe(*host_error.get());
    MOK_CUDA_CHECK(cudaMemset(error.get(), 0, sizeof(KernelError)));
    MOK_CUDA_CHECK(cudaDeviceSynchronize());
    *host_error.get() = KernelError{};
    throw Error(e.message);
  }

  void finish_call() {
    if (!launch.synchronous) return;
    MOK_CUDA_CHECK(cudaStreamSynchronize(last_stream));
    raise_pending();
  }
};

Layer::Layer(const LayerConfig& c, const LaunchConfig& launch, int gpu, const PeerGroup* peers)
    : impl_(std::make_unique<Impl>()) {
  validate_launch(c, launch);
  require((launch.transport == Transport::simulated) == (peers == nullptr),
          "the nccl and colocated transports need a peer group (make_peer_group), simulated ranks none");
  require(gpu >= 0 && gpu < launch.gpus, "gpu " + std::to_string(gpu) + " is outside the launch's GPUs");
  if (peers) {
    require(peers->transport() == launch.transport && peers->gpus() == launch.gpus && peers->holds(gpu) &&
                peers->bytes() >= Exchange::window_bytes(c, launch.gpus),
            "the peer group was made for another launch or config");
    int current = 0;
    MOK_CUDA_CHECK(cudaGetDevice(&current));
    require(peers->device(gpu) == current, "GPU " + std::to_string(gpu) + "'s window is on CUDA device " +
                                               std::to_string(peers->device(gpu)) + ", not on the current device " +
                                               std::to_string(current));
  }
  impl_->init(c, launch, gpu, peers);
}

namespace {

// A Layer's config and the sizes its launch gives (layer_memory: the launch options that matter to the ranks
// alike), hashed (FNV-1a over each value's bits): what the ranks of a communicator compare before they
// register a window together.
uint64_t fingerprint(const LayerConfig& c, const LaunchConfig& launch) {
  uint64_t h = kFnv1aStart;
  const auto mix = [&](uint64_t v) { h = fnv1a(&v, sizeof(v), h); };
  for_each_field(c, [&](const char*, const auto& v) {
    if constexpr (std::is_floating_point_v<std::decay_t<decltype(v)>>)
      mix(std::bit_cast<uint32_t>(float(v)));
    else
      mix(uint64_t(v));
  });
  const LayerMemory m = layer_memory(c, launch);
  for (const size_t bytes : {m.saved, m.workspace_forward, m.workspace_backward, m.window, m.fp8_weights}) mix(bytes);
  return h;
}

}  // namespace

Layer::Layer(const LayerConfig& c, const LaunchConfig& launch, ncclComm_t comm) : impl_(std::make_unique<Impl>()) {
  require(comm != nullptr, "the NCCL communicator is null");
  int count = 0, rank = 0, device = 0, current = 0;
  MOK_NCCL_CHECK(ncclCommCount(comm, &count));
  MOK_NCCL_CHECK(ncclCommUserRank(comm, &rank));
  MOK_NCCL_CHECK(ncclCommCuDevice(comm, &device));
  MOK_CUDA_CHECK(cudaGetDevice(&current));
  require(device == current, "the communicator's CUDA device " + std::to_string(device) +
                                 " is not the current device " + std::to_string(current));
  require(launch.transport != Transport::colocated, "a Layer on a communicator cannot use the colocated transport");
  require(launch.gpus == 1 || launch.gpus == count,
          "gpus = " + std::to_string(launch.gpus) + ", but the communicator has " + std::to_string(count) + " ranks");
  const LaunchConfig on_comm = on_communicator(launch, count);
  validate_launch(c, on_comm);  // before the collective registration: a refused Layer leaves no window
  impl_->comm_peers = std::make_unique<PeerGroup>(comm, Exchange::window_bytes(c, count), fingerprint(c, on_comm));
  impl_->init(c, on_comm, rank, impl_->comm_peers.get());
}

std::shared_ptr<const PeerGroup> make_peer_group(const LayerConfig& c, const LaunchConfig& launch) {
  validate_launch(c, launch);
  if (launch.transport == Transport::simulated) return nullptr;
  require(launch.transport == Transport::colocated || launch.gpus <= hopper_gpus(),
          "gpus = " + std::to_string(launch.gpus) + " but only " + std::to_string(hopper_gpus()) +
              " Hopper GPU(s) are usable");
  return std::make_shared<PeerGroup>(launch.transport, launch.gpus, Exchange::window_bytes(c, launch.gpus));
}

void check_launch(const LayerConfig& c, const LaunchConfig& launch) {
  validate_launch_config(c, launch);
  // Not in layer_memory's checks: it sizes a plan for more GPUs than a launch spans (mok-bench --plan).
  require(launch.gpus <= kMaxGpus,
          "gpus = " + std::to_string(launch.gpus) + " is outside [1, " + std::to_string(kMaxGpus) + "]");
}

LayerMemory layer_memory(const LayerConfig& c, const LaunchConfig& launch, BackwardScratch scratch) {
  validate_launch_config(c, launch);
  LaunchConfig resolved = launch;
  resolved.ring_rows = resolved_ring_rows(c, launch);
  const bool windowed = launch.transport != Transport::simulated;  // a peer group's Layer, one GPU's too
  const WorkspaceLayout ws = workspace_layout(c, resolved, !windowed, scratch);
  const RowShare share{launch.gpus, 0, launch.capacity_rows};
  return {saved_layout(c, launch.recompute, share).bytes, ws.forward_bytes, ws.bytes,
          windowed ? Exchange::window_bytes(c, launch.gpus) : 0, fp8_weight_layout(c, c.experts / launch.gpus).bytes};
}

Layer::~Layer() = default;

const LayerConfig& Layer::config() const { return impl_->c; }
size_t Layer::workspace_bytes(Pass pass, BackwardScratch scratch) const {
  return pass == Pass::forward ? impl_->ws().forward_bytes : impl_->backward_layout(scratch).bytes;
}
int Layer::ring_rows() const { return impl_->launch.ring_rows; }
size_t Layer::saved_bytes() const { return impl_->saved.bytes; }
int Layer::blocks() const { return impl_->blocks; }

// The layer's device is current for the length of a call, and the caller's afterwards.
class OnDevice {
 public:
  explicit OnDevice(int device) { MOK_CUDA_CHECK(cudaSetDevice(device)); }

 private:
  KeepCurrentDevice keep_;
};

void Layer::forward(cudaStream_t stream, const TensorView& workspace, const ForwardInputs& in,
                    const ForwardOutputs& out) {
  Impl& m = *impl_;
  const unsigned long long number = m.take_launches(1);
  const OnDevice on(m.device);
  m.raise_pending();
  const bool captured = capturing(stream);
  require_stream_on(stream, m.device, captured);
  m.refuse_capture(captured);
  m.check_forward(in, out, true);
  uint8_t* ws = checked_workspace(workspace, m.ws().forward_bytes, Pass::forward);
  m.check_forward_memory(captured, workspace, in, out);
  Params p = m.params(Pass::forward, m.ws(), ws, nullptr, in, out, number);
  m.exchange.bind_forward(p, stream, in, out, ws + m.ws().y_slots);
  uint8_t* quantized = m.quantized_weights(ws, in);
  m.encode_maps(Pass::forward, p, in.weights, quantized);
  const bool fp8 = m.c.precision == Precision::fp8;
  if (fp8 && !in.fp8_weights.data) m.quantize_weights(stream, quantized, in.weights, false);
  m.launch_kernel(megakernel_of(Pass::forward, fp8, m.launch.paired_blocks), stream, p);
  m.exchange.after_forward(stream, in, out);
  // topk_w is an output unless a given routing is read in place (then it is the caller's input).
  const bool topk_w_written = in.routing != RoutingMode::given || (in.topk_w.data && in.topk_w.data != out.topk_w.data);
  fill_nan_on_error(stream, &m.error.get()->code, {out.y, out.logits, topk_w_written ? out.topk_w : TensorView{}});
  m.finish_call();
}

void Layer::backward(cudaStream_t stream, const TensorView& workspace, const ForwardInputs& in,
                     const ForwardOutputs& fwd, const TensorView& dy, const GradOutputs& grads) {
  Impl& m = *impl_;
  const unsigned long long number = m.take_launches(2);  // the prologue's, the backward kernel's
  const OnDevice on(m.device);
  m.raise_pending();
  const bool captured = capturing(stream);
  require_stream_on(stream, m.device, captured);
  m.refuse_capture(captured);
  m.check_forward(in, fwd, false);
  m.check_grads(in, dy, grads);
  const WorkspaceLayout& layout = m.backward_layout(grads.scratch);
  uint8_t* ws = checked_workspace(workspace, layout.bytes, Pass::backward);
  m.check_backward_memory(captured, workspace, in, fwd, dy, grads);
  uint8_t* d_w1 = ptr<uint8_t>(grads.d_w1);
  Params p = m.params(Pass::backward, layout, ws, d_w1, in, fwd, number);
  p.accumulate = grads.accumulate;
  p.dx = ptr<bf16>(grads.dx);
  p.d_router = ptr<float>(grads.d_router);
  p.grads_bf16 = grads.d_w1.dtype == DType::bf16;
  m.exchange.bind_backward(p, stream, in, fwd, dy, grads, layout.scratch_base(ws, d_w1) + layout.dx_slots);
  uint8_t* quantized = m.quantized_weights(ws, in);
  m.encode_maps(Pass::backward, p, in.weights, quantized, grads);
  const bool fp8 = m.c.precision == Precision::fp8;
  // Both copies: recompute mode's GEMM1 reads W1 as the forward does.
  if (fp8 && !in.fp8_weights.data) m.quantize_weights(stream, quantized, in.weights, true);
  m.launch_kernel(reinterpret_cast<const void*>(fp8 ? backward_prologue_fp8_kernel : backward_prologue_kernel), stream,
                  p);
  m.stamp_launch(p, number + 1);
  m.launch_kernel(megakernel_of(Pass::backward, fp8, m.launch.paired_blocks), stream, p);
  // Across GPUs the shared expert's weight gradients, chains over every token, follow in a kernel of their
  // own (backward.cu, relayed_chains_kernel).
  if (m.launch.gpus > 1 && m.c.has_shared())
    m.launch_kernel(reinterpret_cast<const void*>(relayed_chains_kernel), stream, p);
  m.exchange.after_backward(stream, grads);
  // Accumulators are not filled: an input error stops the call before it adds into them (after a watchdog's
  // or a peer's error they may hold part of its sums: layer.h).
  const auto written = [&](const TensorView& v) { return grads.accumulate ? TensorView{} : v; };
  fill_nan_on_error(stream, &m.error.get()->code,
                    {grads.dx, grads.d_topk_w, grads.d_logits, written(grads.d_router), written(grads.d_w1),
                     written(grads.d_w2), written(grads.d_shared_w1), written(grads.d_shared_w2)});
  m.finish_call();
}

size_t Layer::fp8_weights_bytes() const { return impl_->fp8w.bytes; }

void Layer::quantize_weights(cudaStream_t stream, const WeightViews& weights, const TensorView& fp8_weights) const {
  const Impl& m = *impl_;
  const OnDevice on(m.device);
  require(m.c.precision == Precision::fp8,
          "quantize_weights: precision is bf16 (only the fp8 mode quantizes its weights)");
  const bool captured = capturing(stream);
  require_stream_on(stream, m.device, captured);
  m.check_expert_weights(weights);
  m.check_fp8_weights(fp8_weights, false);
  std::vector<CallBytes> t;
  add_tensors(t, {{"w1", weights.w1}, {"w2", weights.w2}}, false);
  add_tensors(t, {{"fp8_weights", fp8_weights}}, true);
  require_apart(t);
  require_on_gpu(t, m.device, captured);
  m.quantize_weights(stream, static_cast<uint8_t*>(fp8_weights.data), weights, true);
  if (m.launch.synchronous) MOK_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void Layer::check() {
  const OnDevice on(impl_->device);
  // The whole GPU, not the last call's stream: a CUDA graph replays the calls on a stream of its own.
  if (impl_->launches) MOK_CUDA_CHECK(cudaDeviceSynchronize());
  impl_->raise_pending();
}

Layer::DeviceError Layer::poll_error() const { return impl_->describe(*impl_->host_error.get()); }

void Layer::poison_workspace(cudaStream_t stream, const TensorView& workspace) const {
  const OnDevice on(impl_->device);
  // Whatever its size: a workspace sized for one pass (a scratch backward's may be under the forward's).
  MOK_CUDA_CHECK(
      cudaMemsetAsync(checked_workspace(workspace, 0, Pass::backward), 0xff, size_t(workspace.shape[0]), stream));
}

std::vector<PhaseTime> Layer::phase_times() const {
  const Impl& m = *impl_;
  const OnDevice on(m.device);
  if (m.launches) MOK_CUDA_CHECK(cudaDeviceSynchronize());
  const int count = std::min(m.clock_count.download()[0], kClockEntries);
  const std::vector<long long> ns = m.clock_ns.download();
  const std::vector<int> phase = m.clock_phase.download();
  std::vector<PhaseTime> times;
  for (int i = 1; i < count; ++i) {
    const std::string name = phase_name(phase[i]);
    const double ms = double(ns[i] - ns[i - 1]) * 1e-6;
    const auto same = [&](const PhaseTime& t) { return t.phase == name; };
    if (const auto it = std::find_if(times.begin(), times.end(), same); it != times.end())
      it->ms += ms;
    else
      times.push_back(PhaseTime{name, ms});
  }
  return times;
}

}  // namespace mok::gpu
