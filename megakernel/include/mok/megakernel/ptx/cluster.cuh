// Thin wrappers of the thread block cluster's instructions (sm_90a) that the paired blocks use
// (LaunchConfig::paired_blocks): the block's rank in its cluster, arrivals on a peer block's mbarrier,
// the TMA's multicast load, and the cluster's hardware barrier. One place for this inline PTX.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "tma.cuh"

namespace mok::gpu::ptx {

// This block's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// An arrival, with `arrive` set, on the mbarrier at bar's offset in block `rank` of the cluster, predicated
// inside the instruction as mbarrier_arrive_if (the default semantics, as CUTLASS's cluster pipelines: a
// .release.cluster arrival, with the producer's .acquire.cluster wait, made the sharing phases 1.6-1.9x
// slower, docs/benchmarks.md session 57).
__device__ __forceinline__ void mbarrier_arrive_remote_if(uint64_t* bar, uint32_t rank, bool arrive) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      ".reg .b32 remote;\n"
      "setp.ne.u32 p, %2, 0;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "@p mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(rank), "r"(uint32_t(arrive))
      : "memory");
}

// One arrival of this thread on the mbarrier at bar's offset in block `rank` of the cluster, release at
// cluster scope: everything this thread's block ordered before it (its threads' arrivals at this block's
// barriers included, behind a block barrier) is ordered before the arrival (the pair's meetings).
__device__ __forceinline__ void mbarrier_arrive_remote_release(uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(rank)
      : "memory");
}

// mbarrier_try_wait with acquire at cluster scope: what the peer block did before its arrival (release at
// cluster scope) is ordered before what follows.
__device__ __forceinline__ bool mbarrier_try_wait_cluster(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_address(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// tma_load_2d's box into the same offset of the shared memory of every block in `blocks` (a mask of
// cluster ranks), each copy's bytes completing on the mbarrier at bar's offset in its block.
__device__ __forceinline__ void tma_load_2d_multicast(void* smem, const CUtensorMap* map, int c0, int c1, uint64_t* bar,
                                                      uint16_t blocks) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, "
      "{%2, %3}], [%4], %5;\n" ::"r"(smem_address(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_address(bar)), "h"(blocks)
      : "memory");
}

// Every thread of every block of the cluster meets here (the hardware's cluster barrier: no watchdog, so
// only where every block of the cluster comes whatever happened: a paired launch's start and its end).
__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release;\n"
      "barrier.cluster.wait.acquire;\n" ::
          : "memory");
}

}  // namespace mok::gpu::ptx
