// Thin wrappers of Hopper's bulk tensor copy engine (TMA) and the shared-memory barriers (mbarrier)
// that count its bytes (sm_90a). One place for this inline PTX.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace mok::gpu::ptx {

// The shared-memory window address of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A barrier whose phases complete after `arrivals` arrivals (and every byte they announced).
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(arrivals) : "memory");
}

// Barrier initialisation becomes visible to the async proxy (the TMA unit) and the other threads.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival of this thread.
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}

// An arrival by the threads with `arrive` set, predicated inside the instruction: no branch, so no
// divergent path next to an in-flight wgmma group.
__device__ __forceinline__ void mbarrier_arrive_if(uint64_t* bar, bool arrive) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.u32 p, %1, 0;\n"
      "@p mbarrier.arrive.shared::cta.b64 _, [%0];\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(uint32_t(arrive))
      : "memory");
}

// One arrival that also announces `bytes` still to land through TMA copies completing on `bar`.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}

// True once the barrier's phase with the given parity has completed (a bounded hardware wait).
__device__ __forceinline__ bool mbarrier_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_address(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// Box {c0 (inner, elements), c1 (rows)} of a 2-D tensor map into shared memory; the copy's bytes
// complete on `bar`. Out-of-bounds elements arrive as zeros (and still count).
__device__ __forceinline__ void tma_load_2d(void* smem, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_address(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_address(bar))
      : "memory");
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global into shared memory, one bulk
// copy; its bytes complete on `bar`.
__device__ __forceinline__ void bulk_load(void* smem, const void* global, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_address(smem)),
               "l"(global), "r"(bytes), "r"(smem_address(bar))
               : "memory");
}

// Box {c0 (inner, elements), c1 (rows)} of a 2-D tensor map from shared memory to global memory, a
// bulk copy of this thread's open bulk async-group (bulk_commit_group closes it). Elements outside the
// map's bounds are not written.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* smem, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_address(smem)), "r"(c0), "r"(c1)
               : "memory");
}

// The same box added into global memory by the TMA (its reduce-add, of the map's element type): under an
// fp32 map the IEEE add, round to nearest with subnormals kept (red.global.add.f32 flushes them); under
// a bf16 map one correctly rounded bf16 add, autograd's; a NaN sum the canonical NaN (core gradient_add.h); each
// element one add (measured on the H200; TmaReduceAdd.IsTheIeeeAddWithSubnormalsKept and .Bf16IsAutogradsAdd keep it
// so).
__device__ __forceinline__ void tma_reduce_add_2d(const CUtensorMap* map, const void* smem, int c0, int c1) {
  asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_address(smem)), "r"(c0), "r"(c1)
               : "memory");
}

// Closes this thread's bulk async-group of the copies issued since the last one.
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until at most kPending of this thread's bulk async-groups are still reading their shared memory.
template <int kPending>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// Waits until every bulk async-group of this thread has completed (its writes done).
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Ordinary global stores before this fence are ordered before later TMA reads (async proxy).
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

}  // namespace mok::gpu::ptx
