// The windows of the megakernel's ranks across GPUs: NCCL symmetric windows (ncclMemAlloc +
// ncclCommWindowRegister, peer addresses from the device API, ncclGetPeerPointer with world ranks, read
// once by a setup kernel), or plain device memory for colocated shares of one GPU.
#include <nccl_device.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
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

// What the ranks of the caller's communicator learn of each other before the collective registration: a rank
// that failed to allocate its window, or whose first call differs (another T, config or launch), would
// otherwise leave its peers waiting in ncclCommWindowRegister, register a window of another size, or run
// the layer mismatched. One all-reduce (max) of each value and its negation gives every rank the largest
// and the smallest. Its buffer and stream are made before the window, so a rank short of memory for the
// window still takes part.
class Agreement {
 public:
  Agreement() : values_(4) { MOK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Agreement() { (void)cudaStreamDestroy(stream_); }
  Agreement(const Agreement&) = delete;
  Agreement& operator=(const Agreement&) = delete;

  // allocated: this rank's ncclMemAlloc of `window` bytes; fingerprint: its Layer's (63 bits: it negates).
  void compare(ncclComm_t comm, ncclResult_t allocated, long long window, long long fingerprint) {
    const long long held = allocated == ncclSuccess ? window : 0;
    const long long mine[4] = {held, -held, fingerprint, -fingerprint};
    // On the all-reduce's stream: a pageable copy on another may still be in flight when the reduce reads.
    MOK_CUDA_CHECK(cudaMemcpyAsync(values_.get(), mine, sizeof(mine), cudaMemcpyHostToDevice, stream_));
    MOK_NCCL_CHECK(ncclAllReduce(values_.get(), values_.get(), 4, ncclInt64, ncclMax, comm, stream_));
    MOK_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const std::vector<long long> r = values_.download();
    check_nccl(allocated, "ncclMemAlloc");  // this rank's own failure first
    if (-r[1] == 0) throw Error("mok: another rank of the communicator could not allocate its window");
    require(r[0] == -r[1] && r[2] == -r[3], [&] {
      return "the ranks' first calls of this layer differ (windows of " + std::to_string(-r[1]) + " to " +
             std::to_string(r[0]) + " bytes, " + (r[2] == -r[3] ? "one" : "several") +
             " config and launch fingerprint(s)): every rank makes the same calls, with the same tokens per rank, "
             "config and launch arguments";
    });
  }

 private:
  DeviceArray<long long> values_;
  cudaStream_t stream_ = nullptr;
};

__global__ void peer_windows(ncclWindow_t window, int gpus, void** out) {
  for (int j = threadIdx.x; j < gpus; j += blockDim.x) out[j] = ncclGetPeerPointer(window, 0, j);
}

}  // namespace

SymmetricMemory symmetric_memory(const std::vector<ncclComm_t>& comms) {
  ncclDevCommRequirements_t requirements{};
  std::vector<ncclDevComm_t> dev(comms.size());
  NcclGroup create;
  for (size_t r = 0; r < comms.size(); ++r) {
    const ncclResult_t made = ncclDevCommCreate(comms[r], &requirements, &dev[r]);
    if (made == ncclInvalidUsage) {  // NCCL's "no symmetric memory", refused before any work was queued
      SymmetricMemory none{.refusal = nccl_error(made, "ncclDevCommCreate")};  // before the group's end logs more
      create.end();  // fails with the same refusal (the group's error): nothing was made, nothing to destroy
      return none;
    }
    check_nccl(made, "ncclDevCommCreate");  // a real failure (CUDA, memory): the group ended by its destructor
  }
  // The device communicators are made at the group's end: a failure there is a real one too.
  check_nccl(create.end(), "ncclGroupEnd after ncclDevCommCreate");
  int fewest_lsa_ranks = dev.empty() ? 0 : dev[0].lsaSize;
  for (const ncclDevComm_t& d : dev) fewest_lsa_ranks = std::min(fewest_lsa_ranks, d.lsaSize);
  NcclGroup destroy;  // the probe needs no device communicator: destroy what was made
  for (size_t r = 0; r < comms.size(); ++r) MOK_NCCL_CHECK(ncclDevCommDestroy(comms[r], &dev[r]));
  MOK_NCCL_CHECK(destroy.end());
  return {.available = true, .load_store_ranks = fewest_lsa_ranks};
}

PeerGroup::PeerGroup(Transport transport, int gpus, size_t bytes) : transport_(transport), gpus_(gpus), bytes_(bytes) {
  try {
    if (transport == Transport::colocated) {
      open_colocated();
      return;
    }
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    std::vector<ncclComm_t> comms(gpus);
    std::vector<int> devices(gpus);
    for (int g = 0; g < gpus; ++g) devices[g] = g;
    MOK_NCCL_CHECK(ncclCommInitAll(comms.data(), gpus, devices.data()));
    owns_comms_ = true;
    for (int g = 0; g < gpus; ++g) members_.push_back(Member{g, g, comms[g]});
    open_nccl();
  } catch (...) {
    release();
    throw;
  }
}

PeerGroup::PeerGroup(ncclComm_t comm, size_t bytes, uint64_t fingerprint)
    : transport_(Transport::nccl), gpus_(0), bytes_(bytes) {
  Member m;
  m.comm = comm;
  MOK_NCCL_CHECK(ncclCommCount(comm, &gpus_));
  MOK_NCCL_CHECK(ncclCommUserRank(comm, &m.gpu));
  MOK_NCCL_CHECK(ncclCommCuDevice(comm, &m.device));
  members_.push_back(m);
  try {
    open_nccl(fingerprint);
  } catch (...) {
    release();
    throw;
  }
}

void PeerGroup::open_nccl(uint64_t fingerprint) {
  const KeepCurrentDevice keep;
  for (Member& m : members_) {
    MOK_CUDA_CHECK(cudaSetDevice(m.device));
    std::optional<Agreement> agreement;  // the caller's communicator: one rank of several processes
    if (!owns_comms_) agreement.emplace();
    const ncclResult_t allocated = ncclMemAlloc(&m.buffer, bytes_);
    if (allocated != ncclSuccess) m.buffer = nullptr;  // nothing for release() to free
    if (agreement) agreement->compare(m.comm, allocated, (long long)bytes_, (long long)(fingerprint >> 1));
    check_nccl(allocated, "ncclMemAlloc");
    // The flags of the barrier across GPUs start at zero: zeroed before the registration, which no
    // rank leaves before every rank entered it, so no peer's kernel can write the window earlier.
    MOK_CUDA_CHECK(cudaMemset(m.buffer, 0, bytes_));
    MOK_CUDA_CHECK(cudaDeviceSynchronize());
  }
  NcclGroup group;  // collective: this process's communicators register together
  for (Member& m : members_)
    MOK_NCCL_CHECK(ncclCommWindowRegister(m.comm, m.buffer, bytes_, &m.window, NCCL_WIN_COLL_SYMMETRIC));
  MOK_NCCL_CHECK(group.end());
  std::vector<ncclComm_t> comms;
  for (const Member& m : members_) comms.push_back(m.comm);
  const SymmetricMemory memory = symmetric_memory(comms);
  symmetric_ = memory.available;
  // One GPU without symmetric memory (e.g. NCCL < 2.28.7, or NCCL_WIN_ENABLE=0) still has its own buffer; several
  // need windows.
  require(symmetric_ || gpus_ == 1,
          [&] { return "NCCL gives these " + std::to_string(gpus_) + " GPUs no symmetric memory: " + memory.refusal; });
  // Every byte between GPUs is a load or a store through a window: a peer beyond the NVLink domain
  // (another node) has no address in it.
  require(!symmetric_ || memory.load_store_ranks == gpus_, [&] {
    return "the communicator's " + std::to_string(gpus_) + " GPUs are not all reachable by load/store (NCCL's LSA " +
           "team holds " + std::to_string(memory.load_store_ranks) +
           "; another node?): mok's windows need every GPU in one NVLink domain (docs/multi-gpu.md, \"Across nodes\")";
  });
}

void PeerGroup::open_colocated() {
  int device = 0;
  MOK_CUDA_CHECK(cudaGetDevice(&device));
  for (int g = 0; g < gpus_; ++g) {
    members_.push_back(Member{g, device});
    MOK_CUDA_CHECK(cudaMalloc(&members_.back().buffer, bytes_));
    MOK_CUDA_CHECK(cudaMemset(members_.back().buffer, 0, bytes_));
  }
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
}

PeerGroup::~PeerGroup() { release(); }

void PeerGroup::release() noexcept {
  const KeepCurrentDevice keep;
  for (const Member& m : members_) {  // no kernel may still reach a window that goes
    cudaSetDevice(m.device);
    cudaDeviceSynchronize();
  }
  if (transport_ == Transport::nccl) {
    ncclGroupStart();
    for (const Member& m : members_)
      if (m.window) ncclCommWindowDeregister(m.comm, m.window);
    ncclGroupEnd();
  }
  for (const Member& m : members_) {
    cudaSetDevice(m.device);
    if (m.buffer && transport_ == Transport::nccl) ncclMemFree(m.buffer);
    if (m.buffer && transport_ == Transport::colocated) cudaFree(m.buffer);
    if (owns_comms_ && m.comm) ncclCommDestroy(m.comm);  // never the caller's communicator
  }
}

bool PeerGroup::holds(int g) const {
  return std::any_of(members_.begin(), members_.end(), [&](const Member& m) { return m.gpu == g; });
}

const PeerGroup::Member& PeerGroup::member(int g) const {
  for (const Member& m : members_)
    if (m.gpu == g) return m;
  fail_internal("the peer group does not hold GPU " + std::to_string(g));
}

std::vector<uint8_t*> PeerGroup::peers(int g) const {
  std::vector<uint8_t*> bases;
  if (transport_ == Transport::colocated) {  // one device: every window's own address
    for (const Member& m : members_) bases.push_back(static_cast<uint8_t*>(m.buffer));
    return bases;
  }
  if (!symmetric_) return {local(g)};
  const Member& m = member(g);
  const KeepCurrentDevice keep;
  MOK_CUDA_CHECK(cudaSetDevice(m.device));
  DeviceArray<void*> out(gpus_);
  peer_windows<<<1, 32>>>(m.window, gpus_, out.get());
  MOK_CUDA_CHECK(cudaGetLastError());
  for (void* p : out.download()) bases.push_back(static_cast<uint8_t*>(p));
  return bases;
}

}  // namespace mok::gpu
