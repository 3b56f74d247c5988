#include "bench_ranks.h"

#include <nccl.h>

#include <cstdio>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mok/megakernel/device_tensor.h"
#include "mok/megakernel/nccl.h"
#include "mok/tools/process_ranks.h"
#include "mok/tools/rank_layer.h"

namespace mok::bench {
namespace {

constexpr const char* kTool = "mok-bench";
constexpr double kMiB = 1 << 20, kGiB = 1 << 30;

// What a rank measured (its result file).
struct RankBench {
  Times fwd, bwd;
  double peak_tflops = 0;
  uint64_t used_after_init = 0, used_after_runs = 0;  // device memory in use (cudaMemGetInfo)
  tools::TensorBytes tensors;
  uint64_t window = 0;  // the Layer's NCCL window (gpu::layer_memory)
};

// One measurement's problem and settings, made in the parent before the fork (the ranks inherit it).
struct Job {
  LayerConfig config;
  gpu::LaunchConfig launch;
  ref::Problem problem;
  std::vector<Inputs> inputs;
  std::vector<bf16> peak_matrix;  // the peak measurement's (made with OpenMP: here, not in the ranks)
  int warmup = 0, runs = 1;
};

// The ranks of one measurement and what the parent computes from the whole routing.
struct Measured {
  LayerConfig config;
  std::vector<RankBench> ranks;
  LinkBytes link;
};

// The ranks' events of timed launch i start when every rank has reached it: a one-element all-reduce
// (of a word whose value does not matter) on the stream just before each start event, so that no rank
// times its wait for a slower peer's uploads at the first barrier across GPUs.
class Aligner {
 public:
  Aligner(ncclComm_t comm, cudaStream_t stream) : comm_(comm), stream_(stream), word_(gpu::DType::f32, {1}) {}
  void operator()() const {
    MOK_NCCL_CHECK(ncclAllReduce(word_.view().data, word_.view().data, 1, ncclFloat, ncclSum, comm_, stream_));
  }

 private:
  ncclComm_t comm_;
  cudaStream_t stream_;
  gpu::DeviceTensor word_;
};

// Forward, then backward timed (each backward after an untimed forward of the same input set).
void time_calls(const Job& job, gpu::Layer& layer, tools::RankTensors& t, cudaStream_t stream, const Aligner& align,
                RankBench& b) {
  const int sets = int(job.inputs.size());
  const auto set_input = [&](int i) {
    MOK_CUDA_CHECK(cudaStreamSynchronize(stream));  // the last call has read the inputs it is given
    const Inputs& in = job.inputs[(i % sets + sets) % sets];
    t.set_inputs(in.x, in.dy, in.given(), RoutingMode::given);
  };
  b.fwd = time_launches(stream, job.warmup, job.runs, set_input, align, [&] { t.forward(layer, stream); });
  layer.check();
  const auto prepare_backward = [&](int i) {
    set_input(i);
    t.forward(layer, stream);
    MOK_CUDA_CHECK(cudaStreamSynchronize(stream));
  };
  b.bwd = time_launches(stream, job.warmup, job.runs, prepare_backward, align, [&] { t.backward(layer, stream); });
  layer.check();
}

// An error leaves without the collective teardowns (mok/tools/process_ranks.h).
void run_rank(const Job& job, const tools::Rank& rank) {
  const tools::RankComm comm(rank);
  RankBench b;
  b.used_after_init = tools::device_memory_in_use();
  b.peak_tflops = matmul_peak_tflops(job.peak_matrix, 3, 10);
  const tools::Stream stream;
  tools::Collective<gpu::Layer> layer(job.config, job.launch, comm.get());
  {
    tools::RankTensors t(*layer, job.problem.weights, job.launch, rank.index);
    const Aligner align(comm.get(), stream.get());
    time_calls(job, *layer, t, stream.get(), align, b);
    b.used_after_runs = tools::device_memory_in_use();
    b.tensors = t.bytes();
  }
  layer.reset();  // before the communicator, after its last call finished (check())
  b.window = gpu::layer_memory(job.config, gpu::on_communicator(job.launch, job.launch.gpus)).window;
  tools::ResultWriter file(rank.result);
  file.put(b);
  file.commit();
}

// One rank per GPU of T tokens, each GPU's Layer on the communicator, checked (the launch was checked only
// in the ranks, each failing alike: exit 1); a refusal named with the shape and G.
std::pair<LayerConfig, gpu::LaunchConfig> checked_job(const Shape& s, int gpus, const Options& o,
                                                      gpu::LaunchConfig launch) {
  const LayerConfig c = config_of(s, gpus, o);
  launch.gpus = gpus;
  launch.transport = gpu::Transport::nccl;
  try {
    launch = checked_launch(c, gpus, o, launch);  // the launch each rank's Layer makes on the communicator
  } catch (const Error& e) {
    throw Error(std::string(kTool) + ": " + s.name + " over " + std::to_string(gpus) +
                " GPU(s), one rank each: " + e.what());
  }
  return {c, launch};
}

// One shape on `gpus` processes; nothing when a rank failed (named on stderr).
std::optional<Measured> measure(const Shape& s, int gpus, const Options& o, ref::RoutingKind kind,
                                const gpu::LaunchConfig& base) {
  Job job;
  std::tie(job.config, job.launch) = checked_job(s, gpus, o, base);
  job.warmup = o.warmup, job.runs = o.runs;
  std::fprintf(stderr, "%s on %d GPU(s): generating inputs...\n", s.name, gpus);
  job.problem = ref::make_problem(job.config, 2026, kind);
  job.inputs = input_sets(job.problem, o.sets);
  job.peak_matrix = peak_matrix();
  std::fprintf(stderr, "%s on %d GPU(s): timing, one process per GPU...\n", s.name, gpus);
  const tools::TempDir dir(kTool);
  if (!tools::run_ranks(kTool, gpus, o.timeout_s, dir.path(), [&](const tools::Rank& r) { run_rank(job, r); }))
    return std::nullopt;
  Measured m{job.config, {}, link_bytes(job.config, job.problem.routing->topk_idx)};
  for (int g = 0; g < gpus; ++g) {
    tools::ResultReader file(tools::result_path(dir.path(), g));
    file.get(m.ranks.emplace_back());
  }
  return m;
}

// The slowest rank's median of a call.
double slowest(const Measured& m, Times RankBench::*call) {
  size_t worst = 0;
  for (size_t g = 1; g < m.ranks.size(); ++g)
    if ((m.ranks[g].*call).median_ms > (m.ranks[worst].*call).median_ms) worst = g;
  return (m.ranks[worst].*call).median_ms;
}

double step_ms(const Measured& m) { return slowest(m, &RankBench::fwd) + slowest(m, &RankBench::bwd); }

void print_header() {
  std::printf("%-15s %-8s %2s %6s %8s %8s %10s %9s %8s %9s %9s %9s %9s %8s %9s\n", "shape", "routing", "G", "T/GPU",
              "fwd ms", "bwd ms", "fwd+bwd ms", "f+b TF/s", "f+b %pk", "fwd MB", "bwd MB", "fwd GB/s", "bwd GB/s",
              "GiB/GPU", "scaling");
}

// One line for the measurement (the slowest rank's medians), then one per rank.
void print(const Shape& s, const Options& o, const Measured& m, const std::optional<Measured>& one_gpu) {
  const LayerConfig& c = m.config;
  const int G = c.ranks;
  double peak = m.ranks[0].peak_tflops;
  uint64_t memory = 0;
  for (const RankBench& r : m.ranks) peak = std::min(peak, r.peak_tflops), memory = std::max(memory, r.used_after_runs);
  const double fwd = slowest(m, &RankBench::fwd), bwd = slowest(m, &RankBench::bwd), step = fwd + bwd;
  const double tf = 3 * forward_flops(c) / (step * 1e9);
  std::printf("%-15s %-8s %2d %6d %8.2f %8.2f %10.2f %9.1f %7.1f%% %9.1f %9.1f %9.1f %9.1f %8.1f", s.name,
              o.routing.c_str(), G, c.tokens_per_rank, fwd, bwd, step, tf, 100 * tf / (G * peak), m.link.forward / 1e6,
              m.link.backward / 1e6, m.link.forward / (fwd * 1e6), m.link.backward / (bwd * 1e6), memory / kGiB);
  if (one_gpu) {  // per-token rates: N / step on G GPUs against T / step on one
    const double speedup = double(c.tokens()) / step / (double(one_gpu->config.tokens()) / step_ms(*one_gpu));
    std::printf("  %.2fx (%.0f%%)", speedup, 100 * speedup / G);
  }
  std::printf("\n");
  for (size_t g = 0; g < m.ranks.size(); ++g) {
    const RankBench& r = m.ranks[g];
    const tools::TensorBytes& t = r.tensors;
    std::printf(
        "  rank %zu: fwd %.2f ms (min %.2f), bwd %.2f ms (min %.2f); bf16 peak %.0f TFLOP/s; device memory in "
        "use %.0f MiB (%.0f after NCCL init; with the 256 MiB L2 scrub buffer); weights+grads %.0f, activations "
        "%.0f, saved %.0f, workspace %.0f, window %.0f MiB\n",
        g, r.fwd.median_ms, r.fwd.min_ms, r.bwd.median_ms, r.bwd.min_ms, r.peak_tflops, r.used_after_runs / kMiB,
        r.used_after_init / kMiB, t.weights / kMiB, t.activations / kMiB, t.saved / kMiB, t.workspace / kMiB,
        r.window / kMiB);
  }
  std::fflush(stdout);
}

}  // namespace

int bench_over_processes(const Options& o, ref::RoutingKind kind, const gpu::LaunchConfig& base) {
  const std::vector<Shape> shapes = selected_shapes(o.shape);
  for (const Shape& s : shapes) checked_job(s, o.gpus, o, base);  // before any GPU is looked for
  if (!tools::have_gpus_for(o.gpus)) {
    std::fprintf(stderr, "%s: no Hopper GPU\n", kTool);
    return tools::kExitSkip;
  }
  std::printf(
      "%s: one process per GPU, one rank each (NCCL communicator); ms: the slowest rank's median of %d runs; "
      "%%pk of G x the lowest rank's bf16 matmul peak; MB: bytes of rows crossing between GPUs per step; "
      "GiB/GPU: the most device memory in use on a GPU; scaling: per-token rate against one GPU\n",
      kTool, o.runs);
  print_header();
  for (const Shape& s : shapes) {
    std::optional<Measured> one_gpu;
    if (o.gpus > 1) {
      one_gpu = measure(s, 1, o, kind, base);
      if (!one_gpu) return tools::kExitFail;
      print(s, o, *one_gpu, std::nullopt);
    }
    const std::optional<Measured> m = measure(s, o.gpus, o, kind, base);
    if (!m) return tools::kExitFail;
    print(s, o, *m, one_gpu);
  }
  return tools::kExitPass;
}

}  // namespace mok::bench
