// The probe tools' operands (mok-fp8-chain, mok-gather-probe): device bytes of random codes, and the
// tiles of a GEMM over experts.
#pragma once

#include <cstddef>
#include <cstdint>

#include "device_array.cuh"
#include "gemm_geometry.cuh"
#include "mok/megakernel/check.h"

namespace mok::gpu {

// A hash of an index: the random codes' and mok-gather-probe's tokens.
__device__ __forceinline__ uint32_t index_hash(uint64_t i) {
  uint32_t h = uint32_t(i) * 0x9e3779b9u ^ uint32_t(i >> 32) * 0x85ebca6bu;
  h ^= h >> 15, h *= 0x2c1b3c6du, h ^= h >> 12;
  return h;
}

// Random codes (index_hash): E4M3 bytes without NaN, or bf16 words of magnitude 2^-7 .. 2^8.
static __global__ void random_codes(uint8_t* p, size_t bytes, bool fp8) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < bytes / 2; i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t h = index_hash(i);
    if (fp8) {
      for (int j = 0; j < 2; ++j) {
        const uint8_t c = uint8_t(h >> (8 * j));
        p[2 * i + j] = (c & 0x7f) == 0x7f ? uint8_t(c ^ 1) : c;  // 0x7f and 0xff are NaN
      }
    } else {
      const uint16_t word = uint16_t((h & 0x807f) | ((120 + (h >> 16) % 16) << 7));
      reinterpret_cast<uint16_t*>(p)[i] = word;
    }
  }
}

// `bytes` of device memory: random codes (random_codes), or every byte `value`.
inline DeviceArray<uint8_t> device_bytes(size_t bytes, bool random, bool fp8, int value, int sms) {
  DeviceArray<uint8_t> p(bytes);
  if (random) {
    random_codes<<<4 * sms, 256>>>(p.get(), bytes, fp8);
    MOK_CUDA_CHECK(cudaGetLastError());
  } else {
    MOK_CUDA_CHECK(cudaMemset(p.get(), value, bytes));
  }
  return p;
}

// The tiles of C = A B^T over experts: each expert's tiles_m row tiles of A (128 rows) times its own
// tiles_n column tiles of B (`columns` rows: 256, or mok-fp8-chain's narrow 128; mok-gather-probe loads 256),
// numbered expert by expert, n fastest (the tiles in flight share A's rows and the expert's B, as a ring
// phase's do).
struct ExpertTiles {
  int experts, tiles_m, tiles_n, columns = kTileN;

  __host__ __device__ int count() const { return experts * tiles_m * tiles_n; }
  __device__ int a_row(int t) const { return t / tiles_n * kTileRows; }  // tile t's first row of A
  __device__ int b_row(int t) const { return (t / tiles_n / tiles_m * tiles_n + t % tiles_n) * columns; }  // of B
};

}  // namespace mok::gpu
