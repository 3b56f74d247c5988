// SHA-256 (FIPS 180-4), incremental: the per-dataset digests of the golden format.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace mok::golden {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  std::array<uint8_t, 32> finish();  // the object is spent afterwards

 private:
  void compress(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> block_{};
  size_t block_used_ = 0;
  uint64_t total_bytes_ = 0;
};

// A digest as 64 lower-case hex digits.
std::string to_hex(const std::array<uint8_t, 32>& digest);

// The digest of one buffer, in hex.
std::string sha256_hex(const void* data, size_t size);

}  // namespace mok::golden
