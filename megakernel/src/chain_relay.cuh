// Across GPUs: the chains over every token (the shared expert's weight gradients, the router's),
// continued GPU after GPU (params.cuh, ChainRelay; docs/multi-gpu.md, "The shared expert and the router
// across GPUs"). Here: the relay's sizes, shared by the host's window layout and the kernels, and the
// hand-over of one unit: wait for its flag, read it; write it, raise the flag.
#pragma once

#include "chain_tiles.cuh"
#include "gemm_geometry.cuh"
#include "grid_sync.cuh"

namespace mok::gpu {

// The shared expert's weight gradients in output tiles: dW1_s [2Is, H] (grad 0), dW2_s [H, Is] (grad 1).
__host__ __device__ inline long shared_grad_tiles(const LayerConfig& c, int grad) {
  const long Is = c.shared_intermediate, H = c.hidden, m = grad == 0 ? 2 * Is : H, n = grad == 0 ? H : Is;
  return Is ? (m + kTileRows - 1) / kTileRows * ((n + kTileN - 1) / kTileN) : 0;
}

// The relay's units and floats: each shared-gradient tile's two consumer halves, then the router
// gradient's chain tiles (ChainRelay; its floats in d_router's order).
struct RelaySizes {
  long tile_units, router_tiles, floats;
  __host__ __device__ long units() const { return tile_units + router_tiles; }
};
inline constexpr long kHalfTileFloats = long(kWgmmaM) * kTileN;
__host__ __device__ inline RelaySizes relay_sizes(const LayerConfig& c) {
  const long tiles = shared_grad_tiles(c, 0) + shared_grad_tiles(c, 1), router = long(c.experts) * c.hidden;
  return RelaySizes{kConsumers * tiles, chain_tile_count(c.experts, c.hidden),
                    tiles * kConsumers * kHalfTileFloats + router};
}

// The router gradient's partial sums after the tiles' (element i of d_router, and its chain tile's unit).
__device__ __forceinline__ float* router_relay(float* in, const LayerConfig& c) {
  return in + relay_sizes(c).tile_units * kHalfTileFloats;
}
__device__ __forceinline__ long router_unit(const LayerConfig& c, long tile) {
  return relay_sizes(c).tile_units + tile;
}

// Waits until this GPU's flag of `unit` reaches `value` (every waiting thread acquires it itself). A
// peer's abort ends the wait at once; the watchdog names the GPU that did not hand over (kRelayTimeout).
// False: the launch stops on an error; what follows computes void values, which the launch discards and
// the callers hand on to no GPU.
__device__ __forceinline__ bool relay_wait(const GridBarrier& b, const ChainRelay& r, long unit, unsigned int value,
                                           int from, int phase) {
  return wait_for_peer(b, r.in_flags + unit, value, ptx::global_timer_ns(), kRelayTimeout, phase, 0, from);
}

// Where a GPU hands its sums of a unit: the next GPU its partials, or, the last GPU, every other GPU
// the results: GPUs [first, end).
struct RelayTargets {
  int first, end;
  unsigned int value;
};
__device__ __forceinline__ RelayTargets relay_targets(const GridBarrier& b, const ChainRelay& r) {
  const int me = b.peers.me, gpus = b.peers.gpus;
  return me + 1 < gpus ? RelayTargets{me + 1, me + 2, r.partial} : RelayTargets{0, gpus - 1, r.result};
}

// Raises the targets' flags of `unit` once every thread of the caller's group has written its part:
// each thread fences its own writes at system scope, `sync` gathers the group, one thread releases the
// flags.
template <class Sync>
__device__ __forceinline__ void relay_raise(const ChainRelay& r, RelayTargets to, long unit, bool leader, Sync sync) {
  __threadfence_system();
  sync();
  if (leader)
    for (int j = to.first; j < to.end; ++j) ptx::store_release_sys(r.out_flags[j] + unit, to.value);
}

// One consumer thread's 128 accumulators of a relayed half tile: read from this GPU's window (L2, not
// L1: the unit is read twice a launch, a partial and then the result), or from the half tile of zeros
// (`zeros`: the first GPU's chains), written to a peer's. The accumulators are always loaded, never
// set in one branch and loaded in another: ptxas then serializes every wgmma of the kernel (C7515).
__device__ __forceinline__ float4* half_tile(float* base, long unit) {
  return reinterpret_cast<float4*>(base + unit * kHalfTileFloats) + threadIdx.x % kWarpgroupThreads;
}
__device__ __forceinline__ void load_half_tile(const ChainRelay& r, long unit, bool zeros,
                                               float (&acc)[kAccumulators]) {
  const float4* in = half_tile(zeros ? const_cast<float*>(r.zeros) : r.in, zeros ? 0 : unit);
#pragma unroll
  for (int i = 0; i < kAccumulators; i += 4) {
    const float4 v = __ldcg(in + i / 4 * kWarpgroupThreads);
    acc[i] = v.x, acc[i + 1] = v.y, acc[i + 2] = v.z, acc[i + 3] = v.w;
  }
}
__device__ __forceinline__ void store_half_tile(const ChainRelay& r, int to, long unit,
                                                const float (&acc)[kAccumulators]) {
  float4* out = half_tile(r.out[to], unit);
#pragma unroll
  for (int i = 0; i < kAccumulators; i += 4)
    out[i / 4 * kWarpgroupThreads] = {acc[i], acc[i + 1], acc[i + 2], acc[i + 3]};
}

}  // namespace mok::gpu
