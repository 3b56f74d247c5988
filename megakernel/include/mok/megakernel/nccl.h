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

// True when every communicator of the group supports symmetric memory: ncclDevCommCreate (collective)
// refuses one without it. NCCL before 2.28.7 gives a one-rank communicator none and returns a
// host-side registration handle as its window, which no kernel may read through.
bool has_symmetric_memory(const std::vector<ncclComm_t>& comms);

}  // namespace mok::gpu

#define MOK_NCCL_CHECK(call) ::mok::gpu::check_nccl((call), #call)
