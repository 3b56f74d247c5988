// The pulls of a ring cycle's rows beside the GEMM that reads them (the forward's x into xe for GEMM1,
// the backward's dy into the ring for dy W2): the producer warpgroup's idle warps of every block
// (gemm_tiles' side work) copy the rows in ring order, the order the GEMM's banded tiles read them, and
// count each ring slot's rows as they land (Params::pulled_rows); a tile's loads wait for its own slot's
// rows (TileLoad::a_ready) instead of a grid barrier after every row.
#pragma once

#include "mok/megakernel/ptx/gpu_scope.cuh"
#include "mok/megakernel/ptx/tma.cuh"
#include "schedule.cuh"
#include "tile_gemm.cuh"
#include "tile_schedules.cuh"

namespace mok::gpu {

// Vectors in flight per lane in a side worker's row copy: the producer warpgroup has
// kProducerRegisters a thread.
inline constexpr int kSideBatch = 8;

// Ring row `item` counted in its ring slot once the whole warp's stores of it are done: each lane's
// stores come before the TMA's reads (a proxy fence), the warp barrier orders them before lane 0's
// release.
__device__ inline void count_pulled_row(const Params& p, int item) {
  ptx::fence_proxy_async_global();
  __syncwarp();
  if (lane_id() == 0) ptx::add_release_gpu(p.pulled_rows + item / kTileRows, 1u);
}

// What a tile of this cycle's ring waits for: its slot's 128 rows, counted once in every cycle the
// slot held a tile (a slot holds tiles from cycle 0 on, until its rank's last: ring_tile), so
// kTileRows (cycle + 1) by the end of this cycle's pull.
__device__ __forceinline__ RowsReady pulled_ring_slot(const Params& p, int cycle, const RingItem& it) {
  return RowsReady{p.pulled_rows + it.ring_row / kTileRows, unsigned(kTileRows * (cycle + 1))};
}

// A side worker's share of this cycle's ring rows: items worker, worker + workers, ...; a warp looks up
// 32 at once (lane l the l-th: ring_row, the source token), then pulls them one after another:
// pull(item, pad, src) with the row's padded row and its token's row of `input` (nullptr for a padding
// row: zeros), then counts it. The rows of empty ring slots are nobody's.
template <class Pull>
__device__ void pull_ring_rows(const Params& p, int cycle, int worker, int workers, const bf16* RankBuffers::*input,
                               Pull pull) {
  const int rows = int(cycle_ring_rows(p));
  for (int first = worker; first < rows; first += 32 * workers) {
    const int item = first + lane_id() * workers;
    long pad = 0;
    const bf16* src = nullptr;
    bool in_tile = false;
    if (item < rows) {
      const RingRow row = ring_row(p, cycle, item);
      in_tile = row.in_tile, pad = row.pad;
      if (row.valid) src = token_row(p, slot_source(p, row.t.first_row + row.q % kTileRows).token, input);
    }
    for (uint32_t left = __ballot_sync(~0u, in_tile); left; left &= left - 1) {
      const int lane = __ffs(left) - 1, at = first + lane * workers;
      const auto from = reinterpret_cast<const bf16*>(__shfl_sync(~0u, reinterpret_cast<uintptr_t>(src), lane));
      pull(at, __shfl_sync(~0u, pad, lane), from);
      count_pulled_row(p, at);
    }
  }
}

}  // namespace mok::gpu
