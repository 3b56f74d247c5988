// One warp computes a 16 x (8 NB) output tile as the K-step chain of mok/core/kstep.h on the tensor
// cores: acc[j] = mma(acc[j], A[:, k0:k0+16], B[k0:k0+16, 8j:8j+8]) for k0 = k_begin, k_begin + 16, ...
// Each A fragment is loaded once for the NB column blocks. Operands come through accessors returning
// packed bf16 pairs:
//   a_pair(m, k) = {A[m][k], A[m][k+1]},   b_pair(k, n) = {B[k][n], B[k+1][n]}   (k even, n < 8 NB)
#pragma once

#include "mok/megakernel/ptx/mma.cuh"

namespace mok::gpu {

struct LaneCoord {
  int group, quad;  // lane = 4 * group + quad
  __device__ LaneCoord() : group((threadIdx.x % 32) / 4), quad(threadIdx.x % 4) {}
  // The accumulator element i of this lane sits at (row(i), col(i)) of the 16x8 tile.
  __device__ int row(int i) const { return group + (i >= 2 ? 8 : 0); }
  __device__ int col(int i) const { return 2 * quad + (i & 1); }
};

// 8-column blocks per warp tile: the A fragment of each K-step serves all of them.
inline constexpr int kColBlocks = 4;
inline constexpr int kTileCols = 8 * kColBlocks;  // H, I and Is are multiples of 64, so of this

template <int NB, class APair, class BPair>
__device__ __forceinline__ void mma_chain(ptx::FragC (&acc)[NB], int k_begin, int k_end, APair a_pair, BPair b_pair) {
  const LaneCoord l;
  for (int k0 = k_begin; k0 < k_end; k0 += 16) {
    ptx::FragA fa;
    fa.r[0] = a_pair(l.group, k0 + 2 * l.quad);
    fa.r[1] = a_pair(l.group + 8, k0 + 2 * l.quad);
    fa.r[2] = a_pair(l.group, k0 + 2 * l.quad + 8);
    fa.r[3] = a_pair(l.group + 8, k0 + 2 * l.quad + 8);
#pragma unroll
    for (int j = 0; j < NB; ++j) {
      ptx::FragB fb;
      fb.r[0] = b_pair(k0 + 2 * l.quad, 8 * j + l.group);
      fb.r[1] = b_pair(k0 + 2 * l.quad + 8, 8 * j + l.group);
      ptx::mma_bf16_16816(acc[j], fa, fb);
    }
  }
}

// Visits this lane's accumulator elements as store(row, col, value), row < 16, col < 8 NB.
template <int NB, class Store>
__device__ __forceinline__ void store_tile(const ptx::FragC (&acc)[NB], Store store) {
  const LaneCoord l;
#pragma unroll
  for (int j = 0; j < NB; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) store(l.row(i), 8 * j + l.col(i), acc[j].v[i]);
}

// A pair of consecutive bf16 along a contiguous row (4-byte aligned: k even, rows of even length).
__device__ __forceinline__ uint32_t contiguous_pair(const bf16* row, int k) {
  return *reinterpret_cast<const uint32_t*>(row + k);
}

}  // namespace mok::gpu
