// The saved buffer and workspace of one Layer (R = 1, bf16) on the six benchmark shapes, with and without
// recompute mode, from mok::gpu::layer_memory (no GPU needed). "Recompute before" (xe still saved) is
// computed from today's sizes by moving xe's P H bf16 back. Built on the development machine against
// the build's libraries:
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
      "| shape | saved: no recompute | recompute before | recompute now | workspace fwd / bwd, recompute before | now "
      "|\n|---|---|---|---|---|---|\n");
  for (auto s : shapes) {
    const LayerConfig c = make_config(1, s.T, s.H, s.I, s.E, s.k);
    gpu::LaunchConfig l;
    auto m0 = gpu::layer_memory(c, l);
    l.recompute = true;
    auto m = gpu::layer_memory(c, l);
    const double Mi = 1 << 20, xe = double(own_padded_rows(c, 1, 0)) * s.H * 2;
    std::printf("| %s | %.0f | %.0f | %.1f | %.0f / %.0f | %.0f / %.0f |\n", s.n, m0.saved / Mi, (m.saved + xe) / Mi,
                m.saved / Mi, (m.workspace_forward - xe) / Mi, (m.workspace_backward - xe) / Mi,
                m.workspace_forward / Mi, m.workspace_backward / Mi);
  }
}
