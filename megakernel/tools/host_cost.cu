// mok-host-cost: the host time of one Layer::forward call (issue 15: the op's cost per call), beside
// what CUDA itself charges for the launches such a call makes, in one process: an empty kernel, an
// empty cooperative kernel on every SM, and a 12-byte cudaMemsetAsync. Each call starts from an idle
// stream (synchronised before, timed alone), as bench/op_bench.py's host enqueue; median of --calls.
// The problem is op_bench.py's small one (H 2048, I 1024, E 64, k 8, T 256, a given routing).
//   mok-host-cost [--calls N]
// Exit: 0, 2 bad arguments or an error, 77 no Hopper GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mok/core/tool_exit.h"
#include "mok/megakernel/check.h"
#include "mok/megakernel/layer_tensors.h"
#include "mok/reference/problem.h"
#include "mok/tools/cli_args.h"

namespace {

using namespace mok;
using namespace mok::gpu;

constexpr int kMaxCalls = 1000000;

__global__ void empty_kernel() {}

// Median host microseconds of call(), each from an idle stream.
template <class F>
double median_us(int calls, cudaStream_t stream, F call) {
  std::vector<double> us(calls);
  for (double& t : us) {
    MOK_CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto start = std::chrono::steady_clock::now();
    call();
    t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  }
  MOK_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::sort(us.begin(), us.end());
  return us[calls / 2];
}

int run(int calls) {
  LayerConfig c;
  c.ranks = 1, c.tokens_per_rank = 256, c.hidden = 2048, c.intermediate = 1024, c.experts = 64, c.top_k = 8;
  const ref::Problem p = ref::make_problem(c, 7, ref::RoutingKind::uniform);
  Layer layer(c, {});
  const WeightTensors weights(c, p.weights, 0, 1);
  ForwardTensors fwd(c, layer.saved_bytes(), 1);
  fwd.x.upload(p.x);
  fwd.topk_idx.upload(p.routing->topk_idx);
  fwd.topk_w.upload(p.routing->topk_w);
  const DeviceTensor workspace(DType::u8, {int64_t(layer.workspace_bytes(Pass::forward))});
  const ForwardInputs in{fwd.x.view(), weights.views(), RoutingMode::given};
  const ForwardOutputs out = fwd.views(RoutingMode::given);
  cudaStream_t stream;
  MOK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int sms = 0, device = 0;
  MOK_CUDA_CHECK(cudaGetDevice(&device));
  MOK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  for (int i = 0; i < 20; ++i) layer.forward(stream, workspace.view(), in, out);  // warm the map cache
  const double forward = median_us(calls, stream, [&] { layer.forward(stream, workspace.view(), in, out); });
  const double plain = median_us(calls, stream, [&] {
    empty_kernel<<<1, 1, 0, stream>>>();
    MOK_CUDA_CHECK(cudaGetLastError());
  });
  const double cooperative = median_us(calls, stream, [&] {
    MOK_CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(empty_kernel), dim3(sms), dim3(128),
                                               static_cast<void**>(nullptr), 0, stream));
  });
  const double memset =
      median_us(calls, stream, [&] { MOK_CUDA_CHECK(cudaMemsetAsync(fwd.y.view().data, 0, 12, stream)); });
  layer.check();
  MOK_CUDA_CHECK(cudaStreamDestroy(stream));
  std::printf("host time per call (H %d, I %d, E %d, k %d, T %d; medians of %d, from an idle stream):\n", c.hidden,
              c.intermediate, c.experts, c.top_k, c.tokens_per_rank, calls);
  std::printf("  Layer::forward          %7.1f us\n", forward);
  std::printf("  empty kernel            %7.1f us\n", plain);
  std::printf("  empty cooperative (%3d) %7.1f us\n", sms, cooperative);
  std::printf("  cudaMemsetAsync 12 B    %7.1f us\n", memset);
  return 0;
}

}  // namespace

constexpr const char* kUsage = "usage: mok-host-cost [--calls N]   (1 <= N <= 1000000, default 200)\n";
static_assert(kMaxCalls == 1000000, "kUsage names it");

int tool_main(int argc, char** argv) {
  if (mok::printed_help(argc, argv, kUsage)) return 0;
  int calls = 200;
  mok::tools::OptionReader reader("mok-host-cost");  // --calls given twice: the second won silently
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (!reader.first(arg)) return 2;
    // Strictly: atoi took "2x" for 2 and "4294967297" for 1; a million calls at most (a median's buffer of
    // 2^31 - 1 took 16 GiB).
    if (arg == "--calls" && i + 1 < argc) {
      const std::string value = argv[++i];
      if (parse_whole_number(value, calls) && calls >= 1 && calls <= kMaxCalls) continue;
      std::fprintf(stderr, "mok-host-cost: --calls needs a whole number in [1, %d], got %s\n", kMaxCalls,
                   quote_input(value).c_str());
    }
    std::fputs(kUsage, stderr);
    return 2;
  }
  if (!device_available()) {
    std::fprintf(stderr, "mok-host-cost: no Hopper GPU\n");
    return 77;
  }
  try {
    return run(calls);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}

// A report lost to a full disk or a closed pipe is no success.
int main(int argc, char** argv) { return mok::tool_exit_status("mok-host-cost", tool_main(argc, argv)); }
