// mok megakernel: the deterministic MoE layer on NVIDIA Hopper GPUs (sm_90a).
// One persistent kernel per direction runs every step of the layer for R expert-parallel ranks,
// reached through a rank pointer table: simulated ranks (all R ranks' buffers on one GPU), or R ranks
// spread over the GPUs of this process through NCCL symmetric windows (docs/multi-gpu.md). The bits
// do not depend on which (D2).
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

namespace mok::gpu {

// True when a CUDA device of compute capability 9.0 is usable.
bool device_available();

// How many of the devices 0, 1, ... are usable Hopper GPUs (compute capability 9.0), in a row.
int hopper_gpus();

// Ring sizes are whole expert tiles (the GEMMs' 128-row tiles). The results do not depend on it (D3).
inline constexpr int kRingRowGranularity = 128;

// The smallest GPU ring holding a CPU reference ring of `rows` rows (checked: whole 16-row chunks).
inline int whole_tile_ring_rows(int rows) {
  validate_ring_rows(rows);
  return (rows + kRingRowGranularity - 1) / kRingRowGranularity * kRingRowGranularity;
}

// How the ranks' buffers reach each other: one allocation on one GPU, or NCCL symmetric windows (one
// per GPU; NCCL 2.28 device API).
enum class Transport { simulated, nccl };

struct LaunchConfig {
  int blocks = 0;                              // persistent blocks per GPU; 0: as many as are co-resident on the device
  int ring_rows = 4096;                        // rows of each rank's receive ring per cycle: a multiple of 128
  double watchdog_seconds = 10.0;              // a barrier or pipeline wait longer than this reports an error, no hang
  int gpus = 1;                                // GPUs 0 .. gpus-1, each executing R / gpus consecutive ranks
  Transport transport = Transport::simulated;  // gpus > 1 needs nccl
};

// Time spent in one phase of the last launch: from the previous grid barrier (or the kernel's start)
// to the barrier that closes the phase, summed over ring cycles, as block 0 saw it. The work after
// the last barrier (the combine) is not included.
struct PhaseTime {
  std::string phase;
  double ms;
};

class Megakernel {
 public:
  Megakernel(const LayerConfig& config, const LayerWeights& weights, const LaunchConfig& launch);
  ~Megakernel();
  Megakernel(const Megakernel&) = delete;
  Megakernel& operator=(const Megakernel&) = delete;

  // given: a routing to replay (nullptr: the router runs on the GPU). Returns every forward result
  // (routing, logits, dispatch layout, y, saved h and a). = set_input + launch_forward + read_forward.
  Forward forward(const std::vector<bf16>& x, const Routing* given);

  // The backward of the last forward. = set_output_grad + launch_backward + read_gradients.
  Gradients backward(const std::vector<bf16>& dy);

  // The steps apart, for timing the kernels alone. set_* validate, upload and poison the outputs;
  // launch_* run one persistent kernel and wait for it; read_* copy the results back.
  void set_input(const std::vector<bf16>& x, const Routing* given);
  void launch_forward();
  Forward read_forward() const;
  void set_output_grad(const std::vector<bf16>& dy);
  void launch_backward();
  Gradients read_gradients() const;

  // Blocks the persistent kernels run with per GPU (after resolving LaunchConfig::blocks = 0).
  int blocks() const;

  // Where the last launch spent its time on GPU 0, phase by phase (in order of first appearance).
  std::vector<PhaseTime> phase_times() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mok::gpu
