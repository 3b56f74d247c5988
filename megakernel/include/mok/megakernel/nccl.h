// NCCL helpers shared by the megakernel's peer group and mok-nccl-probe: checked calls, and whether a
// communicator has symmetric memory.
#pragma once

#include <nccl.h>

#include <string>
#include <vector>

#include "mok/core/config.h"

namespace mok::gpu {

inline void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(std::string("mok: NCCL error (") + what + "): " + ncclGetErrorString(r));
}

// What NCCL's device API gives a group's communicators (ncclDevCommCreate, collective): `available`
// when every one supports symmetric memory (NCCL before 2.28.7 gives a one-rank communicator none and
// returns a host-side registration handle as its window, which no kernel may read through), and the
// fewest ranks any of them reaches by load/store (its LSA team: one NVLink domain; 0 when unavailable).
struct SymmetricMemory {
  bool available = false;
  int load_store_ranks = 0;
};
SymmetricMemory symmetric_memory(const std::vector<ncclComm_t>& comms);

}  // namespace mok::gpu

#define MOK_NCCL_CHECK(call) ::mok::gpu::check_nccl((call), #call)
