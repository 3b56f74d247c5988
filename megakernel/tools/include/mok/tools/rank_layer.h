// One rank's Layer on its share of a whole problem, for the tools of one process per GPU (mok-procs,
// mok-verify --gpus, mok-bench --gpus): the rank's device tensors (mok/megakernel/layer_tensors.h),
// its calls, its results in the fields' vocabulary, and the parent's assembly of every rank's results
// into the global ones. Rank g of G holds tokens [g N/G, (g+1) N/G) and experts [g E/G, (g+1) E/G)
// (docs/multi-gpu.md).
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "mok/core/layer_io.h"
#include "mok/megakernel/layer.h"
#include "mok/megakernel/layer_tensors.h"
#include "mok/tools/process_ranks.h"

namespace mok::tools {

// A rank's stream for its Layer's calls (non-blocking: nothing on the legacy default stream orders
// itself with it; the tensors' transfers are synchronous).
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// Device memory in use on the current device (cudaMemGetInfo: total - free; other processes' included).
uint64_t device_memory_in_use();

// What the Layer returns, and the dispatch layout read from its saved buffer (h is not returned).
struct RankResults {
  Forward fwd;
  Gradients grads;
};

// The device bytes of a rank's tensors, by kind.
struct TensorBytes {
  uint64_t weights = 0, activations = 0, saved = 0, workspace = 0;  // weights: with their gradients
};

class RankTensors {
 public:
  // Rank g of launch.gpus on `layer` (constructed with `launch`): its experts' weights, uploaded.
  RankTensors(const gpu::Layer& layer, const LayerWeights& w, const gpu::LaunchConfig& launch, int g);
  // Its tokens' rows of the whole x, dy and routing: given (mode given), its expert ids (replay_ids),
  // or none (router).
  void set_inputs(const std::vector<bf16>& x, const std::vector<bf16>& dy, const Routing* routing, RoutingMode mode);
  // Every output 0xff (synchronous), so that a result a call leaves unwritten cannot pass on an
  // earlier call's bits; apart from the calls, which a benchmark times.
  void poison();
  // Enqueue a call on `stream`.
  void forward(gpu::Layer& layer, cudaStream_t stream);
  void backward(gpu::Layer& layer, cudaStream_t stream);
  RankResults download() const;  // after the calls' work is done (Layer::check())
  TensorBytes bytes() const;

 private:
  gpu::ForwardInputs inputs() const;

  LayerConfig c_;
  gpu::LaunchConfig launch_;
  int g_;
  RoutingMode mode_ = RoutingMode::router;
  gpu::WeightTensors weights_;
  gpu::ForwardTensors fwd_;
  gpu::GradTensors grad_;
  gpu::DeviceTensor workspace_;
};

// The global results of ranks 0..G-1: per-token and per-expert fields in rank order; the fields every
// rank holds whole (the layout, d_router, the shared expert's gradients) from rank 0, and each other
// rank's that differs from it named in `problems`.
RankResults assemble(const std::vector<RankResults>& ranks, std::vector<std::string>& problems);

void put_results(ResultWriter& file, const RankResults& r);
RankResults get_results(ResultReader& file);

// The first field whose bits differ between two results, or "".
std::string first_difference(const RankResults& a, const RankResults& b);

}  // namespace mok::tools
