// mok-bench: times the persistent forward and backward kernels on the shapes of docs/benchmarks.md and,
// in the same process, the device's bf16 matrix-product rate (cuBLAS, 8192^3) as the peak to
// compare against. Median of --runs timed launches after --warmup; CUDA events around each. Input
// sets (x, dy, routing) are rotated between runs and the L2 cache is scrubbed before each timed
// launch, so no run finds its inputs cached.
//   mok-bench [--shape NAME|all] [--routing uniform|zipf] [--runs N] [--warmup N] [--tokens T]
//             [--ring-rows R] [--sets N] [--gpus G] [--recompute] [--experts E] [--capacity-factor F]
//             [--plan]
//   --ring-rows: the backward's dy ring (default 0: the layer's, an average rank's rows: one cycle);
//   --recompute: the backward recomputes h and a (LaunchConfig::recompute; saved holds neither);
//   --sets: input sets rotated between runs (default 3, as bench/torch_baseline.py);
//   --gpus: G ranks on G GPUs through NCCL windows, T tokens each (the global batch grows with G);
//           the peak fraction is of G times one GPU's peak, and the bytes crossing between GPUs
//           (rows of x, y, dy, dx and the backward's x reads whose rank and expert sit on different
//           GPUs) are reported per second of the step.
//   --experts: E instead of the shape's (its slice of the model's experts);
//   --capacity-factor: LaunchConfig::capacity_rows = F times an average GPU's rows, N k / G (at most
//           N min(k, E/G)); 0 (default): the most any routing can give a GPU;
//   --plan: no GPU needed: the device memory per GPU of one rank per GPU, T tokens each, for G = 1, 2,
//           8 and 64 (those that divide E): the expert weights and bf16 gradients of its E/G experts
//           and the Layer's own buffers (mok::gpu::layer_memory, the sizes a Layer allocates).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "mok/megakernel/check.h"
#include "mok/megakernel/megakernel.h"
#include "mok/reference/problem.h"

namespace {

constexpr size_t kScrubBytes = size_t(256) << 20;

struct Shape {
  const char* name;
  int H, I, E, k, T;
};

// One input set: the problem's tokens rotated by `shift` rows (other bytes, the same routing statistics).
struct Inputs {
  std::vector<mok::bf16> x, dy;
  mok::Routing routing;
};

template <class T>
std::vector<T> rotate_rows(const std::vector<T>& v, long row_size, long shift) {
  std::vector<T> out(v);
  std::rotate(out.begin(), out.begin() + shift * row_size, out.end());
  return out;
}

Inputs rotated(const mok::ref::Problem& p, int shift) {
  const long H = p.config.hidden, k = p.config.top_k;
  return Inputs{rotate_rows(p.x, H, shift), rotate_rows(p.dy, H, shift),
                mok::Routing{rotate_rows(p.routing->topk_idx, k, shift), rotate_rows(p.routing->topk_w, k, shift)}};
}

constexpr Shape kShapes[] = {
    {"kimi-k2", 7168, 2048, 32, 8, 8192},        {"glm-5", 6144, 2048, 32, 8, 8192},
    {"qwen3.5-397b", 4096, 1024, 64, 10, 8192},  {"deepseek-v4", 7168, 3072, 32, 6, 8192},
    {"qwen3-30b-a3b", 2048, 768, 128, 8, 16384}, {"olmoe", 2048, 1024, 64, 8, 8192},
};

// Overwrites more than the L2 cache (50 MB on the H200) so the next launch starts cold.
void scrub_l2() {
  static void* buffer = [] {
    void* b = nullptr;
    MOK_CUDA_CHECK(cudaMalloc(&b, kScrubBytes));
    return b;
  }();
  MOK_CUDA_CHECK(cudaMemsetAsync(buffer, 0x5a, kScrubBytes));
}

// prepare(i) runs untimed before timed launch i (negative i: warm-up).
template <class Prepare, class F>
double median_ms(int warmup, int runs, Prepare prepare, F launch) {
  cudaEvent_t start, stop;
  MOK_CUDA_CHECK(cudaEventCreate(&start));
  MOK_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) {
    prepare(-1 - i);
    launch();
  }
  std::vector<float> ms(runs);
  for (int i = 0; i < runs; ++i) {
    float& t = ms[i];
    prepare(i);
    scrub_l2();
    MOK_CUDA_CHECK(cudaEventRecord(start));
    launch();
    MOK_CUDA_CHECK(cudaEventRecord(stop));
    MOK_CUDA_CHECK(cudaEventSynchronize(stop));
    MOK_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
  }
  MOK_CUDA_CHECK(cudaEventDestroy(start));
  MOK_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[runs / 2];
}

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw mok::Error(std::string("mok-bench: cuBLAS failed: ") + what);
}

// bf16 x bf16 -> fp32-accumulated bf16 product of n x n x n on random data, TFLOP/s.
double matmul_peak_tflops(int warmup, int runs) {
  const int n = 8192;
  mok::ref::Rng rng(1);
  std::vector<mok::bf16> host(size_t(n) * n);
  for (auto& v : host) v = mok::to_bf16(rng.symmetric(1.0f));
  void *a, *b, *c;
  MOK_CUDA_CHECK(cudaMalloc(&a, host.size() * 2));
  MOK_CUDA_CHECK(cudaMalloc(&b, host.size() * 2));
  MOK_CUDA_CHECK(cudaMalloc(&c, host.size() * 2));
  MOK_CUDA_CHECK(cudaMemcpy(a, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  MOK_CUDA_CHECK(cudaMemcpy(b, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  cublasHandle_t handle;
  check_cublas(cublasCreate(&handle), "create");
  const float one = 1.0f, zero = 0.0f;
  const double ms = median_ms(
      warmup, runs, [](int) {},
      [&] {
        check_cublas(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n,
                                  &zero, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "gemm");
      });
  check_cublas(cublasDestroy(handle), "destroy");
  MOK_CUDA_CHECK(cudaFree(a));
  MOK_CUDA_CHECK(cudaFree(b));
  MOK_CUDA_CHECK(cudaFree(c));
  return 2.0 * n * n * double(n) / (ms * 1e9);
}

// (token, slot) rows whose token's rank and expert's rank sit on different GPUs (one rank per GPU).
long rows_between_gpus(const mok::LayerConfig& c, const std::vector<int32_t>& topk_idx) {
  long rows = 0;
  for (long i = 0; i < long(topk_idx.size()); ++i)
    rows += i / c.top_k / c.tokens_per_rank != topk_idx[i] / c.experts_per_rank();
  return rows;
}

mok::LayerConfig config_of(const Shape& s, int ranks, int tokens, int experts) {
  mok::LayerConfig c;
  c.ranks = ranks;
  c.tokens_per_rank = tokens ? tokens : s.T;
  c.hidden = s.H, c.intermediate = s.I, c.experts = experts ? experts : s.E, c.top_k = s.k;
  return c;
}

// The --plan table of one shape (GB = 1e9 bytes).
// F times an average GPU's rows, at most the most a GPU can receive; 0 for F = 0.
long capacity_rows(const mok::LayerConfig& c, int gpus, double factor) {
  return factor > 0 ? std::min(mok::most_own_rows(c, gpus), long(std::ceil(factor * c.tokens() * c.top_k / gpus))) : 0;
}

void print_plan(const Shape& s, int tokens, int experts, double factor, const mok::gpu::LaunchConfig& base) {
  const mok::LayerConfig one = config_of(s, 1, tokens, experts);
  char capacity[64] = "the most rows a GPU can receive";
  if (factor > 0) std::snprintf(capacity, sizeof capacity, "%g x an average GPU's rows", factor);
  std::printf("%s, T = %d tokens per GPU, E = %d, recompute %s, capacity %s (GB per GPU)\n", s.name,
              one.tokens_per_rank, one.experts, base.recompute ? "on" : "off", capacity);
  std::printf("%6s %8s %14s %8s %8s %10s %8s\n", "G", "experts", "weights+grads", "saved", "window", "workspace",
              "total");
  for (const int g : {1, 2, 8, 64}) {
    if (one.experts % g) continue;
    const mok::LayerConfig c = config_of(s, g, tokens, experts);
    mok::gpu::LaunchConfig launch = base;
    launch.gpus = g;
    launch.capacity_rows = capacity_rows(c, g, factor);
    const mok::gpu::LayerMemory m = mok::gpu::layer_memory(c, launch);
    // w1 [2I, H] and w2 [H, I] per expert, bf16, and their bf16 gradients.
    const double weights = double(c.experts / g) * 3.0 * c.intermediate * c.hidden * 2 * 2;
    const double total = weights + double(m.saved) + double(m.window) + double(m.workspace_backward);
    std::printf("%6d %8d %14.1f %8.1f %8.1f %10.1f %8.1f\n", g, c.experts / g, weights / 1e9, m.saved / 1e9,
                m.window / 1e9, m.workspace_backward / 1e9, total / 1e9);
  }
}

void print_phases(const char* direction, const std::vector<mok::gpu::PhaseTime>& phases) {
  std::printf("  %s phases (last launch, block 0, ms):", direction);
  for (const auto& t : phases) std::printf("  %s %.2f;", t.phase.c_str(), t.ms);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string only = "all", routing = "uniform";
  int runs = 20, warmup = 2, tokens = 0, ring_rows = 0, sets = 3, gpus = 1, experts = 0;
  bool recompute = false, plan = false;
  double capacity_factor = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--shape" && has_value)
      only = argv[++i];
    else if (arg == "--routing" && has_value)
      routing = argv[++i];
    else if (arg == "--runs" && has_value)
      runs = std::atoi(argv[++i]);
    else if (arg == "--warmup" && has_value)
      warmup = std::atoi(argv[++i]);
    else if (arg == "--tokens" && has_value)
      tokens = std::atoi(argv[++i]);
    else if (arg == "--ring-rows" && has_value)
      ring_rows = std::atoi(argv[++i]);
    else if (arg == "--recompute")
      recompute = true;
    else if (arg == "--sets" && has_value)
      sets = std::atoi(argv[++i]);
    else if (arg == "--gpus" && has_value)
      gpus = std::atoi(argv[++i]);
    else if (arg == "--experts" && has_value)
      experts = std::atoi(argv[++i]);
    else if (arg == "--capacity-factor" && has_value)
      capacity_factor = std::atof(argv[++i]);
    else if (arg == "--plan")
      plan = true;
    else {
      std::fprintf(stderr,
                   "usage: mok-bench [--shape NAME|all] [--routing uniform|zipf] [--runs N] [--warmup N] "
                   "[--tokens T] [--ring-rows R] [--sets N] [--gpus G] [--recompute] [--experts E] "
                   "[--capacity-factor F] [--plan]\n");
      return 2;
    }
  }
  try {
    if (ring_rows < 0 || tokens < 0 || experts < 0 || sets < 1 || gpus < 1 || !(capacity_factor >= 0))
      throw mok::Error(
          "mok-bench: --sets and --gpus must be >= 1, --ring-rows, --tokens, --experts and --capacity-factor >= 0");
    mok::gpu::LaunchConfig launch;
    launch.ring_rows = ring_rows;
    launch.recompute = recompute;
    if (plan) {
      bool matched = false;
      for (const Shape& s : kShapes)
        if (only == "all" || only == s.name) matched = true, print_plan(s, tokens, experts, capacity_factor, launch);
      if (!matched) throw mok::Error("mok-bench: unknown shape '" + only + "'");
      return 0;
    }
    if (!mok::gpu::device_available()) {
      std::fprintf(stderr, "mok-bench: no Hopper GPU\n");
      return 2;
    }
    if (runs < 1 || warmup < 0) throw mok::Error("mok-bench: --runs must be >= 1 and --warmup >= 0");
    const auto kind = mok::ref::routing_kind_from_string(routing);
    if (kind != mok::ref::RoutingKind::uniform && kind != mok::ref::RoutingKind::zipf)
      throw mok::Error("mok-bench: --routing must be uniform or zipf");
    const double peak = matmul_peak_tflops(3, 10);
    std::printf("bf16 matmul peak (cuBLAS 8192^3, random data): %.0f TFLOP/s\n", peak);
    if (gpus > 1) std::printf("across %d GPUs (NCCL windows): peak fractions of %d x that peak\n", gpus, gpus);
    std::printf("%-15s %-8s %8s %8s %10s %9s %9s %8s %8s%s\n", "shape", "routing", "fwd ms", "bwd ms", "fwd+bwd ms",
                "fwd TF/s", "f+b TF/s", "fwd %pk", "f+b %pk", gpus > 1 ? "  fwd GB/s  bwd GB/s" : "");
    bool matched = false;
    for (const Shape& s : kShapes) {
      if (only != "all" && only != s.name) continue;
      matched = true;
      const mok::LayerConfig c = config_of(s, gpus, tokens, experts);
      std::fprintf(stderr, "%s: generating inputs...\n", s.name);
      const mok::ref::Problem p = mok::ref::make_problem(c, 2026, kind);
      std::vector<Inputs> inputs;
      for (int i = 0; i < sets; ++i) inputs.push_back(rotated(p, int(long(i) * c.tokens() / sets)));
      if (gpus > 1) launch.gpus = gpus, launch.transport = mok::gpu::Transport::nccl;
      launch.capacity_rows = capacity_rows(c, gpus, capacity_factor);
      mok::gpu::Megakernel mk(c, p.weights, launch);
      const auto input = [&](int i) -> const Inputs& { return inputs[(i % sets + sets) % sets]; };
      const auto set_input = [&](int i) { mk.set_input(input(i).x, &input(i).routing); };
      std::fprintf(stderr, "%s: timing the forward...\n", s.name);
      const double fwd = median_ms(warmup, runs, set_input, [&] { mk.launch_forward(); });
      const auto fwd_phases = mk.phase_times();
      std::fprintf(stderr, "%s: timing the backward...\n", s.name);
      const double bwd = median_ms(
          warmup, runs,
          [&](int i) {
            set_input(i);
            mk.launch_forward();
            mk.set_output_grad(input(i).dy);
          },
          [&] { mk.launch_backward(); });
      const double flops = 6.0 * c.tokens() * c.top_k * double(c.hidden) * c.intermediate;
      const double fwd_tf = flops / (fwd * 1e9), fb_tf = 3 * flops / ((fwd + bwd) * 1e9);
      std::printf("%-15s %-8s %8.2f %8.2f %10.2f %9.1f %9.1f %7.1f%% %7.1f%%", s.name, routing.c_str(), fwd, bwd,
                  fwd + bwd, fwd_tf, fb_tf, 100 * fwd_tf / (gpus * peak), 100 * fb_tf / (gpus * peak));
      if (gpus > 1) {
        const double row_bytes = 2.0 * c.hidden * double(rows_between_gpus(c, p.routing->topk_idx));
        std::printf("  %8.1f  %8.1f", 2 * row_bytes / (fwd * 1e6), 3 * row_bytes / (bwd * 1e6));
      }
      std::printf("\n");
      print_phases("forward", fwd_phases);
      print_phases("backward", mk.phase_times());
      std::printf("  layer memory per GPU: saved %.0f MiB, workspace forward %.0f / backward %.0f MiB\n",
                  mk.saved_bytes() / 1048576.0, mk.workspace_bytes(mok::gpu::Pass::forward) / 1048576.0,
                  mk.workspace_bytes(mok::gpu::Pass::backward) / 1048576.0);
      std::fflush(stdout);
    }
    if (!matched) throw mok::Error("mok-bench: unknown shape '" + only + "'");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
