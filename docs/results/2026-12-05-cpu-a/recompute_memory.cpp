// The saved buffer and workspace of one Layer (R = 1, bf16) on the six benchmark shapes with one shared
// expert as wide as a routed one (op_bench's --shared: Is = I), with and without recompute mode, from
// mok::gpu::layer_memory (no GPU needed). "Recompute before" (the shared expert's h and a still saved,
// as until session 41) is computed from today's sizes by moving its S (2 Is + Is) bf16 back. Built on
// the development machine against the build's libraries:
//   g++ -std=c++20 recompute_memory.cpp -I megakernel/include -I core/include -I /usr/local/cuda/include \
//     build-h/megakernel/libmok_megakernel.a -L/usr/local/cuda/lib64 -lcudart -lnccl
#include <cstdio>

#include "mok/core/saved_layout.h"
#include "mok/megakernel/layer.h"
using namespace mok;
int main() {
  struct S {
    const char* n;
    int H, I, E, k, T;
  } shapes[] = {{"kimi-k2", 7168, 2048, 32, 8, 8192},        {"glm-5", 6144, 2048, 32, 8, 8192},
                {"qwen3.5-397b", 4096, 1024, 64, 10, 8192},  {"deepseek-v4", 7168, 3072, 32, 6, 8192},
                {"qwen3-30b-a3b", 2048, 768, 128, 8, 16384}, {"olmoe", 2048, 1024, 64, 8, 8192}};
  std::printf(
      "| shape (Is = I) | saved: no recompute | recompute before | recompute now | workspace fwd / bwd, recompute "
      "before | now |\n|---|---|---|---|---|---|\n");
  for (auto s : shapes) {
    LayerConfig c = make_config(1, s.T, s.H, s.I, s.E, s.k);
    c.shared_intermediate = s.I;
    gpu::LaunchConfig l;
    auto m0 = gpu::layer_memory(c, l);
    l.recompute = true;
    auto m = gpu::layer_memory(c, l);
    const double Mi = 1 << 20, shared = double(shared_rows_capacity(c, 1)) * 3 * s.I * 2;
    std::printf("| %s | %.0f | %.1f | %.1f | %.0f / %.0f | %.0f / %.0f |\n", s.n, m0.saved / Mi,
                (m.saved + shared) / Mi, m.saved / Mi, (m.workspace_forward - shared) / Mi,
                (m.workspace_backward - shared) / Mi, m.workspace_forward / Mi, m.workspace_backward / Mi);
  }
}
