// mok-bench: times the persistent forward and backward kernels on the shapes of docs/benchmarks.md and
// the device's bf16 matrix-product rate (cuBLAS, 8192^3) as the peak to compare against. Median of
// --runs timed launches after --warmup; CUDA events around each. Input sets (x, dy, routing) are
// rotated between runs and the L2 cache is scrubbed before each timed launch, so no run finds its
// inputs cached. Per shape also the phases of block 0, the layer's memory, and the device memory its
// first forward and backward took beyond it (the kernels' local memory and code; once per process).
//   mok-bench [--shape NAME|all] [--routing uniform|zipf|router] [--runs N] [--warmup N] [--tokens T]
//             [--ring-rows R] [--sets N] [--gpus G [--one-process] [--timeout S]] [--recompute]
//             [--experts E] [--capacity-factor F] [--plan] [--fp8 [--fp8-weight-gradients]] [--sustained S]
//             [--accumulate] [--paired-blocks] [--same-bits N]
//   --routing: a given routing (uniform, or Zipf-skewed), or router: the layer's own router on its random
//           weights (its phases timed; one GPU only: across GPUs the link bytes come from a routing known
//           beforehand);
//   --ring-rows: the backward's dy ring (default 0: the layer's, an average rank's rows: one cycle);
//   --recompute: the backward pulls xe and recomputes h and a (LaunchConfig::recompute; saved holds none);
//   --sets: input sets rotated between runs (default 3, as bench/torch_baseline.py; at most 16);
//   --gpus: G processes, one rank per GPU on an NCCL communicator, T tokens each (the global batch grows
//           with G; bench_ranks.cpp): each rank's forward and backward times, the slowest rank's, the
//           bytes crossing between GPUs per step and per second, each GPU's memory, and for G > 1 the
//           scaling against one GPU measured in the same invocation; --timeout: seconds the ranks of
//           one run may take (default 600). --one-process: this process drives the G GPUs through one
//           peer group (the host-vector API), the peak fraction of G times one GPU's peak, phases shown;
//   --experts: E instead of the shape's (its slice of the model's experts);
//   --capacity-factor: LaunchConfig::capacity_rows = F times an average GPU's rows, N k / G (at most
//           N min(k, E/G)); 0 (default): the most any routing can give a GPU;
//   --fp8: the fp8 layer mode (LayerConfig::precision; one process); the peak fractions are of twice the
//          bf16 peak (the backward's weight gradients stay bf16: its fraction understates). As in
//          training, the weights are quantized once beforehand (LaunchConfig::fp8_weights_given): the
//          forward's and the backward's times exclude it, and the weights' quantization
//          (Layer::quantize_weights, once per optimizer step) is timed apart, in its own loop;
//   --fp8-weight-gradients: with --fp8, the routed experts' weight gradients on E4M3 operands too
//          (LaunchConfig::fp8_weight_gradients);
//   --accumulate: each backward adds its weight gradients into the fp32 ones it holds, as training adds
//          a micro-batch's into its accumulators (GradOutputs::accumulate; the PyTorch op's
//          accumulate_into), rather than storing them (one process);
//   --paired-blocks: the kernels in clusters of two blocks, the expert GEMMs' weights multicast to both
//          (LaunchConfig::paired_blocks, experimental);
//   --sustained: also steps one after another for about S seconds after as long untimed (one process):
//          the step near the clock the power limit holds in training (the timed launches above run near
//          the top clock: the host prepares each one while the GPU idles; docs/benchmarks.md);
//   --same-bits: after the timings, N steps on the first input set (each after a step on the second; with
//          --accumulate its weight gradients added into that step's), every result and gradient compared bit
//          for bit with the first step's, then one step of a layer on about half the blocks (bench_same_bits.h;
//          one process, --sets >= 2): run to run (D1) and launch (D3) at full size. It holds two steps' results
//          on the host (kimi-k2's: about 6 GB each) and a second layer on the GPU;
//   --plan: no GPU needed: the device memory per GPU of one rank per GPU, T tokens each, for G = 1, 2,
//           8 and 64 (those that divide E): the expert weights and bf16 gradients of its E/G experts
//           (with --fp8 also their E4M3 copies, W and W^T, quantized once per step) and the Layer's own
//           buffers (mok::gpu::layer_memory, the sizes a Layer allocates): its workspace is the backward's, of
//           which the forward's is a prefix ("of it fwd").
// Exit: 0 done, 1 a failed rank or a --same-bits difference, 2 bad arguments or an error, 77 no Hopper GPU
// (ctest: skip).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "bench_common.h"
#include "bench_ranks.h"
#include "bench_same_bits.h"
#include "mok/core/tool_exit.h"
#include "mok/core/validate.h"
#include "mok/megakernel/megakernel.h"
#include "mok/reference/problem.h"
#include "mok/tools/cli_args.h"

namespace {

using namespace mok::bench;
using mok::tools::parse_double, mok::tools::parse_int;

// The --plan table of one shape (GB = 1e9 bytes).
void print_plan(const Shape& s, const Options& o, const mok::gpu::LaunchConfig& base) {
  const mok::LayerConfig one = config_of(s, 1, o);
  // Every row is sized before any is printed. A G the layer refuses (--paired-blocks over G > 1, N E past 2^31
  // with G's tokens) is named under the table: it failed the whole plan. None sized fails the shape (named; the
  // plan goes on to the next).
  struct Row {
    int gpus;
    mok::LayerConfig config;
    mok::gpu::LayerMemory memory;
  };
  std::vector<Row> rows;
  std::vector<std::string> refused;
  for (const int g : {1, 2, 8, 64}) {
    if (one.experts % g) continue;
    try {
      const mok::LayerConfig c = config_of(s, g, o);
      mok::gpu::LaunchConfig launch = base;
      launch.gpus = g;
      if (g > 1) launch = mok::gpu::on_communicator(launch, g);  // a process per GPU, its window
      launch.capacity_rows = capacity_rows(c, g, o.capacity_factor);
      rows.push_back({g, c, mok::gpu::layer_memory(c, launch)});
    } catch (const mok::Error& e) {
      refused.push_back(std::string(s.name) + " over G = " + std::to_string(g) + ": " + e.what());
    }
  }
  if (rows.empty()) throw mok::Error("mok-bench --plan: " + refused.front());
  char capacity[64] = "the most rows a GPU can receive";
  if (o.capacity_factor > 0) std::snprintf(capacity, sizeof capacity, "%g x an average GPU's rows", o.capacity_factor);
  std::printf("%s, T = %d tokens per GPU, E = %d, %s, recompute %s, capacity %s (GB per GPU)\n", s.name,
              one.tokens_per_rank, one.experts, o.fp8 ? "fp8" : "bf16", base.recompute ? "on" : "off", capacity);
  if (o.fp8)
    std::printf(
        "(fp8: weights+grads include their E4M3 copies, W and W^T, quantized once per step; the workspace holds "
        "none)\n");
  std::printf("%6s %8s %14s %8s %8s %10s %9s %8s\n", "G", "experts", "weights+grads", "saved", "window", "workspace",
              "of it fwd", "total");
  for (const auto& [g, c, m] : rows) {
    // w1 [2I, H] and w2 [H, I] per expert and the shared expert's [2Is, H] and [H, Is], bf16, and their
    // bf16 gradients (fp8: and the E4M3 copies of all of them the forward and the backward read, W and
    // W^T, LaunchConfig::fp8_weights_given; 0 bytes in bf16).
    const double bf16_weights = (double(c.experts / g) * c.intermediate + c.shared_intermediate) * 3.0 * c.hidden;
    const double weights = bf16_weights * 2 * 2 + double(m.fp8_weights);
    const double total = weights + double(m.saved) + double(m.window) + double(m.workspace_backward);
    std::printf("%6d %8d %14.1f %8.1f %8.1f %10.2f %9.2f %8.1f\n", g, c.experts / g, weights / 1e9, m.saved / 1e9,
                m.window / 1e9, m.workspace_backward / 1e9, m.workspace_forward / 1e9, total / 1e9);
  }
  for (const std::string& why : refused) std::printf("  not sized: %s\n", why.c_str());
}

// Block 0's phase clock of each timed launch: one launch's phase times moved by up to a quarter between runs
// (results 2026-12-02-h200-x), so each phase is printed as its median over the launches (0 ms where a launch
// lacks it).
class PhaseRecord {
 public:
  void add(std::vector<mok::gpu::PhaseTime> launch) { launches_.push_back(std::move(launch)); }
  void print(const char* direction) const {
    std::vector<std::string> names;  // in the order they first appear
    for (const auto& launch : launches_)
      for (const auto& t : launch)
        if (std::find(names.begin(), names.end(), t.phase) == names.end()) names.push_back(t.phase);
    std::printf("  %s phases (median of %zu launches, block 0, ms):", direction, launches_.size());
    for (const std::string& name : names) std::printf("  %s %.2f;", name.c_str(), median(name));
    std::printf("\n");
  }

 private:
  double median(const std::string& name) const {
    std::vector<double> ms;
    for (const auto& launch : launches_) {
      const auto it = std::find_if(launch.begin(), launch.end(), [&](const auto& t) { return t.phase == name; });
      ms.push_back(it == launch.end() ? 0.0 : it->ms);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }
  std::vector<std::vector<mok::gpu::PhaseTime>> launches_;
};

// The config and launch of one shape in this process (over o.gpus GPUs with --one-process), checked.
std::pair<mok::LayerConfig, mok::gpu::LaunchConfig> checked_here(const Shape& s, const Options& o,
                                                                 mok::gpu::LaunchConfig launch) {
  const int gpus = std::max(o.gpus, 1);
  const mok::LayerConfig c = config_of(s, gpus, o);
  if (gpus > 1) launch.gpus = gpus, launch.transport = mok::gpu::Transport::nccl;
  try {
    launch = checked_launch(c, gpus, o, launch);
  } catch (const mok::Error& e) {
    throw mok::Error("mok-bench: " + std::string(s.name) + ": " + e.what());
  }
  return {c, launch};
}

// One shape in this process: one GPU (simulated ranks), or --gpus G --one-process over a peer group. False: a
// --same-bits difference.
bool bench_here(const Shape& s, const Options& o, mok::ref::RoutingKind kind, const mok::gpu::LaunchConfig& base,
                double peak) {
  const auto [c, launch] = checked_here(s, o, base);
  // --same-bits holds the problem and two steps' results, each at most the problem's tensors (an estimate).
  if (o.same_bits > 0) mok::require_fits_in_memory(c, 3);
  const int gpus = launch.gpus;
  std::fprintf(stderr, "%s: generating inputs...\n", s.name);
  const mok::ref::Problem p = mok::ref::make_problem(c, 2026, kind);
  const std::vector<Inputs> inputs = input_sets(p, o.sets);
  mok::gpu::Megakernel mk(c, p.weights, launch);
  const auto input = [&](int i) -> const Inputs& { return inputs[(i % o.sets + o.sets) % o.sets]; };
  const auto set_input = [&](int i) { mk.set_input(input(i).x, input(i).given()); };
  const auto backward_of = [&](int i, bool accumulate) {
    set_input(i);
    mk.launch_forward();
    mk.set_output_grad(input(i).dy, accumulate);
  };
  const auto prepare_backward = [&](int i) { backward_of(i, o.accumulate); };
  double quantize = 0;
  if (o.fp8) {  // the weights' quantization, once per optimizer step in training: not in the forward's time
    std::fprintf(stderr, "%s: timing the weights' quantization...\n", s.name);
    quantize = time_launches(
                   nullptr, o.warmup, o.runs, [](int) {}, [] {}, [&] { mk.quantize_weights(); })
                   .median_ms;
  }
  // The device memory the layer's first forward and backward launches take beyond its own buffers: the
  // kernels' local memory (their stack frames, which the driver may size for every thread the device
  // can hold) and code. Taken once per process: 0 after the first shape. (In fp8 after the weights' quantization,
  // which the forward reads.)
  const size_t free_before = free_device_bytes();
  backward_of(0, false);  // stored: --accumulate's backwards then add into defined sums
  mk.launch_backward();
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
  const double first_launches_mib = (double(free_before) - double(free_device_bytes())) / 1048576.0;
  std::fprintf(stderr, "%s: timing the forward...\n", s.name);
  PhaseRecord fwd_phases, bwd_phases;
  const double fwd = time_launches(
                         nullptr, o.warmup, o.runs, set_input, [] {}, [&] { mk.launch_forward(); },
                         [&] { fwd_phases.add(mk.phase_times()); })
                         .median_ms;
  const double flops = forward_flops(c), fwd_tf = flops / (fwd * 1e9);
  const double rate = o.fp8 ? 2 * peak : peak;  // E4M3 runs at twice the bf16 rate
  std::fprintf(stderr, "%s: timing the backward...\n", s.name);
  const double bwd = time_launches(
                         nullptr, o.warmup, o.runs, prepare_backward, [] {}, [&] { mk.launch_backward(); })
                         .median_ms;
  // The step as training runs it (and as bench/torch_baseline.py times torch's f+b): the forward and the
  // backward back to back from one scrub, beside the sum of the two timed apart.
  std::fprintf(stderr, "%s: timing forward and backward back to back...\n", s.name);
  const double step = time_launches(
                          nullptr, o.warmup, o.runs, prepare_backward, [] {},
                          [&] {
                            mk.launch_forward();
                            mk.launch_backward();
                          },
                          [&] { bwd_phases.add(mk.phase_times()); })  // the steps' backward launches
                          .median_ms;
  double sustained = 0;
  const long sustained_steps = o.sustained_s > 0 ? long(std::ceil(o.sustained_s * 1000 / step)) : 0;
  if (sustained_steps > 0) {
    std::fprintf(stderr, "%s: timing %ld sustained steps after as many...\n", s.name, sustained_steps);
    sustained = sustained_step_ms(nullptr, sustained_steps, [&] {
      mk.launch_forward();
      mk.launch_backward();
    });
  }
  const double fb_tf = 3 * flops / ((fwd + bwd) * 1e9);
  std::printf("%-15s %-8s %8.2f %8.2f %10.2f %9.1f %9.1f %7.1f%% %7.1f%%", s.name, o.routing.c_str(), fwd, bwd,
              fwd + bwd, fwd_tf, fb_tf, 100 * fwd_tf / (gpus * rate), 100 * fb_tf / (gpus * rate));
  if (gpus > 1) {
    const LinkBytes link = link_bytes(c, p.routing->topk_idx);
    std::printf("  %8.1f  %8.1f", link.forward / (fwd * 1e6), link.backward / (bwd * 1e6));
  }
  std::printf("\n");
  std::printf("  forward and backward back to back (one step): %.2f ms\n", step);
  if (sustained_steps > 0)
    std::printf("  sustained steps (%ld one after another, after as many; the last input set): %.2f ms a step\n",
                sustained_steps, sustained);
  if (o.fp8) std::printf("  quantize weights (once per optimizer step, not in fwd or bwd ms): %.2f ms\n", quantize);
  fwd_phases.print("forward");
  bwd_phases.print("backward");
  std::printf("  layer memory per GPU: saved %.0f MiB, workspace forward %.0f / backward %.0f MiB",
              mk.saved_bytes() / 1048576.0, mk.workspace_bytes(mok::gpu::Pass::forward) / 1048576.0,
              mk.workspace_bytes(mok::gpu::Pass::backward) / 1048576.0);
  if (o.fp8) std::printf(", quantized weights %.0f MiB", mk.fp8_weights_bytes() / 1048576.0);
  std::printf("; the first launches took %.0f MiB more (local memory, code)\n", first_launches_mib);
  if (launch.paired_blocks) std::printf("  paired blocks: %d, in clusters of two\n", mk.blocks());
  const bool same = o.same_bits == 0 || same_bits(s.name, c, p.weights, launch, mk, inputs, o.same_bits, o.accumulate);
  std::fflush(stdout);
  return same;
}

int run_here(const Options& o, mok::ref::RoutingKind kind, const mok::gpu::LaunchConfig& launch) {
  const std::vector<Shape> shapes = selected_shapes(o.shape);
  for (const Shape& s : shapes) checked_here(s, o, launch);  // before any GPU is looked for
  if (!mok::gpu::device_available()) {
    std::fprintf(stderr, "mok-bench: no Hopper GPU\n");
    return 77;
  }
  const double peak = matmul_peak_tflops(peak_matrix(), 3, 10);
  std::printf("bf16 matmul peak (cuBLAS 8192^3, random data): %.0f TFLOP/s\n", peak);
  if (o.gpus > 1) std::printf("across %d GPUs (NCCL windows): peak fractions of %d x that peak\n", o.gpus, o.gpus);
  std::printf("%-15s %-8s %8s %8s %10s %9s %9s %8s %8s%s\n", "shape", "routing", "fwd ms", "bwd ms", "fwd+bwd ms",
              "fwd TF/s", "f+b TF/s", "fwd %pk", "f+b %pk", o.gpus > 1 ? "  fwd GB/s  bwd GB/s" : "");
  int status = 0;
  for (const Shape& s : shapes)
    if (!bench_here(s, o, kind, launch, peak)) status = 1;
  return status;
}

constexpr const char* kUsage =
    "usage: mok-bench [--shape NAME|all] [--routing uniform|zipf|router] [--runs N] [--warmup N] "
    "[--tokens T] [--ring-rows R] [--sets N] [--gpus G [--one-process] [--timeout S]] [--recompute] "
    "[--fp8 [--fp8-weight-gradients]] "
    "[--experts E] [--capacity-factor F] [--plan] [--sustained S] [--accumulate] [--paired-blocks] [--same-bits N]\n";

bool parse(int argc, char** argv, Options& o) {
  mok::tools::OptionReader reader("mok-bench");
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (!reader.first(arg)) return false;
    bool* flag = arg == "--recompute"              ? &o.recompute
                 : arg == "--fp8"                  ? &o.fp8
                 : arg == "--fp8-weight-gradients" ? &o.fp8_weight_gradients
                 : arg == "--plan"                 ? &o.plan
                 : arg == "--one-process"          ? &o.one_process
                 : arg == "--accumulate"           ? &o.accumulate
                 : arg == "--paired-blocks"        ? &o.paired_blocks
                                                   : nullptr;
    if (flag) {
      *flag = true;
      continue;
    }
    if (i + 1 >= argc) return reader.missing_value(arg);
    const char* value = argv[++i];
    bool ok = true;
    if (arg == "--shape")
      o.shape = value;
    else if (arg == "--routing")
      o.routing = value;
    else if (arg == "--capacity-factor")
      ok = parse_double(value, o.capacity_factor);
    else if (arg == "--timeout")
      ok = parse_double(value, o.timeout_s);
    else if (arg == "--sustained")
      ok = parse_double(value, o.sustained_s);
    else {
      int* target = arg == "--runs"        ? &o.runs
                    : arg == "--warmup"    ? &o.warmup
                    : arg == "--tokens"    ? &o.tokens
                    : arg == "--ring-rows" ? &o.ring_rows
                    : arg == "--sets"      ? &o.sets
                    : arg == "--gpus"      ? &o.gpus
                    : arg == "--experts"   ? &o.experts
                    : arg == "--same-bits" ? &o.same_bits
                                           : nullptr;
      if (!target) return reader.unknown(arg);
      ok = parse_int(value, *target);
    }
    if (!ok) return reader.bad_value(arg, value);
  }
  // It bounds the processes' run; it was ignored elsewhere.
  if (reader.given("--timeout") && (o.gpus == kNoGpus || o.one_process))
    return reader.refuse("--timeout applies to --gpus G in processes of their own (not --one-process)");
  return true;
}

inline constexpr int kMaxSets = 16;
// Each run's time is kept (and each launch's phases): --runs 1e9 asked for gigabytes a timing.
inline constexpr int kMaxRuns = 100000;
// A --same-bits step reads every result back (kimi-k2's: about 6 GB) and compares it: seconds a step.
inline constexpr int kMaxSameBits = 1000;

void check(const Options& o) {
  // Sets at most kMaxSets: each is a host and a device copy of x and dy (64 MB for olmoe), and --sets 1000 asked
  // for 64 GB of host memory.
  if (o.ring_rows < 0 || o.tokens < 0 || o.experts < 0 || o.sets < 1 || o.sets > kMaxSets ||
      (o.gpus != kNoGpus && o.gpus < 1) || !(o.capacity_factor >= 0 && std::isfinite(o.capacity_factor)))
    throw mok::Error("mok-bench: --sets must be in [1, " + std::to_string(kMaxSets) +
                     "], --gpus >= 1, --ring-rows, --tokens and --experts >= 0, and --capacity-factor finite and >= 0");
  if (o.runs < 1 || o.runs > kMaxRuns || o.warmup < 0 || o.warmup > kMaxRuns ||
      !(o.timeout_s > 0 && std::isfinite(o.timeout_s)) || !(o.sustained_s >= 0 && o.sustained_s <= 3600))
    throw mok::Error("mok-bench: --runs must be in [1, " + std::to_string(kMaxRuns) + "], --warmup in [0, " +
                     std::to_string(kMaxRuns) + "], --timeout finite and > 0 and --sustained in [0, 3600]");
  if (o.one_process && o.gpus == kNoGpus) throw mok::Error("mok-bench: --one-process applies to --gpus G");
  if (o.fp8 && o.gpus != kNoGpus && !o.one_process)
    throw mok::Error("mok-bench: --fp8 runs in one process (without --gpus, or with --one-process)");
  if (o.fp8_weight_gradients && !o.fp8) throw mok::Error("mok-bench: --fp8-weight-gradients needs --fp8");
  if (o.paired_blocks && o.gpus != kNoGpus)
    throw mok::Error("mok-bench: --paired-blocks runs on one GPU (without --gpus)");
  if (o.accumulate && o.gpus != kNoGpus && !o.one_process)
    throw mok::Error("mok-bench: --accumulate runs in one process (without --gpus, or with --one-process)");
  if (o.routing == "router" && o.gpus != kNoGpus)
    throw mok::Error("mok-bench: --routing router runs on one GPU (without --gpus)");
  if (o.sustained_s > 0 && o.gpus != kNoGpus && !o.one_process)
    throw mok::Error("mok-bench: --sustained runs in one process (without --gpus, or with --one-process)");
  if (o.same_bits < 0 || o.same_bits > kMaxSameBits)
    throw mok::Error("mok-bench: --same-bits must be in [0, " + std::to_string(kMaxSameBits) + "]");
  if (o.same_bits > 0 && o.gpus != kNoGpus && !o.one_process)
    throw mok::Error("mok-bench: --same-bits runs in one process (without --gpus, or with --one-process)");
  if (o.same_bits > 0 && (o.sets < 2 || o.plan))
    throw mok::Error(
        "mok-bench: --same-bits needs --sets of 2 or more (each compared step follows one of another "
        "set), and runs nothing with --plan");
  if (o.plan && o.gpus != kNoGpus) throw mok::Error("mok-bench: --plan prints G = 1, 2, 8 and 64 itself (no --gpus)");
  if (o.routing != "uniform" && o.routing != "zipf" && o.routing != "router")  // with --plan too, which ignores it
    throw mok::Error("mok-bench: --routing must be uniform, zipf or router, got " + mok::quote_input(o.routing));
}

}  // namespace

int bench_main(int argc, char** argv) {
  if (mok::printed_help(argc, argv, kUsage)) return 0;
  Options o;
  if (!parse(argc, argv, o)) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  try {
    check(o);
    mok::gpu::LaunchConfig launch;
    launch.ring_rows = o.ring_rows;
    launch.recompute = o.recompute;
    launch.fp8_weights_given = o.fp8;  // quantized once beforehand, as in training
    launch.fp8_weight_gradients = o.fp8_weight_gradients;
    launch.paired_blocks = o.paired_blocks;
    if (o.plan) {
      // A shape none of whose G can be sized is named and the others still printed (it stopped the plan there).
      int status = 0;
      for (const Shape& s : selected_shapes(o.shape)) {
        try {
          print_plan(s, o, launch);
        } catch (const mok::Error& e) {
          std::fprintf(stderr, "%s\n", e.what());
          status = 2;
        }
      }
      return status;
    }
    const auto kind = mok::ref::routing_kind_from_string(o.routing);
    if (o.gpus != kNoGpus && !o.one_process) return bench_over_processes(o, kind, launch);
    return run_here(o, kind, launch);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}

int main(int argc, char** argv) { return mok::tool_exit_status("mok-bench", bench_main(argc, argv)); }
