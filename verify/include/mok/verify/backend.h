// A backend runs the layer on a golden's inputs: the CPU reference or the megakernel (make_gpu_backend).
// mok-verify compares what it returns against the golden's bits (tools/mok_verify.cpp keeps the table
// of backends by name: a new one is a class here or in its own library, and one entry there).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "mok/golden/golden.h"

namespace mok::verify {

// What a backend's run returns: the routing and outputs for the golden's config, options and inputs, as
// format v1 tensors (golden::tensor_specs lists the names, dtypes and shapes), all of them; or, for a
// config whose backward the backend does not run (none of this repository's backends now: the gpu
// backend ran the fp8 mode's forward alone until the megakernel had its backward), the forward's
// alone (golden::forward_results_of: the routing group and y) with gradients_skipped saying why.
// mok-verify then compares the forward's tensors bit for bit and reports the backward as skipped
// (compare_run); a tensor missing without that reason, or a forward tensor missing whatever the
// reason, is a failure.
struct RunResults {
  golden::LayerResults results;
  std::optional<std::string> gradients_skipped;  // set: the backward did not run, and why
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // e.g. "reference (step fp32_fma)", shown in reports
  // The results for the golden (above). Throws mok::Error on failure.
  virtual RunResults run(const golden::GoldenCase& golden) = 0;
};

// Overrides of the golden's options, from the command line. A backend rejects (mok::Error) what it
// cannot honour. Ring capacity and recompute mode must change no bit; the step model changes bits
// wherever the two models round differently (that is what --step fp32 shows).
struct BackendFlags {
  std::optional<StepModel> step;
  std::optional<int> ring_rows;
  std::optional<bool> recompute;
  std::optional<int> gpus;          // gpu backend: the golden's ranks over this many GPUs, one process per GPU
  bool one_process = false;         // with gpus: all of them driven from this process (a peer group) instead
  std::optional<double> timeout_s;  // with gpus over processes: seconds a run's ranks may take (default 300)
};

// A backend that finds no GPU at all where one is needed to run across processes: a skip, not an
// error (mok-verify exits 77, ctest's SKIP_RETURN_CODE).
struct NoGpu : Error {
  using Error::Error;
};

// A golden whose config this backend does not implement at all: reported as SKIPPED with the reason,
// neither a mismatch nor an error. (A config whose forward it runs but not its backward is no such
// golden: RunResults::gradients_skipped.)
struct Unsupported : Error {
  using Error::Error;
};

// The CPU reference (reference/layer.h) on the golden's stored inputs.
std::unique_ptr<Backend> make_reference_backend(const BackendFlags& flags);

// The megakernel on one Hopper GPU, simulated ranks (megakernel/megakernel.h), or with --gpus N the
// golden's ranks spread over N GPUs through NCCL windows: N processes, one per GPU, each running its
// share (tokens [g N/G, (g+1) N/G), experts [g E/G, (g+1) E/G)) on the communicator constructor of the
// device API, their results assembled here (docs/multi-gpu.md); with one_process, this process drives
// the N GPUs (N = 1: the NCCL transport on one GPU). A golden whose R ranks do not split over N GPUs
// runs as the same global batch on one rank per GPU (the bits do not depend on R) when its tokens and
// experts split, and is refused otherwise. It computes the hopper_tc model only; the golden's recompute
// mode (or --recompute) is the megakernel's (LaunchConfig::recompute); an fp8 golden runs its forward
// and backward in the fp8 mode. Without CUDA in the build, or without a GPU, it throws mok::Error
// (NoGpu across processes without any GPU).
std::unique_ptr<Backend> make_gpu_backend(const BackendFlags& flags);

}  // namespace mok::verify
