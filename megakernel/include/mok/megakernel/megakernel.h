// mok megakernel, host-vector API: the deterministic MoE layer on NVIDIA Hopper GPUs (sm_90a) for
// tests, tools and benchmarks, on host std::vectors. A thin wrapper over the device API
// (mok/megakernel/layer.h, what a training framework calls): it owns device copies of the weights,
// every output and the workspace, poisons the outputs before each launch and the workspace before
// each backward (which so reads only what it writes or the forward saved), waits, and reads back.
// Persistent kernels (one forward launch, two or three backward launches) run every step of the layer
// for R expert-parallel ranks:
// simulated ranks (all R ranks' buffers on one GPU), R ranks spread over the GPUs of this process
// through NCCL symmetric windows, or over colocated shares of one GPU (tests; docs/multi-gpu.md),
// each GPU holding its share of the tokens and experts. The bits do not depend on which (D2).
// Results equal the CPU reference's (hopper_tc step model) bit for bit: docs/numerics.md.
//
//   mok::gpu::Megakernel mk(config, weights, {});   // validates, uploads weights, sizes workspace
//   mok::Forward f = mk.forward(x, nullptr);         // nullptr: run the router; or a given routing
//   mok::Gradients g = mk.backward(dy);              // the backward of the last forward
//
// Errors (bad input, CUDA failure, a watchdog that fired in the kernel) throw mok::Error.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mok/core/config.h"
#include "mok/core/layer_io.h"
#include "mok/core/validate.h"
#include "mok/megakernel/layer.h"

namespace mok::gpu {

// Ring sizes are whole expert tiles (the GEMMs' 128-row tiles). The results do not depend on it (D3).
inline constexpr int kRingRowGranularity = 128;

// The smallest GPU ring holding a CPU reference ring of `rows` rows (checked: whole 16-row chunks).
inline int whole_tile_ring_rows(int rows) {
  validate_ring_rows(rows);
  return (rows + kRingRowGranularity - 1) / kRingRowGranularity * kRingRowGranularity;
}

class Megakernel {
 public:
  Megakernel(const LayerConfig& config, const LayerWeights& weights, const LaunchConfig& launch);
  ~Megakernel();
  Megakernel(const Megakernel&) = delete;
  Megakernel& operator=(const Megakernel&) = delete;

  // given: a routing to replay (nullptr: the router runs on the GPU; replay_ids: only its expert ids are
  // replayed). Returns every forward result (routing, logits, dispatch layout, y, saved h and shared h and a: none
  // with LaunchConfig::recompute, as the reference's Forward in recompute mode).
  // = set_input + launch_forward + read_forward.
  Forward forward(const std::vector<bf16>& x, const Routing* given, bool replay_ids = false);

  // The backward of the last forward. = set_output_grad + launch_backward + read_gradients.
  // accumulate: the weight gradients are added into those of the previous backward calls (gradient
  // accumulation over micro-batches: GradOutputs::accumulate), and the sums returned.
  Gradients backward(const std::vector<bf16>& dy, bool accumulate = false);

  // The steps apart, for timing the kernels alone. set_* validate, upload and poison the outputs;
  // launch_* run the direction's persistent kernels and wait for them; read_* copy the results back.
  void set_input(const std::vector<bf16>& x, const Routing* given, bool replay_ids = false);
  void launch_forward();
  Forward read_forward() const;
  void set_output_grad(const std::vector<bf16>& dy, bool accumulate = false);
  void launch_backward();
  Gradients read_gradients() const;

  // LaunchConfig::fp8_weights_given (the fp8 mode): each share's weights are quantized into a buffer
  // of the wrapper's at construction (the weights never change here) and every forward and backward
  // reads them (ForwardInputs::fp8_weights). quantize_weights quantizes them again, the same bits, and
  // waits: what an optimizer step's quantization costs (mok-bench). Without fp8_weights_given each call
  // quantizes the weights itself.
  void quantize_weights();

  // Blocks the persistent kernels run with per GPU or share (after resolving LaunchConfig::blocks = 0).
  int blocks() const;
  // GPU 0's layer: what the forward saves for the backward, and each pass's workspace (Layer's).
  size_t saved_bytes() const;
  size_t workspace_bytes(Pass pass) const;
  size_t fp8_weights_bytes() const;  // GPU 0's quantized weights (Layer::fp8_weights_bytes; 0 in bf16)

  // Where the last launch spent its time on GPU 0, phase by phase (in order of first appearance).
  std::vector<PhaseTime> phase_times() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mok::gpu
