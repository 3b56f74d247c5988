// A grid-wide barrier for the persistent kernels (launched cooperatively, so every block is
// resident), with a watchdog: a block that waits past the timeout records who waited where and
// every block leaves instead of hanging. Returns false once any error is recorded. Across GPUs an
// error is also announced in every peer's abort word, and the peers leave their barriers across GPUs
// at once instead of waiting for this GPU (docs/multi-gpu.md, Faults).
// Global stores before the barrier are visible after it to ordinary loads and to TMA copies.
#pragma once

#include "mok/megakernel/ptx/system_scope.cuh"
#include "mok/megakernel/ptx/timer.cuh"
#include "mok/megakernel/ptx/tma.cuh"
#include "params.cuh"

namespace mok::gpu {

// Writes this GPU's abort mark for this launch into every peer's abort word (params.cuh, PeerSync),
// so that the peers stop waiting for it at their barriers across GPUs.
__device__ inline void announce_abort(const PeerSync& s) {
  for (int j = 0; j < s.gpus; ++j)
    if (j != s.me) ptx::store_release_sys(s.abort[j], s.epoch + unsigned(s.me) + 1);
}

// The first error of a launch wins (the word is sticky until the Layer raises it). Across GPUs it is
// announced to the peers, unless it is a peer's abort itself: relayed, it would name this GPU instead
// of the one that failed.
__device__ __forceinline__ void record_error(const GridBarrier& b, int code, int phase, int cycle, int detail) {
  if (atomicCAS(&b.error->code, kNoError, code) == kNoError) {
    b.error->phase = phase;
    b.error->cycle = cycle;
    b.error->detail = detail;
    __threadfence();
    if (b.peers.gpus > 1 && code != kPeerAborted) announce_abort(b.peers);
  }
}

// The launch's recorded error code, as another block may have just written it.
__device__ __forceinline__ int recorded_code(const GridBarrier& b) {
  return *reinterpret_cast<volatile int*>(&b.error->code);
}

// An input error found at a token (kLogitOverflow, kBadRouting, kSavedLayout). Where several tokens are bad, the
// smallest is named, whichever thread finds its own first: the message is the same run to run, and the
// reference's. A launch queued behind a failed one not raised yet still checks its inputs before its
// first barrier: the key puts the earlier launch first, so the error stays that launch's.
__device__ __forceinline__ void record_bad_token(const GridBarrier& b, int code, int phase, long token) {
  record_error(b, code, phase, 0, 0);
  if (recorded_code(b) != code) return;
  const unsigned int launch = unsigned(b.peers.epoch / kEpochStride);  // wraps after 2^32 launches, error pending
  atomicMax(&b.error->bad_token_key, (static_cast<unsigned long long>(~launch) << 32) | ~unsigned(token));
}

__device__ __forceinline__ bool error_recorded(const GridBarrier& b) { return recorded_code(b) != kNoError; }

// One check of a spin-wait's watchdog: true (stop waiting) once any block has recorded an error, or
// once the wait, begun at `start`, has passed the timeout (then it records code, phase, cycle and
// detail), so a stuck launch drains quickly everywhere.
__device__ inline bool watchdog_stop(const GridBarrier& b, long long start, int code, int phase, int cycle,
                                     int detail) {
  if (error_recorded(b)) return true;
  if (ptx::global_timer_ns() - start <= b.timeout_ns) return false;
  record_error(b, code, phase, cycle, detail);
  return true;
}

// Block 0's stamp (see PhaseClock); one writer, so a plain counter.
__device__ inline void stamp_phase(const GridBarrier& b, int phase) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const int i = *b.clock.count;
  if (i >= kClockEntries) return;
  b.clock.ns[i] = ptx::global_timer_ns();
  b.clock.phase[i] = phase;
  *b.clock.count = i + 1;
}

// The launch's first stamp, which restarts the clock (no host memset per launch).
__device__ inline void start_clock(const GridBarrier& b) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *b.clock.count = 0;
  stamp_phase(b, -1);
}

// grace_ns: added to the watchdog's limit (the blocks that wait while block 0 meets the other GPUs).
__device__ inline bool grid_sync(const GridBarrier& b, int phase, int cycle, long long grace_ns = 0) {
  ptx::fence_proxy_async_global();  // this phase's stores are visible to the next phase's TMA reads
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned int* generation = b.generation;
    const unsigned int seen = *generation;
    __threadfence();
    if (atomicAdd(b.arrived, 1u) == gridDim.x - 1) {
      *b.arrived = 0;
      __threadfence();
      atomicAdd(const_cast<unsigned int*>(generation), 1u);
    } else {
      const long long start = ptx::global_timer_ns() + grace_ns;
      while (*generation == seen && !watchdog_stop(b, start, kBarrierTimeout, phase, cycle, int(blockIdx.x)))
        __nanosleep(64);
    }
    __threadfence();
    stamp_phase(b, phase);
  }
  // One verdict for the whole block: read thread by thread, an error recorded meanwhile by another
  // block could send some threads on and leave the rest waiting at the next block barrier.
  return !__syncthreads_or(error_recorded(b));
}

// The GPU whose abort mark, of this launch or a later one, is in this GPU's abort word, or -1. A later
// launch's counts: a GPU whose launch failed stops its queued launches too, each marking its own epoch over
// the last, so a peer still in this launch may find only a later mark. (With three or more GPUs, a GPU that
// went on and failed in a later launch may so end a slower peer's wait in this one: an error reported
// early, for a step that failed on a GPU anyway.)
__device__ inline int stopped_peer(const PeerSync& s) {
  const unsigned long long mark = ptx::load_acquire_sys(s.abort[s.me]);
  return mark > s.epoch ? int((mark - 1) % kEpochStride) : -1;
}

// Waits until a peer's `flag` here reaches `value` (32 bits, compared by difference). A peer's abort mark
// ends the wait at once, recording kPeerAborted naming it, unless the flag, read again after the mark, has
// arrived (a peer that handed over, then stopped in a later launch); the watchdog, counting from `start`,
// records `timeout_code` with `detail`. False: the launch stops on an error.
__device__ inline bool wait_for_peer(const GridBarrier& b, const unsigned int* flag, unsigned int value,
                                     long long start, int timeout_code, int phase, int cycle, int detail) {
  const auto arrived = [&] { return int(ptx::load_acquire_sys(flag) - value) >= 0; };
  while (!arrived()) {
    if (const int failed = stopped_peer(b.peers); failed >= 0) {
      if (arrived()) return true;
      record_error(b, kPeerAborted, phase, cycle, failed);
      return false;
    }
    if (watchdog_stop(b, start, timeout_code, phase, cycle, detail)) return false;
    __nanosleep(128);
  }
  return true;
}

// Block 0's part of the barrier across GPUs: announce this barrier in every GPU's flags, then wait
// until every GPU announced it here (a peer's abort mark ends the wait at once; watchdog: kPeerTimeout
// names the GPU that did not come). The flags are released and acquired at system scope: the peers'
// windows are reached over NVLink.
__device__ inline void peer_barrier(const GridBarrier& b, int phase, int cycle) {
  const PeerSync& s = b.peers;
  const unsigned int number = unsigned(s.epoch) + ++*s.count;
  for (int j = 0; j < s.gpus; ++j) ptx::store_release_sys(s.flags[j] + s.me, number);
  const long long start = ptx::global_timer_ns();  // one limit for the whole wait
  for (int j = 0; j < s.gpus; ++j)
    if (!wait_for_peer(b, s.flags[s.me] + j, number, start, kPeerTimeout, phase, cycle, j)) return;
}

// Every block of every GPU: each thread's stores to peers (and its own) are visible to every GPU
// after it. One GPU: nothing to do (the phases' grid barriers order everything).
__device__ inline bool peer_sync(const GridBarrier& b, int phase, int cycle) {
  if (b.peers.gpus == 1) return true;
  __threadfence_system();
  if (!grid_sync(b, phase, cycle)) {
    // An error stops this GPU here: one recorded in this launch was announced already (announcing
    // again changes nothing), but an earlier launch's error, not raised yet, stops this launch at its
    // first barrier without being recorded anew (the word is sticky), and the peers must not wait.
    if (blockIdx.x == 0 && threadIdx.x == 0) announce_abort(b.peers);
    return false;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) peer_barrier(b, phase, cycle);
  // The other blocks wait longer, so block 0's report names the missing GPU.
  return grid_sync(b, phase, cycle, b.timeout_ns);
}

}  // namespace mok::gpu
