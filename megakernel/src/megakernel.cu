// Host API of the megakernel: validation, workspace sized up front, cooperative launches,
// poisoned outputs, watchdog reports.
#include <algorithm>
#include <string>

#include "device_array.cuh"
#include "kernels.cuh"
#include "mok/core/validate.h"
#include "mok/megakernel/megakernel.h"
#include "tensor_map.h"

namespace mok::gpu {
namespace {

// out[c][r] = in[r][c] for `batches` matrices [rows, cols] (weight transposes for the backward).
__global__ void transpose_kernel(const bf16* in, bf16* out, int batches, int rows, int cols) {
  const long total = long(batches) * rows * cols;
  for (long i = long(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += long(gridDim.x) * blockDim.x) {
    const long b = i / (long(rows) * cols), r = (i / cols) % rows, c = i % cols;
    out[b * rows * cols + c * rows + r] = in[i];
  }
}

DeviceArray<bf16> transposed(const DeviceArray<bf16>& in, int batches, int rows, int cols) {
  DeviceArray<bf16> out(in.size());
  if (in.size()) {
    transpose_kernel<<<1024, 256>>>(in.get(), out.get(), batches, rows, cols);
    MOK_CUDA_CHECK(cudaGetLastError());
  }
  return out;
}

size_t sz(long a, long b) { return size_t(a) * size_t(b); }

// The name of a phase the kernels reported ("?" for a value out of range).
std::string phase_name(int phase) { return phase >= 0 && phase < kPhaseCount ? kPhaseNames[phase] : "?"; }

// Rows of the padded per-row scratch: every expert's rows rounded up to whole tiles.
long padded_rows(const LayerConfig& c) {
  return kTileRows * ((long(c.tokens()) * c.top_k + kTileRows - 1) / kTileRows + c.experts);
}

// The [N k, width] layout-row view of a padded per-row buffer.
std::vector<bf16> compact_rows(const std::vector<bf16>& padded, long width, const std::vector<int32_t>& offsets,
                               const std::vector<int32_t>& tile_offsets) {
  const int E = int(offsets.size()) - 1;
  std::vector<bf16> out(sz(offsets[E], width));
  for (int e = 0; e < E; ++e)
    for (long i = 0; i < offsets[e + 1] - offsets[e]; ++i)
      std::copy_n(padded.begin() + (long(kTileRows) * tile_offsets[e] + i) * width, width,
                  out.begin() + (offsets[e] + i) * width);
  return out;
}

}  // namespace

bool device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return false;
  }
  cudaDeviceProp prop;
  return cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9 && prop.minor == 0;
}

struct Megakernel::Impl {
  LayerConfig c;
  LaunchConfig launch;
  int blocks = 0;
  bool has_forward = false;
  bool router = true;

  DeviceArray<float> router_w, expert_bias;
  DeviceArray<bf16> w1, w2, w1t, w2t, shared_w1, shared_w2, shared_w1t, shared_w2t;
  DeviceArray<bf16> x, dy, ring;
  DeviceArray<float> logits, topk_w;
  DeviceArray<int32_t> topk_idx, chunk_counts, chunk_base, offsets, tile_offsets, row_source, slot_row;
  DeviceArray<bf16> h, a, dh, dye, xe, shared_h, shared_a, shared_y, shared_dh, slots, y, dx;
  DeviceArray<float> g, d_topk_w, d_logits, d_router, d_w1, d_w2, d_shared_w1, d_shared_w2;
  DeviceArray<unsigned int> barrier_words;
  DeviceArray<long long> clock_ns;
  DeviceArray<int> clock_phase, clock_count;
  DeviceArray<KernelError> error;
  TensorMaps maps{};

  void make_tensor_maps() {
    const long N = c.tokens(), H = c.hidden, I = c.intermediate, E = c.experts, Is = c.shared_intermediate;
    const long P = padded_rows(c);
    encode_tensor_map(maps.ring, ring.get(), long(c.ranks) * launch.ring_rows, H);
    encode_tensor_map(maps.w1, w1.get(), E * 2 * I, H);
    encode_tensor_map(maps.w2, w2.get(), E * H, I);
    encode_tensor_map(maps.w1t, w1t.get(), E * H, 2 * I);
    encode_tensor_map(maps.w2t, w2t.get(), E * I, H);
    encode_tensor_map(maps.a, a.get(), P, I);
    encode_tensor_map(maps.dh, dh.get(), P, 2 * I);
    encode_tensor_map(maps.dye, dye.get(), P, H);
    encode_tensor_map(maps.xe, xe.get(), P, H);
    encode_tensor_map(maps.x, x.get(), N, H);
    encode_tensor_map(maps.dy, dy.get(), N, H);
    if (Is == 0) return;
    encode_tensor_map(maps.shared_w1, shared_w1.get(), 2 * Is, H);
    encode_tensor_map(maps.shared_w2, shared_w2.get(), H, Is);
    encode_tensor_map(maps.shared_w1t, shared_w1t.get(), H, 2 * Is);
    encode_tensor_map(maps.shared_w2t, shared_w2t.get(), Is, H);
    encode_tensor_map(maps.shared_a, shared_a.get(), N, Is);
    encode_tensor_map(maps.shared_dh, shared_dh.get(), N, 2 * Is);
  }

  Params params() const {
    Params p{};
    p.c = c;
    p.ring_rows = launch.ring_rows;
    p.router = router;
    const int T = c.tokens_per_rank, H = c.hidden, k = c.top_k;
    for (int r = 0; r < c.ranks; ++r)
      p.rank[r] = RankBuffers{x.get() + sz(r, sz(T, H)),        dy.get() + sz(r, sz(T, H)),
                              topk_w.get() + sz(r, sz(T, k)),   slots.get() + sz(r, sz(T, sz(k, H))),
                              d_topk_w.get() + sz(r, sz(T, k)), ring.get() + sz(r, sz(launch.ring_rows, H))};
    p.barrier = GridBarrier{barrier_words.get(), barrier_words.get() + 1, error.get(),
                            (long long)(launch.watchdog_seconds * 1e9),
                            PhaseClock{clock_ns.get(), clock_phase.get(), clock_count.get()}};
    p.maps = maps;
    p.router_w = router_w.get();
    p.expert_bias = expert_bias.size() ? expert_bias.get() : nullptr;
    p.w1 = w1.get(), p.w2 = w2.get(), p.w1t = w1t.get(), p.w2t = w2t.get();
    p.shared_w1 = shared_w1.get(), p.shared_w2 = shared_w2.get();
    p.shared_w1t = shared_w1t.get(), p.shared_w2t = shared_w2t.get();
    p.x = x.get(), p.dy = dy.get();
    p.logits = logits.get(), p.topk_idx = topk_idx.get(), p.topk_w = topk_w.get();
    p.chunk_counts = chunk_counts.get(), p.chunk_base = chunk_base.get(), p.offsets = offsets.get();
    p.tile_offsets = tile_offsets.get(), p.row_source = row_source.get(), p.slot_row = slot_row.get();
    p.h = h.get(), p.a = a.get(), p.g = g.get(), p.dh = dh.get(), p.dye = dye.get(), p.xe = xe.get();
    p.shared_h = shared_h.get(), p.shared_a = shared_a.get(), p.shared_y = shared_y.get();
    p.shared_dh = shared_dh.get();
    p.y = y.get(), p.dx = dx.get(), p.d_logits = d_logits.get(), p.d_router = d_router.get();
    p.d_w1 = d_w1.get(), p.d_w2 = d_w2.get(), p.d_shared_w1 = d_shared_w1.get(), p.d_shared_w2 = d_shared_w2.get();
    return p;
  }

  void run(const void* kernel, const char* direction) {
    barrier_words.zero();
    error.zero();
    clock_count.zero();
    Params p = params();
    void* args[] = {&p};
    MOK_CUDA_CHECK(cudaLaunchCooperativeKernel(kernel, dim3(blocks), dim3(kThreads), args, kSmemBytes, nullptr));
    MOK_CUDA_CHECK(cudaDeviceSynchronize());
    const KernelError e = error.download()[0];
    if (e.code == kLogitOverflow)
      throw Error("mok: invalid input: router logit of token " + std::to_string(e.detail) + " overflows");
    if (e.code == kPipelineTimeout)
      throw Error(watchdog_report(direction, e, " s for its operand pipeline in phase '" + phase_name(e.phase) + "'"));
    if (e.code == kBarrierTimeout)
      throw Error(watchdog_report(
          direction, e,
          " s at the grid barrier after phase '" + phase_name(e.phase) + "', ring cycle " + std::to_string(e.cycle)));
  }

  // "mok: watchdog: the <direction> kernel's block <b> waited more than <t>" + where.
  std::string watchdog_report(const char* direction, const KernelError& e, const std::string& where) const {
    return std::string("mok: watchdog: the ") + direction + " kernel's block " + std::to_string(e.detail) +
           " waited more than " + std::to_string(launch.watchdog_seconds) + where;
  }
};

Megakernel::Megakernel(const LayerConfig& c, const LayerWeights& w, const LaunchConfig& launch)
    : impl_(std::make_unique<Impl>()) {
  validate(c);
  validate_weights(c, w);
  require(c.ranks <= kMaxRanks, "ranks R = " + std::to_string(c.ranks) + " exceeds " + std::to_string(kMaxRanks));
  static_assert(kRingRowGranularity == kTileRows);
  require(launch.ring_rows > 0 && launch.ring_rows % kTileRows == 0, "ring_rows = " + std::to_string(launch.ring_rows) +
                                                                         " is not a positive multiple of " +
                                                                         std::to_string(kTileRows));
  require(launch.watchdog_seconds > 0, "watchdog_seconds must be positive");
  require(device_available(), "no CUDA device of compute capability 9.0 (Hopper) is available");
  Impl& m = *impl_;
  m.c = c;
  m.launch = launch;
  int dev = 0, sms = 0, per_sm_fwd = 0, per_sm_bwd = 0;
  MOK_CUDA_CHECK(cudaGetDevice(&dev));
  MOK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  for (const void* kernel : {(const void*)forward_kernel, (const void*)backward_kernel})
    MOK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
  MOK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_fwd, forward_kernel, kThreads, kSmemBytes));
  MOK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_bwd, backward_kernel, kThreads, kSmemBytes));
  const int resident = sms * std::min(per_sm_fwd, per_sm_bwd);
  require(launch.blocks >= 0 && launch.blocks <= resident, "blocks = " + std::to_string(launch.blocks) +
                                                               " exceeds the " + std::to_string(resident) +
                                                               " co-resident blocks of this device");
  m.blocks = launch.blocks ? launch.blocks : resident;

  const long N = c.tokens(), H = c.hidden, I = c.intermediate, E = c.experts, k = c.top_k;
  const long Is = c.shared_intermediate, rows = N * k, chunks = layout_chunks(int(N)), P = padded_rows(c);
  m.router_w = DeviceArray<float>(w.router);
  m.expert_bias = DeviceArray<float>(w.expert_bias);
  m.w1 = DeviceArray<bf16>(w.w1);
  m.w2 = DeviceArray<bf16>(w.w2);
  m.w1t = transposed(m.w1, int(E), int(2 * I), int(H));
  m.w2t = transposed(m.w2, int(E), int(H), int(I));
  m.shared_w1 = DeviceArray<bf16>(w.shared_w1);
  m.shared_w2 = DeviceArray<bf16>(w.shared_w2);
  m.shared_w1t = transposed(m.shared_w1, 1, int(2 * Is), int(H));
  m.shared_w2t = transposed(m.shared_w2, 1, int(H), int(Is));
  m.x = DeviceArray<bf16>(sz(N, H));
  m.dy = DeviceArray<bf16>(sz(N, H));
  m.ring = DeviceArray<bf16>(sz(c.ranks, sz(launch.ring_rows, H)));
  m.logits = DeviceArray<float>(sz(N, E));
  m.topk_idx = DeviceArray<int32_t>(sz(N, k));
  m.topk_w = DeviceArray<float>(sz(N, k));
  m.chunk_counts = DeviceArray<int32_t>(sz(chunks, E));
  m.chunk_base = DeviceArray<int32_t>(sz(chunks, E));
  m.offsets = DeviceArray<int32_t>(E + 1);
  m.tile_offsets = DeviceArray<int32_t>(E + 1);
  m.row_source = DeviceArray<int32_t>(rows);
  m.slot_row = DeviceArray<int32_t>(rows);
  m.h = DeviceArray<bf16>(sz(P, 2 * I));
  m.a = DeviceArray<bf16>(sz(P, I));
  m.g = DeviceArray<float>(sz(P, I));
  m.dh = DeviceArray<bf16>(sz(P, 2 * I));
  m.dye = DeviceArray<bf16>(sz(P, H));
  m.xe = DeviceArray<bf16>(sz(P, H));
  m.shared_h = DeviceArray<bf16>(sz(N, 2 * Is));
  m.shared_a = DeviceArray<bf16>(sz(N, Is));
  m.shared_y = DeviceArray<bf16>(sz(N, H));
  m.shared_dh = DeviceArray<bf16>(sz(N, 2 * Is));
  m.slots = DeviceArray<bf16>(sz(rows, H));
  m.y = DeviceArray<bf16>(sz(N, H));
  m.dx = DeviceArray<bf16>(sz(N, H));
  m.d_topk_w = DeviceArray<float>(sz(N, k));
  m.d_logits = DeviceArray<float>(sz(N, E));
  m.d_router = DeviceArray<float>(sz(E, H));
  m.d_w1 = DeviceArray<float>(sz(E, 2 * I * H));
  m.d_w2 = DeviceArray<float>(sz(E, H * I));
  m.d_shared_w1 = DeviceArray<float>(sz(2 * Is, H));
  m.d_shared_w2 = DeviceArray<float>(sz(H, Is));
  m.barrier_words = DeviceArray<unsigned int>(2);
  m.clock_ns = DeviceArray<long long>(kClockEntries);
  m.clock_phase = DeviceArray<int>(kClockEntries);
  m.clock_count = DeviceArray<int>(1);
  m.error = DeviceArray<KernelError>(1);
  m.make_tensor_maps();
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
}

Megakernel::~Megakernel() = default;

int Megakernel::blocks() const { return impl_->blocks; }

std::vector<PhaseTime> Megakernel::phase_times() const {
  const Impl& m = *impl_;
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

void Megakernel::set_input(const std::vector<bf16>& x, const Routing* given) {
  Impl& m = *impl_;
  validate_tokens(m.c, x, "x [N, H]");
  if (given) validate_routing(m.c, *given);
  m.x.upload(x);
  m.router = given == nullptr;
  m.has_forward = false;
  if (given) {
    m.topk_idx.upload(given->topk_idx);
    m.topk_w.upload(given->topk_w);
  } else {
    m.topk_idx.poison();
    m.topk_w.poison();
  }
  m.logits.poison();
  for (auto* buf : {&m.offsets, &m.tile_offsets, &m.row_source, &m.slot_row}) buf->poison();
  for (auto* buf : {&m.h, &m.a, &m.shared_h, &m.shared_a, &m.shared_y, &m.slots, &m.y}) buf->poison();
}

void Megakernel::launch_forward() {
  impl_->run(reinterpret_cast<const void*>(forward_kernel), "forward");
  impl_->has_forward = true;
}

Forward Megakernel::read_forward() const {
  const Impl& m = *impl_;
  require(m.has_forward, "no forward has run");
  Forward f;
  f.routing = Routing{m.topk_idx.download(), m.topk_w.download()};
  if (m.router) f.logits = m.logits.download();
  f.layout.offsets = m.offsets.download();
  const std::vector<int32_t> tile_offsets = m.tile_offsets.download();
  f.layout.row_source = m.row_source.download();
  f.layout.slot_row = m.slot_row.download();
  f.layout.counts.resize(m.c.experts);
  for (int e = 0; e < m.c.experts; ++e) f.layout.counts[e] = f.layout.offsets[e + 1] - f.layout.offsets[e];
  f.y = m.y.download();
  f.h = compact_rows(m.h.download(), 2L * m.c.intermediate, f.layout.offsets, tile_offsets);
  f.a = compact_rows(m.a.download(), m.c.intermediate, f.layout.offsets, tile_offsets);
  f.shared_h = m.shared_h.download();
  f.shared_a = m.shared_a.download();
  return f;
}

void Megakernel::set_output_grad(const std::vector<bf16>& dy) {
  Impl& m = *impl_;
  require(m.has_forward, "backward before any forward");
  validate_tokens(m.c, dy, "dy [N, H]");
  m.dy.upload(dy);
  for (auto* buf : {&m.g, &m.d_topk_w, &m.d_logits, &m.d_router, &m.d_w1, &m.d_w2, &m.d_shared_w1, &m.d_shared_w2})
    buf->poison();
  for (auto* buf : {&m.dh, &m.dye, &m.xe, &m.shared_dh, &m.shared_y, &m.slots, &m.dx}) buf->poison();
}

void Megakernel::launch_backward() { impl_->run(reinterpret_cast<const void*>(backward_kernel), "backward"); }

Gradients Megakernel::read_gradients() const {
  const Impl& m = *impl_;
  Gradients gr;
  gr.dx = m.dx.download();
  gr.d_topk_w = m.d_topk_w.download();
  if (m.router) {
    gr.d_logits = m.d_logits.download();
    gr.d_router = m.d_router.download();
  }
  gr.d_w1 = m.d_w1.download();
  gr.d_w2 = m.d_w2.download();
  gr.d_shared_w1 = m.d_shared_w1.download();
  gr.d_shared_w2 = m.d_shared_w2.download();
  return gr;
}

Forward Megakernel::forward(const std::vector<bf16>& x, const Routing* given) {
  set_input(x, given);
  launch_forward();
  return read_forward();
}

Gradients Megakernel::backward(const std::vector<bf16>& dy) {
  set_output_grad(dy);
  launch_backward();
  return read_gradients();
}

}  // namespace mok::gpu
