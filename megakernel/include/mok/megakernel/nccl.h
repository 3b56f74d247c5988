// NCCL helpers shared by the megakernel's peer group and mok-nccl-probe: checked calls, and whether a
// communicator has symmetric memory.
#pragma once

#include <nccl.h>

#include <string>
#include <vector>

#include "mok/core/config.h"

namespace mok::gpu {

// NCCL's account of the failed call `what`: its result's string, which for most results says only "invalid
// usage" or "unhandled system error", and the last warning NCCL logged (ncclGetLastError), where it says why
// (a warning of this process's NCCL, the latest: NCCL keeps no per-call message).
inline std::string nccl_error(ncclResult_t r, const char* what) {
  std::string message = std::string("NCCL error (") + what + "): " + ncclGetErrorString(r);
  const char* warning = ncclGetLastError(nullptr);
  if (warning != nullptr && *warning != '\0') message += "; NCCL's last warning: " + std::string(warning);
  return message;
}

inline void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error("mok: " + nccl_error(r, what));
}

// What NCCL's device API gives a group's communicators (ncclDevCommCreate, collective): `available`
// when every one supports symmetric memory (NCCL before 2.28.7 gives a one-rank communicator none and
// returns a host-side registration handle as its window, which no kernel may read through), and the
// fewest ranks any of them reaches by load/store (its LSA team: one NVLink domain; 0 when unavailable).
// NCCL refuses a communicator without symmetric memory with ncclInvalidUsage (src/dev_runtime.cc, 2.28):
// that refusal is "unavailable", NCCL's reason kept in `refusal`; any other failure throws mok::Error.
struct SymmetricMemory {
  bool available = false;
  int load_store_ranks = 0;
  std::string refusal{};  // nccl_error() of NCCL's refusal, when unavailable
};
SymmetricMemory symmetric_memory(const std::vector<ncclComm_t>& comms);

}  // namespace mok::gpu

#define MOK_NCCL_CHECK(call) ::mok::gpu::check_nccl((call), #call)
