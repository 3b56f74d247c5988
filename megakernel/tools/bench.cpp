// mok-bench: times the persistent forward and backward kernels on the shapes of DESIGN.md §6 and,
// in the same process, the device's bf16 matrix-product rate (cuBLAS, 8192^3) as the peak to
// compare against. Median of --runs timed launches after --warmup; CUDA events around each.
//   mok-bench [--shape NAME|all] [--routing uniform|zipf] [--runs N] [--warmup N] [--tokens T]
//             [--ring-rows R]   (default 16384: one GPU's ring large enough to keep every SM busy)
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "mok/megakernel/check.h"
#include "mok/megakernel/megakernel.h"
#include "mok/reference/problem.h"

namespace {

struct Shape {
  const char* name;
  int H, I, E, k, T;
};

constexpr Shape kShapes[] = {
    {"kimi-k2", 7168, 2048, 32, 8, 8192},        {"glm-5", 6144, 2048, 32, 8, 8192},
    {"qwen3.5-397b", 4096, 1024, 64, 10, 8192},  {"deepseek-v4", 7168, 3072, 32, 6, 8192},
    {"qwen3-30b-a3b", 2048, 768, 128, 8, 16384}, {"olmoe", 2048, 1024, 64, 8, 8192},
};

template <class F>
double median_ms(int warmup, int runs, F launch) {
  cudaEvent_t start, stop;
  MOK_CUDA_CHECK(cudaEventCreate(&start));
  MOK_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) launch();
  std::vector<float> ms(runs);
  for (float& t : ms) {
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
  const double ms = median_ms(warmup, runs, [&] {
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

}  // namespace

int main(int argc, char** argv) {
  std::string only = "all", routing = "uniform";
  int runs = 5, warmup = 1, tokens = 0, ring_rows = 16384;
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
    else {
      std::fprintf(stderr,
                   "usage: mok-bench [--shape NAME|all] [--routing uniform|zipf] [--runs N] [--warmup N] "
                   "[--tokens T] [--ring-rows R]\n");
      return 2;
    }
  }
  try {
    if (!mok::gpu::device_available()) {
      std::fprintf(stderr, "mok-bench: no Hopper GPU\n");
      return 2;
    }
    if (runs < 1 || warmup < 0) throw mok::Error("mok-bench: --runs must be >= 1 and --warmup >= 0");
    const auto kind = mok::ref::routing_kind_from_string(routing);
    const double peak = matmul_peak_tflops(3, 10);
    std::printf("bf16 matmul peak (cuBLAS 8192^3, random data): %.0f TFLOP/s\n", peak);
    std::printf("%-15s %-8s %10s %10s %9s %9s %8s %8s\n", "shape", "routing", "fwd ms", "bwd ms", "fwd TF/s",
                "bwd TF/s", "fwd %pk", "bwd %pk");
    bool matched = false;
    for (const Shape& s : kShapes) {
      if (only != "all" && only != s.name) continue;
      matched = true;
      mok::LayerConfig c;
      c.tokens_per_rank = tokens ? tokens : s.T;
      c.hidden = s.H, c.intermediate = s.I, c.experts = s.E, c.top_k = s.k;
      std::fprintf(stderr, "%s: generating inputs...\n", s.name);
      const mok::ref::Problem p = mok::ref::make_problem(c, 2026, kind);
      mok::gpu::LaunchConfig launch;
      launch.ring_rows = ring_rows;
      mok::gpu::Megakernel mk(c, p.weights, launch);
      mk.set_input(p.x, &*p.routing);
      const double fwd = median_ms(warmup, runs, [&] { mk.launch_forward(); });
      mk.set_output_grad(p.dy);
      const double bwd = median_ms(warmup, runs, [&] { mk.launch_backward(); });
      const double flops = 6.0 * c.tokens() * c.top_k * double(c.hidden) * c.intermediate;
      const double fwd_tf = flops / (fwd * 1e9), bwd_tf = 2 * flops / (bwd * 1e9);
      std::printf("%-15s %-8s %10.2f %10.2f %9.1f %9.1f %7.1f%% %7.1f%%\n", s.name, routing.c_str(), fwd, bwd, fwd_tf,
                  bwd_tf, 100 * fwd_tf / peak, 100 * bwd_tf / peak);
      std::fflush(stdout);
    }
    if (!matched) throw mok::Error("mok-bench: unknown shape '" + only + "'");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
