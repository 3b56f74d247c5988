// What mok-bench's two ways of running share (bench.cpp: this process; bench_ranks.cpp: one process per
// GPU): its options, the shapes, input sets, events around timed launches, the bf16 matmul peak.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "mok/core/config.h"
#include "mok/core/layer_io.h"
#include "mok/megakernel/check.h"
#include "mok/megakernel/layer.h"
#include "mok/reference/problem.h"

namespace mok::bench {

inline constexpr int kNoGpus = -1;  // Options::gpus without --gpus: this process, one GPU

struct Options {
  std::string shape = "all", routing = "uniform";
  int runs = 20, warmup = 2, tokens = 0, ring_rows = 0, sets = 3, gpus = kNoGpus, experts = 0, same_bits = 0;
  bool recompute = false, plan = false, one_process = false, fp8 = false, fp8_weight_gradients = false,
       accumulate = false, paired_blocks = false;
  double capacity_factor = 0, timeout_s = 600, sustained_s = 0;
};

struct Shape {
  const char* name;
  int H, I, E, k, T;
};

inline constexpr Shape kShapes[] = {
    {"kimi-k2", 7168, 2048, 32, 8, 8192},        {"glm-5", 6144, 2048, 32, 8, 8192},
    {"qwen3.5-397b", 4096, 1024, 64, 10, 8192},  {"deepseek-v4", 7168, 3072, 32, 6, 8192},
    {"qwen3-30b-a3b", 2048, 768, 128, 8, 16384}, {"olmoe", 2048, 1024, 64, 8, 8192},
};

// The shapes --shape selects (all, or one by name); throws mok::Error for an unknown name.
std::vector<Shape> selected_shapes(const std::string& name);

// `ranks` ranks of --tokens T each (the shape's when 0), --experts E (the shape's when 0), in the
// precision of --fp8.
LayerConfig config_of(const Shape& s, int ranks, const Options& o);

// F times an average GPU's rows, at most the most a GPU can receive; 0 for F = 0.
long capacity_rows(const LayerConfig& c, int gpus, double factor);

// `launch` (of `gpus` GPUs) with --capacity-factor's rows, checked as a Layer checks it but for the device
// (mok::Error): before a tool looks for GPUs, a bad shape, size or ring was "no Hopper GPU" (a skip), or
// failed in every rank.
gpu::LaunchConfig checked_launch(const LayerConfig& c, int gpus, const Options& o, gpu::LaunchConfig launch);

// Bytes crossing between GPUs per step (one rank per GPU), H bf16 a row: the pulls read a token's row
// once per other GPU holding some of its experts (x by the forward; dy twice by the backward, for the
// ring and for dye: counted for one ring cycle, where the ring's pull reads a token again in each cycle
// holding its rows), the pushes write one row per (token, slot) whose expert sits on another GPU (y by
// the forward, dx by the backward).
struct LinkBytes {
  double forward = 0, backward = 0;
};
LinkBytes link_bytes(const LayerConfig& c, const std::vector<int32_t>& topk_idx);

// Matrix FLOPs of one forward (three GEMMs of N k rows); the backward does twice as many.
double forward_flops(const LayerConfig& c);

// One input set: the problem's tokens rotated by some rows (other bytes, the same routing statistics).
struct Inputs {
  std::vector<bf16> x, dy;
  std::optional<Routing> routing;  // none where the layer's router routes (--routing router)
  const Routing* given() const { return routing ? &*routing : nullptr; }
};
// `sets` sets, rotated between runs (as bench/torch_baseline.py), each by an equal share of the tokens.
std::vector<Inputs> input_sets(const ref::Problem& p, int sets);

// Overwrites more than the L2 cache (50 MB on the H200) so the next launch starts cold.
void scrub_l2(cudaStream_t stream);

// The current device's free memory (cudaMemGetInfo), in bytes.
size_t free_device_bytes();

// The peak measurement's random 8192 x 8192 bf16 matrix (its A and B). Made with OpenMP: a forked rank
// gets it from its parent (mok/tools/process_ranks.h: a rank must not run OpenMP after its parent did).
std::vector<bf16> peak_matrix();
// bf16 x bf16 -> fp32-accumulated bf16 product of 8192^3 on `matrix` (peak_matrix) as A and B (cuBLAS),
// TFLOP/s.
double matmul_peak_tflops(const std::vector<bf16>& matrix, int warmup, int runs);

struct Times {
  double min_ms = 0, median_ms = 0;
};

// Two CUDA events around the device work that an enqueue puts on a stream.
class EventTimer {
 public:
  EventTimer() {
    MOK_CUDA_CHECK(cudaEventCreate(&start_));
    MOK_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~EventTimer() {
    if (start_) cudaEventDestroy(start_);
    if (stop_) cudaEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  // Milliseconds from before to after what enqueue() puts on `stream`, waited for.
  template <class Enqueue>
  float ms(cudaStream_t stream, Enqueue&& enqueue) {
    MOK_CUDA_CHECK(cudaEventRecord(start_, stream));
    enqueue();
    MOK_CUDA_CHECK(cudaEventRecord(stop_, stream));
    MOK_CUDA_CHECK(cudaEventSynchronize(stop_));
    float elapsed = 0;
    MOK_CUDA_CHECK(cudaEventElapsedTime(&elapsed, start_, stop_));
    return elapsed;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// CUDA events on `stream` around each of `runs` timed launches after `warmup` untimed ones.
// prepare(i) runs untimed before launch i (negative i: warm-up); before each timed launch the L2 is
// scrubbed and align() runs (across processes: the ranks line up, so that none times a wait for a
// slower peer's preparation); after() runs once each timed launch has completed, untimed (mok-bench reads
// the launch's phase clock there).
template <class Prepare, class Align, class Launch, class After>
Times time_launches(cudaStream_t stream, int warmup, int runs, Prepare&& prepare, Align&& align, Launch&& launch,
                    After&& after) {
  EventTimer timer;
  for (int i = 0; i < warmup; ++i) {
    prepare(-1 - i);
    launch();
  }
  std::vector<float> ms(runs);
  for (int i = 0; i < runs; ++i) {
    prepare(i);
    scrub_l2(stream);
    align();
    ms[i] = timer.ms(stream, launch);
    after();
  }
  std::sort(ms.begin(), ms.end());
  const float median = runs % 2 ? ms[runs / 2] : (ms[runs / 2 - 1] + ms[runs / 2]) / 2;  // statistics.median's
  return {ms.front(), median};
}
template <class Prepare, class Align, class Launch>
Times time_launches(cudaStream_t stream, int warmup, int runs, Prepare&& prepare, Align&& align, Launch&& launch) {
  return time_launches(stream, warmup, runs, prepare, align, launch, [] {});
}

// Steps one after another, as training runs them (docs/benchmarks.md, "Sustained steps"): `count` untimed
// so the SM clock settles where the power limit holds it, then `count` timed; the mean step, ms. No host
// work is added between steps, but the host-vector API's launches are synchronous (about 0.1 ms between
// launches, under 1% of a step). Events on `stream`, as time_launches records them.
template <class Step>
double sustained_step_ms(cudaStream_t stream, long count, Step&& step) {
  const auto steps = [&] {
    for (long i = 0; i < count; ++i) step();
  };
  steps();
  return EventTimer().ms(stream, steps) / double(count);
}

}  // namespace mok::bench
