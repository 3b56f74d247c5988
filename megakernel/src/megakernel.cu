// Host API of the megakernel: validation, workspace sized up front, cooperative launches,
// poisoned outputs, watchdog reports.
#include <algorithm>
#include <string>

#include "current_device.h"
#include "device_array.cuh"
#include "kernels.cuh"
#include "mok/core/validate.h"
#include "mok/megakernel/megakernel.h"
#include "peer_group.h"
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

// The buffers a GPU exposes to its peers, in one block (an NCCL window, or one allocation): global-size
// [N, ...] views, of which each rank owns its slice; then the flag words of the barrier across GPUs.
struct ExposedLayout {
  size_t x, dy, topk_idx, topk_w, slots, d_topk_w, d_logits, flags, bytes;
};
ExposedLayout exposed_layout(const LayerConfig& c) {
  const size_t N = c.tokens(), H = c.hidden, k = c.top_k, E = c.experts;
  ExposedLayout l{};
  size_t at = 0;
  const auto take = [&](size_t& field, size_t bytes) {
    field = at;
    at += (bytes + 4095) / 4096 * 4096;
  };
  take(l.x, N * H * sizeof(bf16));
  take(l.dy, N * H * sizeof(bf16));
  take(l.topk_idx, N * k * sizeof(int32_t));
  take(l.topk_w, N * k * sizeof(float));
  take(l.slots, N * k * H * sizeof(bf16));
  take(l.d_topk_w, N * k * sizeof(float));
  take(l.d_logits, N * E * sizeof(float));
  take(l.flags, kMaxGpus * sizeof(unsigned int));
  l.bytes = at;
  return l;
}

template <class T>
T* at_offset(uint8_t* base, size_t offset) {
  return reinterpret_cast<T*>(base + offset);
}

// Persistent blocks on the current device: `asked`, or (0) as many as are co-resident.
int resident_blocks(int asked) {
  int dev = 0, sms = 0, per_sm_fwd = 0, per_sm_bwd = 0;
  MOK_CUDA_CHECK(cudaGetDevice(&dev));
  MOK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  for (const void* kernel : {(const void*)forward_kernel, (const void*)backward_kernel}) {
    MOK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
    // The GEMM phases' setmaxnreg hand-over balances only from this count (tile_gemm.cuh); a build
    // that gave the kernels fewer registers would hang in it.
    cudaFuncAttributes attributes{};
    MOK_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    require(attributes.numRegs == kKernelRegisters,
            "mok: the kernels were built with " + std::to_string(attributes.numRegs) + " registers per thread, not " +
                std::to_string(kKernelRegisters) + " (check -maxrregcount, -G)");
  }
  MOK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_fwd, forward_kernel, kThreads, kSmemBytes));
  MOK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_bwd, backward_kernel, kThreads, kSmemBytes));
  const int resident = sms * std::min(per_sm_fwd, per_sm_bwd);
  require(asked >= 0 && asked <= resident, "blocks = " + std::to_string(asked) + " exceeds the " +
                                               std::to_string(resident) + " co-resident blocks of this device");
  return asked ? asked : resident;
}

}  // namespace

bool device_available() { return hopper_gpus() > 0; }

int hopper_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  int hopper = 0;
  cudaDeviceProp prop;
  while (hopper < n && cudaGetDeviceProperties(&prop, hopper) == cudaSuccess && prop.major == 9 && prop.minor == 0)
    ++hopper;
  return hopper;
}

// One GPU's share: the ranks it executes, every weight, its exposed block and its workspace.
struct GpuState {
  int device = 0, rank_begin = 0, rank_end = 0, blocks = 0;
  DeviceArray<uint8_t> exposed_memory;  // simulated ranks; NCCL windows belong to the PeerGroup
  uint8_t* exposed = nullptr;           // this GPU's exposed block (its own allocation's address)
  std::vector<uint8_t*> peer_exposed;   // each GPU's exposed block, as this GPU addresses it

  DeviceSpan<bf16> x, dy, slots;
  DeviceSpan<int32_t> topk_idx;
  DeviceSpan<float> topk_w, d_topk_w, d_logits;
  DeviceSpan<unsigned int> flags;

  DeviceArray<float> router_w, expert_bias;
  DeviceArray<bf16> w1, w2, w1t, w2t, shared_w1, shared_w2, shared_w1t, shared_w2t;
  DeviceArray<bf16> ring;
  DeviceArray<float> logits;
  DeviceArray<int32_t> chunk_counts, chunk_base, offsets, tile_offsets, row_source, slot_row;
  DeviceArray<bf16> h, a, dh, dye, xe, shared_h, shared_a, shared_y, shared_dh, y, dx;
  DeviceArray<float> g, d_router, d_w1, d_w2, d_shared_w1, d_shared_w2;
  DeviceArray<unsigned int> barrier_words, peer_barriers;
  DeviceArray<long long> clock_ns;
  DeviceArray<int> clock_phase, clock_count;
  DeviceArray<KernelError> error;
  TensorMaps maps{};

  void use() const { MOK_CUDA_CHECK(cudaSetDevice(device)); }
};

struct Megakernel::Impl {
  LayerConfig c;
  LaunchConfig launch;
  bool has_forward = false;
  bool router = true;
  unsigned int launches = 0;
  ExposedLayout exposed;
  std::unique_ptr<PeerGroup> peers;  // NCCL; declared before gpus, so released after them
  std::vector<GpuState> gpus;

  ~Impl() {
    const KeepCurrentDevice keep;
    for (GpuState& s : gpus) {  // each GPU's memory freed with that GPU current
      cudaSetDevice(s.device);
      GpuState gone = std::move(s);
    }
  }

  int ranks_per_gpu() const { return c.ranks / launch.gpus; }
  int index_of(const GpuState& s) const { return int(&s - gpus.data()); }
  int owner(int rank) const { return rank / ranks_per_gpu(); }

  void allocate(GpuState& s, const LayerWeights& w) {
    const long N = c.tokens(), H = c.hidden, I = c.intermediate, E = c.experts, k = c.top_k;
    const long Is = c.shared_intermediate, rows = N * k, chunks = layout_chunks(int(N)), P = padded_rows(c);
    s.router_w = DeviceArray<float>(w.router);
    s.expert_bias = DeviceArray<float>(w.expert_bias);
    s.w1 = DeviceArray<bf16>(w.w1);
    s.w2 = DeviceArray<bf16>(w.w2);
    s.w1t = transposed(s.w1, int(E), int(2 * I), int(H));
    s.w2t = transposed(s.w2, int(E), int(H), int(I));
    s.shared_w1 = DeviceArray<bf16>(w.shared_w1);
    s.shared_w2 = DeviceArray<bf16>(w.shared_w2);
    s.shared_w1t = transposed(s.shared_w1, 1, int(2 * Is), int(H));
    s.shared_w2t = transposed(s.shared_w2, 1, int(H), int(Is));
    s.ring = DeviceArray<bf16>(sz(c.ranks, sz(launch.ring_rows, H)));
    s.logits = DeviceArray<float>(sz(N, E));
    s.chunk_counts = DeviceArray<int32_t>(sz(chunks, E));
    s.chunk_base = DeviceArray<int32_t>(sz(chunks, E));
    s.offsets = DeviceArray<int32_t>(E + 1);
    s.tile_offsets = DeviceArray<int32_t>(E + 1);
    s.row_source = DeviceArray<int32_t>(rows);
    s.slot_row = DeviceArray<int32_t>(rows);
    s.h = DeviceArray<bf16>(sz(P, 2 * I));
    s.a = DeviceArray<bf16>(sz(P, I));
    s.g = DeviceArray<float>(sz(P, I));
    s.dh = DeviceArray<bf16>(sz(P, 2 * I));
    s.dye = DeviceArray<bf16>(sz(P, H));
    s.xe = DeviceArray<bf16>(sz(P, H));
    s.shared_h = DeviceArray<bf16>(sz(N, 2 * Is));
    s.shared_a = DeviceArray<bf16>(sz(N, Is));
    s.shared_y = DeviceArray<bf16>(sz(N, H));
    s.shared_dh = DeviceArray<bf16>(sz(N, 2 * Is));
    s.y = DeviceArray<bf16>(sz(N, H));
    s.dx = DeviceArray<bf16>(sz(N, H));
    s.d_router = DeviceArray<float>(sz(E, H));
    s.d_w1 = DeviceArray<float>(sz(E, 2 * I * H));
    s.d_w2 = DeviceArray<float>(sz(E, H * I));
    s.d_shared_w1 = DeviceArray<float>(sz(2 * Is, H));
    s.d_shared_w2 = DeviceArray<float>(sz(H, Is));
    s.barrier_words = DeviceArray<unsigned int>(2);
    s.peer_barriers = DeviceArray<unsigned int>(1);
    s.clock_ns = DeviceArray<long long>(kClockEntries);
    s.clock_phase = DeviceArray<int>(kClockEntries);
    s.clock_count = DeviceArray<int>(1);
    s.error = DeviceArray<KernelError>(1);
  }

  // The exposed block's views (the flags start at zero: they only grow).
  void expose(GpuState& s, uint8_t* base) {
    s.exposed = base;
    const size_t N = c.tokens(), H = c.hidden, k = c.top_k, E = c.experts;
    s.x = DeviceSpan<bf16>(at_offset<bf16>(base, exposed.x), N * H);
    s.dy = DeviceSpan<bf16>(at_offset<bf16>(base, exposed.dy), N * H);
    s.topk_idx = DeviceSpan<int32_t>(at_offset<int32_t>(base, exposed.topk_idx), N * k);
    s.topk_w = DeviceSpan<float>(at_offset<float>(base, exposed.topk_w), N * k);
    s.slots = DeviceSpan<bf16>(at_offset<bf16>(base, exposed.slots), N * k * H);
    s.d_topk_w = DeviceSpan<float>(at_offset<float>(base, exposed.d_topk_w), N * k);
    s.d_logits = DeviceSpan<float>(at_offset<float>(base, exposed.d_logits), N * E);
    s.flags = DeviceSpan<unsigned int>(at_offset<unsigned int>(base, exposed.flags), kMaxGpus);
    s.flags.zero();
  }

  void make_tensor_maps(GpuState& s) const {
    const long N = c.tokens(), H = c.hidden, I = c.intermediate, E = c.experts, Is = c.shared_intermediate;
    const long P = padded_rows(c);
    TensorMaps& maps = s.maps;
    encode_tensor_map(maps.ring, s.ring.get(), long(c.ranks) * launch.ring_rows, H);
    encode_tensor_map(maps.w1, s.w1.get(), E * 2 * I, H);
    encode_tensor_map(maps.w2, s.w2.get(), E * H, I);
    encode_tensor_map(maps.w1t, s.w1t.get(), E * H, 2 * I);
    encode_tensor_map(maps.w2t, s.w2t.get(), E * I, H);
    encode_tensor_map(maps.a, s.a.get(), P, I);
    encode_tensor_map(maps.dh, s.dh.get(), P, 2 * I);
    encode_tensor_map(maps.dye, s.dye.get(), P, H);
    encode_tensor_map(maps.xe, s.xe.get(), P, H);
    encode_tensor_map(maps.x, s.x.get(), N, H);
    encode_tensor_map(maps.dy, s.dy.get(), N, H);
    if (Is == 0) return;
    encode_tensor_map(maps.shared_w1, s.shared_w1.get(), 2 * Is, H);
    encode_tensor_map(maps.shared_w2, s.shared_w2.get(), H, Is);
    encode_tensor_map(maps.shared_w1t, s.shared_w1t.get(), H, 2 * Is);
    encode_tensor_map(maps.shared_w2t, s.shared_w2t.get(), Is, H);
    encode_tensor_map(maps.shared_a, s.shared_a.get(), N, Is);
    encode_tensor_map(maps.shared_dh, s.shared_dh.get(), N, 2 * Is);
  }

  // Rank r's slice of its owner's exposed block, as GPU s addresses it: its own ranks through the same
  // address as its global views (the window's peer mapping is another address of the same bytes, and
  // a launch that wrote through one must not read through the other).
  RankBuffers rank_buffers(const GpuState& s, int r) const {
    uint8_t* base = owner(r) == index_of(s) ? s.exposed : s.peer_exposed[owner(r)];
    const size_t T = c.tokens_per_rank, H = c.hidden, k = c.top_k, E = c.experts;
    return RankBuffers{
        at_offset<bf16>(base, exposed.x) + r * T * H,           at_offset<bf16>(base, exposed.dy) + r * T * H,
        at_offset<int32_t>(base, exposed.topk_idx) + r * T * k, at_offset<float>(base, exposed.topk_w) + r * T * k,
        at_offset<bf16>(base, exposed.slots) + r * T * k * H,   at_offset<float>(base, exposed.d_topk_w) + r * T * k,
        at_offset<float>(base, exposed.d_logits) + r * T * E};
  }

  Params params(const GpuState& s) const {
    Params p{};
    p.c = c;
    p.ring_rows = launch.ring_rows;
    p.router = router;
    p.rank_begin = s.rank_begin, p.rank_end = s.rank_end;
    for (int r = 0; r < c.ranks; ++r) p.rank[r] = rank_buffers(s, r);
    p.barrier = GridBarrier{s.barrier_words.get(), s.barrier_words.get() + 1, s.error.get(),
                            (long long)(launch.watchdog_seconds * 1e9),
                            PhaseClock{s.clock_ns.get(), s.clock_phase.get(), s.clock_count.get()}};
    p.peers.gpus = launch.gpus, p.peers.me = index_of(s);
    for (int j = 0; j < launch.gpus; ++j) p.peers.flags[j] = at_offset<unsigned int>(s.peer_exposed[j], exposed.flags);
    p.peers.epoch = launches * 16;  // a launch passes fewer than 16 barriers across GPUs
    p.peers.count = s.peer_barriers.get();
    p.maps = s.maps;
    p.router_w = s.router_w.get();
    p.expert_bias = s.expert_bias.size() ? s.expert_bias.get() : nullptr;
    p.w1 = s.w1.get(), p.w2 = s.w2.get(), p.w1t = s.w1t.get(), p.w2t = s.w2t.get();
    p.shared_w1 = s.shared_w1.get(), p.shared_w2 = s.shared_w2.get();
    p.shared_w1t = s.shared_w1t.get(), p.shared_w2t = s.shared_w2t.get();
    p.x = s.x.get(), p.dy = s.dy.get();
    p.logits = s.logits.get(), p.topk_idx = s.topk_idx.get(), p.topk_w = s.topk_w.get();
    p.chunk_counts = s.chunk_counts.get(), p.chunk_base = s.chunk_base.get(), p.offsets = s.offsets.get();
    p.tile_offsets = s.tile_offsets.get(), p.row_source = s.row_source.get(), p.slot_row = s.slot_row.get();
    p.ring = s.ring.get();
    p.h = s.h.get(), p.a = s.a.get(), p.g = s.g.get(), p.dh = s.dh.get(), p.dye = s.dye.get(), p.xe = s.xe.get();
    p.shared_h = s.shared_h.get(), p.shared_a = s.shared_a.get(), p.shared_y = s.shared_y.get();
    p.shared_dh = s.shared_dh.get();
    p.y = s.y.get(), p.dx = s.dx.get(), p.d_logits = s.d_logits.get(), p.d_router = s.d_router.get();
    p.d_w1 = s.d_w1.get(), p.d_w2 = s.d_w2.get(), p.d_shared_w1 = s.d_shared_w1.get();
    p.d_shared_w2 = s.d_shared_w2.get();
    return p;
  }

  // One launch on every GPU at once (they meet at the barriers across GPUs), then each one's verdict.
  void run(const void* kernel, const char* direction) {
    ++launches;
    if (gpus.size() > 1)
      for (GpuState& s : gpus) {  // every upload and poison has landed before any GPU writes to a peer
        s.use();
        MOK_CUDA_CHECK(cudaDeviceSynchronize());
      }
    size_t launched = 0;
    try {
      for (GpuState& s : gpus) {
        s.use();
        s.barrier_words.zero();
        s.peer_barriers.zero();
        s.error.zero();
        s.clock_count.zero();
        Params p = params(s);
        void* args[] = {&p};
        MOK_CUDA_CHECK(cudaLaunchCooperativeKernel(kernel, dim3(s.blocks), dim3(kThreads), args, kSmemBytes, nullptr));
        ++launched;
      }
    } catch (...) {  // the GPUs already running wait for this one until their watchdogs end them
      for (size_t g = 0; g < launched; ++g) cudaSetDevice(gpus[g].device), cudaDeviceSynchronize();
      throw;
    }
    std::vector<KernelError> errors;
    for (GpuState& s : gpus) {
      s.use();
      MOK_CUDA_CHECK(cudaDeviceSynchronize());
      errors.push_back(s.error.download()[0]);
    }
    // The cause first: a GPU that stopped on an error leaves the others waiting for it.
    for (int code : {kLogitOverflow, kPipelineTimeout, kBarrierTimeout, kPeerTimeout})
      for (size_t i = 0; i < errors.size(); ++i)
        if (errors[i].code == code) report(direction, int(i), errors[i]);
  }

  [[noreturn]] void report(const char* direction, int gpu, const KernelError& e) const {
    const std::string where = launch.gpus > 1 ? " on GPU " + std::to_string(gpu) : "";
    if (e.code == kLogitOverflow)
      throw Error("mok: invalid input: router logit of token " + std::to_string(e.detail) + " overflows");
    if (e.code == kPipelineTimeout)
      throw Error(watchdog_report(direction, e,
                                  where + " waited more than " + seconds() + " s for its operand pipeline in phase '" +
                                      phase_name(e.phase) + "'"));
    if (e.code == kBarrierTimeout)
      throw Error(watchdog_report(direction, e,
                                  where + " waited more than " + seconds() + " s at the grid barrier after phase '" +
                                      phase_name(e.phase) + "', ring cycle " + std::to_string(e.cycle)));
    throw Error(std::string("mok: watchdog: the ") + direction + " kernel on GPU " + std::to_string(gpu) +
                " waited more than " + seconds() + " s for GPU " + std::to_string(e.detail) +
                " at the barrier across GPUs after phase '" + phase_name(e.phase) + "'");
  }

  std::string seconds() const { return std::to_string(launch.watchdog_seconds); }

  // "mok: watchdog: the <direction> kernel's block <b>" + what.
  static std::string watchdog_report(const char* direction, const KernelError& e, const std::string& what) {
    return std::string("mok: watchdog: the ") + direction + " kernel's block " + std::to_string(e.detail) + what;
  }

  // Every GPU's own rows of a per-rank buffer (`per_rank` elements per rank), assembled in rank order.
  template <class T, class Field>
  std::vector<T> owned(Field field, size_t per_rank) const {
    std::vector<T> out;
    for (const GpuState& s : gpus) {
      s.use();
      const std::vector<T> part = (s.*field).download(s.rank_begin * per_rank, ranks_per_gpu() * per_rank);
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  }

  // host's rows of each GPU's ranks into that GPU's buffer (`per_rank` elements per rank).
  template <class T, class Field>
  void upload_owned(Field field, const std::vector<T>& host, size_t per_rank) {
    for (GpuState& s : gpus) {
      s.use();
      (s.*field).upload(host.data() + s.rank_begin * per_rank, s.rank_begin * per_rank, ranks_per_gpu() * per_rank);
    }
  }

  // The [N k, width] layout-row view of a padded per-row buffer; expert e's rows from its owner.
  template <class Field>
  std::vector<bf16> compact_rows(Field field, long width, const DispatchLayout& l,
                                 const std::vector<int32_t>& tile_offsets) const {
    const int E = c.experts;
    std::vector<bf16> out(sz(l.offsets[E], width));
    for (const GpuState& s : gpus) {
      s.use();
      for (int e = s.rank_begin * c.experts_per_rank(); e < s.rank_end * c.experts_per_rank(); ++e) {
        const std::vector<bf16> rows =
            (s.*field).download(sz(long(kTileRows) * tile_offsets[e], width), sz(l.counts[e], width));
        std::copy(rows.begin(), rows.end(), out.begin() + sz(l.offsets[e], width));
      }
    }
    return out;
  }

  void poison_forward(GpuState& s) {
    s.logits.poison();
    for (auto* buf : {&s.offsets, &s.tile_offsets, &s.row_source, &s.slot_row}) buf->poison();
    for (auto* buf : {&s.xe, &s.h, &s.a, &s.shared_h, &s.shared_a, &s.shared_y, &s.y}) buf->poison();
    s.slots.poison();
  }

  void poison_backward(GpuState& s) {
    for (auto* buf : {&s.g, &s.d_router, &s.d_w1, &s.d_w2, &s.d_shared_w1, &s.d_shared_w2}) buf->poison();
    for (auto* buf : {&s.dh, &s.dye, &s.shared_dh, &s.shared_y, &s.dx}) buf->poison();
    s.d_topk_w.poison();
    s.d_logits.poison();
    s.slots.poison();
  }
};

Megakernel::Megakernel(const LayerConfig& c, const LayerWeights& w, const LaunchConfig& launch)
    : impl_(std::make_unique<Impl>()) {
  const KeepCurrentDevice keep;
  validate(c);
  validate_weights(c, w);
  require(c.ranks <= kMaxRanks, "ranks R = " + std::to_string(c.ranks) + " exceeds " + std::to_string(kMaxRanks));
  static_assert(kRingRowGranularity == kTileRows);
  validate_ring_rows(launch.ring_rows, kTileRows);
  require(launch.watchdog_seconds > 0, "watchdog_seconds must be positive");
  require(launch.gpus >= 1 && launch.gpus <= kMaxGpus,
          "gpus = " + std::to_string(launch.gpus) + " is outside [1, " + std::to_string(kMaxGpus) + "]");
  require(c.ranks % launch.gpus == 0,
          "ranks R = " + std::to_string(c.ranks) + " is not a multiple of gpus = " + std::to_string(launch.gpus));
  require(launch.gpus == 1 || launch.transport == Transport::nccl, "gpus > 1 needs the nccl transport");
  require(device_available(), "no CUDA device of compute capability 9.0 (Hopper) is available");
  require(launch.gpus <= hopper_gpus(), "gpus = " + std::to_string(launch.gpus) + " but only " +
                                            std::to_string(hopper_gpus()) + " Hopper GPU(s) are usable");
  Impl& m = *impl_;
  m.c = c;
  m.launch = launch;
  m.exposed = exposed_layout(c);
  if (launch.transport == Transport::nccl) m.peers = std::make_unique<PeerGroup>(launch.gpus, m.exposed.bytes);
  m.gpus.resize(launch.gpus);
  for (int d = 0; d < launch.gpus; ++d) {
    GpuState& s = m.gpus[d];
    s.device = d;
    s.rank_begin = d * m.ranks_per_gpu(), s.rank_end = s.rank_begin + m.ranks_per_gpu();
    s.use();
    s.blocks = resident_blocks(launch.blocks);
    m.allocate(s, w);
    if (m.peers) {
      m.expose(s, m.peers->local(d));
      s.peer_exposed = m.peers->peers(d);
    } else {
      s.exposed_memory = DeviceArray<uint8_t>(m.exposed.bytes);
      m.expose(s, s.exposed_memory.get());
      s.peer_exposed = {s.exposed_memory.get()};
    }
    m.make_tensor_maps(s);
    MOK_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

Megakernel::~Megakernel() = default;  // ~Impl keeps the caller's device

int Megakernel::blocks() const { return impl_->gpus[0].blocks; }

std::vector<PhaseTime> Megakernel::phase_times() const {
  const KeepCurrentDevice keep;
  const GpuState& s = impl_->gpus[0];
  s.use();
  const int count = std::min(s.clock_count.download()[0], kClockEntries);
  const std::vector<long long> ns = s.clock_ns.download();
  const std::vector<int> phase = s.clock_phase.download();
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
  const KeepCurrentDevice keep;
  Impl& m = *impl_;
  validate_tokens(m.c, x, "x [N, H]");
  if (given) validate_routing(m.c, *given);
  m.router = given == nullptr;
  m.has_forward = false;
  const size_t T = m.c.tokens_per_rank;
  m.upload_owned(&GpuState::x, x, T * m.c.hidden);
  for (GpuState& s : m.gpus) {
    s.use();
    if (given) {  // every GPU's layout reads every token's top-k
      s.topk_idx.upload(given->topk_idx);
      s.topk_w.upload(given->topk_w);
    } else {
      s.topk_idx.poison();
      s.topk_w.poison();
    }
    m.poison_forward(s);
  }
}

void Megakernel::launch_forward() {
  const KeepCurrentDevice keep;
  impl_->run(reinterpret_cast<const void*>(forward_kernel), "forward");
  impl_->has_forward = true;
}

Forward Megakernel::read_forward() const {
  const KeepCurrentDevice keep;
  const Impl& m = *impl_;
  require(m.has_forward, "no forward has run");
  const size_t T = m.c.tokens_per_rank, k = m.c.top_k, E = m.c.experts;
  Forward f;
  f.routing = Routing{m.owned<int32_t>(&GpuState::topk_idx, T * k), m.owned<float>(&GpuState::topk_w, T * k)};
  if (m.router) f.logits = m.owned<float>(&GpuState::logits, T * E);
  // Every GPU computed the whole dispatch layout; they must agree (D2).
  std::vector<int32_t> tile_offsets;
  for (const GpuState& s : m.gpus) {
    s.use();
    DispatchLayout l;
    l.offsets = s.offsets.download();
    l.row_source = s.row_source.download();
    l.slot_row = s.slot_row.download();
    const std::vector<int32_t> tiles = s.tile_offsets.download();
    if (&s == &m.gpus[0]) {
      f.layout = std::move(l);
      tile_offsets = tiles;
      continue;
    }
    require(l.offsets == f.layout.offsets && l.row_source == f.layout.row_source && l.slot_row == f.layout.slot_row &&
                tiles == tile_offsets,
            "mok: GPU " + std::to_string(s.device) + " computed another dispatch layout than GPU 0");
  }
  f.layout.counts.resize(E);
  for (size_t e = 0; e < E; ++e) f.layout.counts[e] = f.layout.offsets[e + 1] - f.layout.offsets[e];
  f.y = m.owned<bf16>(&GpuState::y, T * m.c.hidden);
  f.h = m.compact_rows(&GpuState::h, 2L * m.c.intermediate, f.layout, tile_offsets);
  f.a = m.compact_rows(&GpuState::a, m.c.intermediate, f.layout, tile_offsets);
  m.gpus[0].use();  // every GPU ran the shared expert on every token
  f.shared_h = m.gpus[0].shared_h.download();
  f.shared_a = m.gpus[0].shared_a.download();
  return f;
}

void Megakernel::set_output_grad(const std::vector<bf16>& dy) {
  const KeepCurrentDevice keep;
  Impl& m = *impl_;
  require(m.has_forward, "backward before any forward");
  validate_tokens(m.c, dy, "dy [N, H]");
  m.upload_owned(&GpuState::dy, dy, size_t(m.c.tokens_per_rank) * m.c.hidden);
  for (GpuState& s : m.gpus) {
    s.use();
    m.poison_backward(s);
  }
}

void Megakernel::launch_backward() {
  const KeepCurrentDevice keep;
  impl_->run(reinterpret_cast<const void*>(backward_kernel), "backward");
}

Gradients Megakernel::read_gradients() const {
  const KeepCurrentDevice keep;
  const Impl& m = *impl_;
  const size_t T = m.c.tokens_per_rank, k = m.c.top_k, E = m.c.experts, Epr = m.c.experts_per_rank();
  const size_t H = m.c.hidden, I = m.c.intermediate;
  Gradients gr;
  gr.dx = m.owned<bf16>(&GpuState::dx, T * H);
  gr.d_topk_w = m.owned<float>(&GpuState::d_topk_w, T * k);
  if (m.router) {
    gr.d_logits = m.owned<float>(&GpuState::d_logits, T * E);
    gr.d_router = m.owned<float>(&GpuState::d_router, Epr * H);
  }
  gr.d_w1 = m.owned<float>(&GpuState::d_w1, Epr * 2 * I * H);
  gr.d_w2 = m.owned<float>(&GpuState::d_w2, Epr * H * I);
  m.gpus[0].use();  // every GPU computed the shared expert's gradients from every token
  gr.d_shared_w1 = m.gpus[0].d_shared_w1.download();
  gr.d_shared_w2 = m.gpus[0].d_shared_w2.download();
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
