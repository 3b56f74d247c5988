// Warp-wide row copies: one warp moves one row in 16-byte vectors, several loads in flight per lane.
#pragma once

#include "schedule.cuh"

namespace mok::gpu {

// Eight consecutive bf16 (16 bytes: one vector access per lane, so a warp moves 512 bytes per step).
struct alignas(16) Bf16x8 {
  bf16 e[8];
};

// A warp's pass over one row of n vectors: lane l handles vectors l, l + 32, ...; store(c, load(c)).
// kBatch of a lane's loads are issued before their stores: such a loop is latency-bound, and the
// compiler may not hoist a load over a store it cannot prove distinct.
template <int kBatch = 4, class Load, class Store>
__device__ __forceinline__ void row_pass(int n, Load load, Store store) {
  using Value = decltype(load(0));
  for (int c0 = lane_id(); c0 < n; c0 += 32 * kBatch) {
    Value v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      v[b] = c0 + 32 * b < n ? load(c0 + 32 * b) : Value{};  // no value kept from the last pass
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      if (c0 + 32 * b < n) store(c0 + 32 * b, v[b]);
  }
}

// Warp-wide copy of one H-row (16-byte vectors; rows are 128-byte aligned as H % 64 == 0); a null
// source writes zeros. Eight vectors per lane in flight: the copies are bound by loads in flight.
__device__ __forceinline__ void copy_row(bf16* dst, const bf16* src, int h) {
  const int4* s = reinterpret_cast<const int4*>(src);
  int4* d = reinterpret_cast<int4*>(dst);
  row_pass<8>(
      h / 8,
      [&](int i) {
        return src ? s[i] : int4{0, 0, 0, 0};
      },
      [&](int i, int4 v) { d[i] = v; });
}

}  // namespace mok::gpu
