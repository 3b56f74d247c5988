// The GPU side of the extension, present where the megakernel is built (MOK_WITH_CUDA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <utility>

#include "mok/core/config.h"
#include "op_config.h"  // Call

namespace mok::py {

// mok._C.workspace_bytes: (forward, backward, backward_consuming, backward_accumulate).
using WorkspaceBytes = std::tuple<size_t, size_t, size_t, size_t>;

#ifdef MOK_WITH_CUDA
inline constexpr bool kHaveCudaLayers = true;
// Waits for every cached GPU layer's stream and raises the first error its kernels recorded.
void check_cuda_layers();
// Destroys the cached Layers built on the communicator `comm` (an ncclComm_t), after waiting for their
// devices: collective (each deregisters its window), so every rank calls it at the same point, with no
// call on those Layers in flight, and before the communicator is destroyed.
void release_cuda_layers(uintptr_t comm);
// Makes `comm` (an ncclComm_t, from mok.distributed.communicator) one the op's calls may name: a Layer is
// built only on a registered communicator (any other integer was dereferenced as one: a crash), until
// release_cuda_layers(comm).
void register_communicator(uintptr_t comm);
// Refuses the op's calls on the communicator `comm` until release_cuda_layers(comm): a call on it failed on
// this rank (the op marks its own failures; the Python layer marks those it raises before the op).
void mark_communicator_failed(uintptr_t comm);
// The workspace bytes of this call's Layer in mok::forward, mok::backward (its scratch in d_w1),
// mok::backward_consuming (and dh over saved's h) and mok::backward_accumulate (no GPU needed).
WorkspaceBytes cuda_workspace_bytes(const Call& call);
// The size of the fp8 mode's quantized weights (mok::quantize_weights) for this call (no GPU needed).
size_t cuda_fp8_weights_bytes(const Call& call);
// Tests: the GPU ops fill every output and workspace with 0xff bytes before their kernels run (off by
// default: the kernels write every byte, and the fill costs a memset per tensor).
void set_poison_outputs(bool on);
#else
inline constexpr bool kHaveCudaLayers = false;
inline void check_cuda_layers() {}
inline void release_cuda_layers(uintptr_t) {}
inline void register_communicator(uintptr_t) {}
inline void mark_communicator_failed(uintptr_t) {}
inline void set_poison_outputs(bool) {}
inline WorkspaceBytes cuda_workspace_bytes(const Call&) { throw Error("mok was built without its GPU ops"); }
inline size_t cuda_fp8_weights_bytes(const Call&) { throw Error("mok was built without its GPU ops"); }
#endif

}  // namespace mok::py
