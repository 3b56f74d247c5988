// The output tiles of chain_gemm.cuh's products, apart from the kernel code: the host sizes the relay
// of the router gradient's tiles across GPUs by them (chain_relay.cuh).
#pragma once

namespace mok::gpu {

inline constexpr int kChainM = 96, kChainN = 64;  // an output tile's rows and columns

// The output tiles of an M x N product, row-major: tile `index` starts at row m0, column n0.
struct ChainTile {
  long index, m0, n0;
};
__host__ __device__ inline long chain_n_tiles(long N) { return (N + kChainN - 1) / kChainN; }
__host__ __device__ inline long chain_tile_count(long M, long N) {
  return (M + kChainM - 1) / kChainM * chain_n_tiles(N);
}
__device__ __forceinline__ ChainTile chain_tile(long index, long N) {
  return {index, index / chain_n_tiles(N) * kChainM, index % chain_n_tiles(N) * kChainN};
}

}  // namespace mok::gpu
