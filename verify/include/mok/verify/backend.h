// A backend runs the layer on a golden's inputs: the CPU reference now, the megakernel later.
// mok-verify compares what it returns against the golden's bits (tools/mok_verify.cpp keeps the table
// of backends by name: a new one is a class here or in its own library, and one entry there).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "mok/golden/golden.h"

namespace mok::verify {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // e.g. "reference (step fp32_fma)", shown in reports
  // The routing and outputs for the golden's config, options and inputs, as format v1 tensors
  // (golden::tensor_specs lists the names, dtypes and shapes). Throws mok::Error on failure.
  virtual golden::LayerResults run(const golden::GoldenCase& golden) = 0;
};

// Overrides of the golden's options, from the command line. A backend rejects (mok::Error) what it
// cannot honour. Ring capacity and recompute mode must change no bit; the step model changes bits
// wherever the two models round differently (that is what --step fp32 shows).
struct BackendFlags {
  std::optional<StepModel> step;
  std::optional<int> ring_rows;
  std::optional<bool> recompute;
  std::optional<int> gpus;  // gpu backend: the golden's ranks over this many GPUs through NCCL windows
};

// The CPU reference (reference/layer.h) on the golden's stored inputs.
std::unique_ptr<Backend> make_reference_backend(const BackendFlags& flags);

// The megakernel (megakernel/megakernel.h) on one Hopper GPU, simulated ranks, or with --gpus N the
// ranks spread over N GPUs through NCCL windows (N = 1: the NCCL transport on one GPU). It computes the
// hopper_tc model only; the golden's recompute mode (or --recompute) is the megakernel's
// (LaunchConfig::recompute). Without CUDA in the build, or without a GPU, it throws mok::Error.
std::unique_ptr<Backend> make_gpu_backend(const BackendFlags& flags);

}  // namespace mok::verify
