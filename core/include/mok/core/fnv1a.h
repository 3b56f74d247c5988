// FNV-1a, 64 bits: a small, stable hash of bytes (not for security), the same on every machine and run:
// the fuzzer's per-property seeds, and the fingerprint a communicator's ranks compare.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mok {

inline constexpr uint64_t kFnv1aStart = 0xcbf29ce484222325ull;

// `h` continued over `n` bytes at `bytes` (from kFnv1aStart for a fresh hash).
inline uint64_t fnv1a(const void* bytes, size_t n, uint64_t h = kFnv1aStart) {
  const auto* p = static_cast<const unsigned char*>(bytes);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace mok
