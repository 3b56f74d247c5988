#include "bench_common.h"

#include <cublas_v2.h>

#include <cmath>

#include "mok/core/saved_layout.h"

namespace mok::bench {
namespace {

constexpr size_t kScrubBytes = size_t(256) << 20;

template <class T>
std::vector<T> rotate_rows(const std::vector<T>& v, long row_size, long shift) {
  std::vector<T> out(v);
  std::rotate(out.begin(), out.begin() + shift * row_size, out.end());
  return out;
}

Inputs rotated(const ref::Problem& p, long shift) {
  const long H = p.config.hidden, k = p.config.top_k;
  Inputs in{rotate_rows(p.x, H, shift), rotate_rows(p.dy, H, shift), std::nullopt};
  if (p.routing)
    in.routing = Routing{rotate_rows(p.routing->topk_idx, k, shift), rotate_rows(p.routing->topk_w, k, shift)};
  return in;
}

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(std::string("mok-bench: cuBLAS failed: ") + what);
}

}  // namespace

std::vector<Shape> selected_shapes(const std::string& name) {
  std::vector<Shape> out;
  for (const Shape& s : kShapes)
    if (name == "all" || name == s.name) out.push_back(s);
  if (out.empty()) throw Error("mok-bench: unknown shape " + quote_input(name));
  return out;
}

LayerConfig config_of(const Shape& s, int ranks, const Options& o) {
  LayerConfig c;
  c.ranks = ranks;
  c.tokens_per_rank = o.tokens ? o.tokens : s.T;
  c.hidden = s.H, c.intermediate = s.I, c.experts = o.experts ? o.experts : s.E, c.top_k = s.k;
  if (o.fp8) c.precision = Precision::fp8;
  return c;
}

long capacity_rows(const LayerConfig& c, int gpus, double factor) {
  if (!(factor > 0)) return 0;
  // Clamped in double before the conversion: a large factor (1e20) converted to long was undefined, and
  // gave capacity_rows = -2^63. N k in double too: R T may pass int32 before validate() refuses it.
  const double rows = std::ceil(factor * (double(c.ranks) * c.tokens_per_rank * c.top_k / gpus));
  const long most = most_own_rows(c, gpus);
  return rows < double(most) ? long(rows) : most;
}

gpu::LaunchConfig checked_launch(const LayerConfig& c, int gpus, const Options& o, gpu::LaunchConfig launch) {
  validate(c);  // before capacity_rows divides by its sizes
  launch.capacity_rows = capacity_rows(c, gpus, o.capacity_factor);
  gpu::check_launch(c, launch);
  gpu::layer_memory(c, launch);  // its sizes' own bounds
  return launch;
}

LinkBytes link_bytes(const LayerConfig& c, const std::vector<int32_t>& topk_idx) {
  long pushed = 0, pulled = 0;  // rows across GPUs: (token, slot) pairs, (token, GPU) pairs
  std::vector<int> last_token(c.ranks, -1);
  for (int g = 0; g < c.tokens(); ++g)
    for (int j = 0; j < c.top_k; ++j) {
      const int r = c.expert_rank(topk_idx[long(g) * c.top_k + j]);
      if (r == g / c.tokens_per_rank) continue;
      ++pushed;
      if (last_token[r] != g) last_token[r] = g, ++pulled;
    }
  const double row_bytes = 2.0 * c.hidden;
  return {row_bytes * double(pulled + pushed), row_bytes * double(2 * pulled + pushed)};
}

double forward_flops(const LayerConfig& c) { return 6.0 * c.tokens() * c.top_k * double(c.hidden) * c.intermediate; }

std::vector<Inputs> input_sets(const ref::Problem& p, int sets) {
  std::vector<Inputs> out;
  for (int i = 0; i < sets; ++i) out.push_back(rotated(p, long(i) * p.config.tokens() / sets));
  return out;
}

void scrub_l2(cudaStream_t stream) {
  static void* buffer = [] {
    void* b = nullptr;
    MOK_CUDA_CHECK(cudaMalloc(&b, kScrubBytes));
    return b;
  }();
  MOK_CUDA_CHECK(cudaMemsetAsync(buffer, 0x5a, kScrubBytes, stream));
}

size_t free_device_bytes() {
  size_t free = 0, total = 0;
  MOK_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

constexpr int kPeakN = 8192;

std::vector<bf16> peak_matrix() {
  ref::Rng rng(1);
  return ref::bf16_symmetric(rng, size_t(kPeakN) * kPeakN, 1.0f);
}

double matmul_peak_tflops(const std::vector<bf16>& host, int warmup, int runs) {
  const int n = kPeakN;
  if (host.size() != size_t(n) * n) fail_internal("matmul_peak_tflops: the matrix is not peak_matrix()'s");
  void *a, *b, *c;
  MOK_CUDA_CHECK(cudaMalloc(&a, host.size() * 2));
  MOK_CUDA_CHECK(cudaMalloc(&b, host.size() * 2));
  MOK_CUDA_CHECK(cudaMalloc(&c, host.size() * 2));
  MOK_CUDA_CHECK(cudaMemcpy(a, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  MOK_CUDA_CHECK(cudaMemcpy(b, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  cublasHandle_t handle;
  check_cublas(cublasCreate(&handle), "create");
  const float one = 1.0f, zero = 0.0f;
  const Times t = time_launches(
      nullptr, warmup, runs, [](int) {}, [] {},
      [&] {
        check_cublas(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n,
                                  &zero, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "gemm");
      });
  check_cublas(cublasDestroy(handle), "destroy");
  MOK_CUDA_CHECK(cudaFree(a));
  MOK_CUDA_CHECK(cudaFree(b));
  MOK_CUDA_CHECK(cudaFree(c));
  return 2.0 * n * n * double(n) / (t.median_ms * 1e9);
}

}  // namespace mok::bench
