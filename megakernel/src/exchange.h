// Where the ranks' shared buffers live, and how a call's tensors reach them (docs/multi-gpu.md):
//   simulated: every rank on this GPU; the kernels read and write the caller's tensors directly, and
//     the (token, slot) buffers are in the workspace;
//   windows:   ranks over several GPUs (or colocated shares of one); each GPU's window holds x and dy of
//     its shared expert's tokens (its own first, then the next GPU's few: Params::x), global-size
//     [N, ...] views of the routing (its own ranks' slices are its), its own tokens' pushed (token, slot)
//     rows and the chains' relay (ChainRelay), which its peers reach over NVLink. The caller's per-token
//     tensors hold this GPU's tokens only: a call copies them into the window before the launch and its
//     results out after it (stream-ordered), since the peers can reach only the window.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "mok/megakernel/layer.h"
#include "params.cuh"

namespace mok::gpu {

class PeerGroup;

// A view's data as T (the views were checked by the Layer).
template <class T>
T* ptr(const TensorView& v) {
  return static_cast<T*>(v.data);
}

class Exchange {
 public:
  Exchange() = default;
  // peers: null for simulated ranks; else GPU `gpu`'s place in the group.
  Exchange(const LayerConfig& c, int gpu, const PeerGroup* peers);

  bool windowed() const { return !windows_.empty(); }

  // Bytes of each GPU's window for this config over `gpus` GPUs.
  static size_t window_bytes(const LayerConfig& c, int gpus) { return window_layout(c, gpus).bytes; }

  // The barrier across GPUs and the abort words of launch number `launches` (its counter: `count`,
  // in the workspace).
  PeerSync peer_sync(unsigned long long launches, unsigned int* count) const;
  // The chains' relay of launch number `launches` (empty when not windowed).
  ChainRelay relay(unsigned long long launches) const;

  // Points p's rank table and global views at this call's buffers (slots: the workspace's (token, slot)
  // buffers, unused when windowed) and copies this GPU's inputs in where windowed.
  void bind_forward(Params& p, cudaStream_t stream, const ForwardInputs& in, const ForwardOutputs& out,
                    uint8_t* slots) const;
  void after_forward(cudaStream_t stream, const ForwardInputs& in, const ForwardOutputs& out) const;
  void bind_backward(Params& p, cudaStream_t stream, const ForwardInputs& in, const ForwardOutputs& fwd,
                     const TensorView& dy, const GradOutputs& grads, uint8_t* slots) const;
  void after_backward(cudaStream_t stream, const GradOutputs& grads) const;

 private:
  // The window's sections: x and dy of the shared expert's tokens; global-size views of the routing and
  // d topk_w; the (token, slot) rows, which only their tokens' owner reads (its own ranks' slices: 1/G
  // of the size); the flag words of the barrier across GPUs and the abort word (params.cuh, PeerSync);
  // the relay's partial sums and flags (ChainRelay).
  struct WindowLayout {
    size_t x, dy, topk_idx, topk_w, slots, d_topk_w, flags, abort, relay, relay_flags, relay_zeros, bytes;
  };
  static WindowLayout window_layout(const LayerConfig& c, int gpus);

  RankBuffers rank_buffers(int r) const;  // windowed: rank r's slice of its owner's window
  void bind_window(Params& p) const;
  // A per-token tensor's rows of this GPU's tokens: from the caller's tensor (which holds only them)
  // into this GPU's slice of a global view of the window (or the start of a view of its own tokens,
  // first_token 0), and back.
  void copy_in(cudaStream_t stream, void* view, const TensorView& local, size_t bytes_per_token,
               size_t first_token) const;
  void copy_out(cudaStream_t stream, const TensorView& local, const void* view, size_t bytes_per_token) const;
  size_t own_first_token() const { return gpu_ * own_tokens(); }
  size_t own_tokens() const { return size_t(c_.tokens()) / gpus_; }

  LayerConfig c_{};
  int gpu_ = 0, gpus_ = 1;
  WindowLayout at_{};
  uint8_t* own_ = nullptr;         // this GPU's window, its own allocation's address
  std::vector<uint8_t*> windows_;  // each GPU's window through its peer mapping (empty: simulated)
};

}  // namespace mok::gpu
