// Behind a call whose launch stopped on an error, or ran while an earlier launch's error was not raised
// yet: the outputs the call would have written, filled with the canonical NaN on the GPU. A training step
// that reads them before the error is raised (at the next call, or Layer::check) then computes NaN, which
// it can see, rather than a previous step's stale values, which it cannot.
#pragma once

#include <cuda_runtime.h>

#include <initializer_list>

#include "mok/megakernel/layer.h"

namespace mok::gpu {

// Fills each present bf16 or fp32 view of `outputs` with NaN when *error_code (device memory) is not zero
// as the stream reaches it; otherwise the kernel reads that one word and ends. Stream-ordered, no
// allocation; a view of another dtype throws mok::Error without enqueueing the fill.
void fill_nan_on_error(cudaStream_t stream, const int* error_code, std::initializer_list<TensorView> outputs);
// The fill's kernel (to load it before the first call: Layer's construction).
const void* nan_fill_kernel();

}  // namespace mok::gpu
