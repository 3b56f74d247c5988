// The GPUs of one process as one NCCL communicator, each with a symmetric window holding the buffers
// its ranks expose (docs/multi-gpu.md). Multicast (NVLS) is never used: NCCL_NVLS_ENABLE defaults to 0.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <vector>

namespace mok::gpu {

class PeerGroup {
 public:
  // GPUs 0 .. gpus-1, `bytes` of window each (zeroed).
  PeerGroup(int gpus, size_t bytes);
  ~PeerGroup();
  PeerGroup(const PeerGroup&) = delete;
  PeerGroup& operator=(const PeerGroup&) = delete;

  int gpus() const { return int(comms_.size()); }
  // GPU g's own window.
  uint8_t* local(int g) const { return static_cast<uint8_t*>(buffers_[g]); }
  // Every GPU's window as GPU g addresses it (its own included).
  std::vector<uint8_t*> peers(int g) const;

 private:
  void open(size_t bytes);
  void release() noexcept;  // whatever open() got so far

  std::vector<ncclComm_t> comms_;
  std::vector<void*> buffers_;
  std::vector<ncclWindow_t> windows_;
  bool symmetric_ = false;
};

}  // namespace mok::gpu
