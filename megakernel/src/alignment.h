// The kernels move rows in 16-byte vectors and the TMA reads from 16-byte aligned bases: every pointer
// a call is given is checked for it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "mok/core/config.h"

namespace mok::gpu {

// The message, "<where><name> is not 16-byte aligned", is built only on failure: this runs for every
// tensor of every call.
inline void require_aligned16(const void* data, const char* name, std::string_view where = {}) {
  require(reinterpret_cast<uintptr_t>(data) % 16 == 0,
          [&] { return std::string(where) + name + " is not 16-byte aligned"; });
}

}  // namespace mok::gpu
