// The windows through which the Layers of several GPUs reach each other (docs/multi-gpu.md), one per
// GPU, each holding the buffers its ranks expose:
//   - the GPUs 0 .. G-1 of this process on one NCCL communicator made here (ncclCommInitAll);
//   - this process's GPU of the caller's communicator (one window; the communicator stays the caller's);
//   - G colocated shares of the current device, each window plain device memory (tests; no NCCL).
// NCCL windows are symmetric (ncclMemAlloc + ncclCommWindowRegister); multicast (NVLS) is never used:
// NCCL_NVLS_ENABLE defaults to 0 for the communicators made here.
#pragma once

#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "mok/megakernel/layer.h"

namespace mok::gpu {

class PeerGroup {
 public:
  // Transport::nccl: GPUs 0 .. gpus-1; Transport::colocated: `gpus` shares of the current device.
  // `bytes` of window each, zeroed.
  PeerGroup(Transport transport, int gpus, size_t bytes);
  // GPU ncclCommUserRank of `comm` (collective: every rank of the communicator makes its group). Every rank
  // must give the same `bytes` and `fingerprint` (of its Layer's config and launch): compared before the
  // window's registration, a difference is refused on every rank.
  PeerGroup(ncclComm_t comm, size_t bytes, uint64_t fingerprint);
  ~PeerGroup();
  PeerGroup(const PeerGroup&) = delete;
  PeerGroup& operator=(const PeerGroup&) = delete;

  Transport transport() const { return transport_; }
  int gpus() const { return gpus_; }
  size_t bytes() const { return bytes_; }
  // Whether GPU g's window is held here (the caller's communicator: this process's GPU only).
  bool holds(int g) const;
  // The CUDA device of GPU g's window.
  int device(int g) const { return member(g).device; }
  // GPU g's own window.
  uint8_t* local(int g) const { return static_cast<uint8_t*>(member(g).buffer); }
  // Every GPU's window as GPU g addresses it (its own included).
  std::vector<uint8_t*> peers(int g) const;
  // The next `count` launch numbers of GPU g's Layers on this group (the first returned), taken once per
  // call. The barriers across GPUs and the relay compare the window's flags, which only grow, with them:
  // so every Layer on the group (one after another, or several side by side) numbers on from the others',
  // each GPU's Layers making their calls in the same order as every other GPU's.
  unsigned long long take_launches(int g, unsigned count) const { return member(g).launches->fetch_add(count); }

 private:
  // One GPU whose window this group holds.
  struct Member {
    int gpu = 0, device = 0;
    ncclComm_t comm = nullptr;
    void* buffer = nullptr;
    ncclWindow_t window = nullptr;
    std::shared_ptr<std::atomic<unsigned long long>> launches = std::make_shared<std::atomic<unsigned long long>>(0);
  };
  const Member& member(int g) const;
  void open_nccl(uint64_t fingerprint = 0);  // allocates, zeroes and registers every member's window
  void open_colocated();                     // plain device memory on the current device
  void release() noexcept;                   // whatever open_*() got so far

  Transport transport_;
  int gpus_;
  size_t bytes_;
  bool owns_comms_ = false;
  bool symmetric_ = false;
  std::vector<Member> members_;
};

}  // namespace mok::gpu
