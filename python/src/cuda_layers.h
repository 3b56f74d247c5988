// The GPU side of the extension, present where the megakernel is built (MOK_WITH_CUDA).
#pragma once

namespace mok::py {

#ifdef MOK_WITH_CUDA
inline constexpr bool kHaveCudaLayers = true;
// Waits for every cached GPU layer's stream and raises the first error its kernels recorded.
void check_cuda_layers();
#else
inline constexpr bool kHaveCudaLayers = false;
inline void check_cuda_layers() {}
#endif

}  // namespace mok::py
