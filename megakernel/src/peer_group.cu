// NCCL symmetric windows for the megakernel's ranks across GPUs: ncclMemAlloc + ncclCommWindowRegister,
// peer addresses from the device API (ncclGetPeerPointer, world ranks) read once by a setup kernel.
#include <nccl_device.h>

#include <cstdlib>
#include <string>

#include "current_device.h"
#include "device_array.cuh"
#include "mok/megakernel/check.h"
#include "mok/megakernel/nccl.h"
#include "peer_group.h"

namespace mok::gpu {
namespace {

// ncclGroupStart .. ncclGroupEnd, the group ended on every path: a thread left inside a group by an
// exception would queue every later NCCL call of the thread.
class NcclGroup {
 public:
  NcclGroup() { MOK_NCCL_CHECK(ncclGroupStart()); }
  ~NcclGroup() {
    if (open_) ncclGroupEnd();
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  ncclResult_t end() {
    open_ = false;
    return ncclGroupEnd();
  }

 private:
  bool open_ = true;
};

__global__ void peer_windows(ncclWindow_t window, int gpus, void** out) {
  for (int j = threadIdx.x; j < gpus; j += blockDim.x) out[j] = ncclGetPeerPointer(window, 0, j);
}

}  // namespace

bool has_symmetric_memory(const std::vector<ncclComm_t>& comms) {
  ncclDevCommRequirements_t requirements{};
  std::vector<ncclDevComm_t> dev(comms.size());
  size_t created = 0;
  NcclGroup create;
  while (created < comms.size() && ncclDevCommCreate(comms[created], &requirements, &dev[created]) == ncclSuccess)
    ++created;
  if (create.end() != ncclSuccess) return false;
  NcclGroup destroy;  // the probe needs no device communicator: destroy what was made
  for (size_t r = 0; r < created; ++r) MOK_NCCL_CHECK(ncclDevCommDestroy(comms[r], &dev[r]));
  MOK_NCCL_CHECK(destroy.end());
  return created == comms.size();
}

PeerGroup::PeerGroup(int gpus, size_t bytes) : comms_(gpus), buffers_(gpus), windows_(gpus) {
  try {
    open(bytes);
  } catch (...) {
    release();
    throw;
  }
}

void PeerGroup::open(size_t bytes) {
  const int gpus = int(comms_.size());
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  std::vector<int> devices(gpus);
  for (int g = 0; g < gpus; ++g) devices[g] = g;
  MOK_NCCL_CHECK(ncclCommInitAll(comms_.data(), gpus, devices.data()));
  for (int g = 0; g < gpus; ++g) {
    MOK_CUDA_CHECK(cudaSetDevice(g));
    MOK_NCCL_CHECK(ncclMemAlloc(&buffers_[g], bytes));
    MOK_CUDA_CHECK(cudaMemset(buffers_[g], 0, bytes));
  }
  NcclGroup group;
  for (int g = 0; g < gpus; ++g)
    MOK_NCCL_CHECK(ncclCommWindowRegister(comms_[g], buffers_[g], bytes, &windows_[g], NCCL_WIN_COLL_SYMMETRIC));
  MOK_NCCL_CHECK(group.end());
  symmetric_ = has_symmetric_memory(comms_);
  // One GPU without symmetric memory (NCCL < 2.28.7) still has its own buffer; several need windows.
  require(symmetric_ || gpus == 1,
          "mok: NCCL gives these " + std::to_string(gpus) + " GPUs no symmetric memory (ncclDevCommCreate refused)");
}

PeerGroup::~PeerGroup() { release(); }

void PeerGroup::release() noexcept {
  const KeepCurrentDevice keep;
  ncclGroupStart();
  for (size_t g = 0; g < comms_.size(); ++g)
    if (windows_[g]) ncclCommWindowDeregister(comms_[g], windows_[g]);
  ncclGroupEnd();
  for (size_t g = 0; g < comms_.size(); ++g) {
    cudaSetDevice(int(g));
    if (buffers_[g]) ncclMemFree(buffers_[g]);
    if (comms_[g]) ncclCommDestroy(comms_[g]);
  }
}

std::vector<uint8_t*> PeerGroup::peers(int g) const {
  const int gpus = int(comms_.size());
  if (!symmetric_) return {local(g)};
  MOK_CUDA_CHECK(cudaSetDevice(g));
  DeviceArray<void*> out(gpus);
  peer_windows<<<1, 32>>>(windows_[g], gpus, out.get());
  MOK_CUDA_CHECK(cudaGetLastError());
  std::vector<uint8_t*> bases;
  for (void* p : out.download()) bases.push_back(static_cast<uint8_t*>(p));
  return bases;
}

}  // namespace mok::gpu
