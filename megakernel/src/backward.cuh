// The persistent backward. First backward_prologue_kernel: the check that the saved layout is
// the routing's, the tile index, and in recompute mode xe pulled from x again and h from it, and
// the shared expert's h and a from x (the forward's pull and GEMM1 + SwiGLU, expert_up.cuh). Then
// backward_kernel: ring cycles of pull reverse-combine (dy), g = dy W2, the fused router-weight gradient d topk_w = <g,
// a> with the SwiGLU backward, dx_j = dh W1 pushed back to the source ranks; then the shared expert's dy W2 and the
// router backward, the shared expert's dx, the slot-ordered dx combine (on one GPU beside the router-weight gradient's
// chains), dye = bf16(w dy) (pulled after the combine: it lies over the ring and g, or over the dx_j,
// workspace_layout), the weight gradients as K-step chains over each expert's rows in global token order, and across
// GPUs the relayed router-weight gradient. The fp8 mode
// (backward_fp8_kernel) runs the input gradients' GEMMs (g = dy W2, dx_j = dh W1 and the shared expert's) on E4M3
// operands: dy quantized by its pull, dh where it is made, the weights' transposed copies as B (docs/numerics.md, "The
// FP8 layer mode"); with fp8_weight_gradients also the routed experts' weight gradients, after a phase that quantizes
// their operands (grad_operands.cuh); the rest is the bf16 mode's.
// Each precision's kernels (backward.cu, backward_fp8.cu, backward_paired.cu, backward_fp8_paired.cu) are a
// translation unit of their own, so the build compiles them side by side; the phases below stay in an unnamed
// namespace, each unit's own copy, as when the kernels shared one file.
#pragma once

#include "chain_gemm.cuh"
#include "chain_relay.cuh"
#include "combine_tokens.cuh"
#include "expert_up.cuh"
#include "gather.cuh"
#include "gemm_phases.cuh"
#include "grad_operands.cuh"
#include "grid_sync.cuh"
#include "kernels.cuh"
#include "mok/core/combine.h"
#include "mok/core/fma_chain.h"
#include "mok/core/gradient_add.h"
#include "mok/core/routing.h"
#include "mok/core/swiglu.h"
#include "router_scratch.cuh"
#include "row_copy.cuh"
#include "schedule.cuh"
#include "swiglu_words.cuh"
#include "tile_gemm.cuh"
#include "tile_schedules.cuh"

namespace mok::gpu {
namespace {

// The reverse combine's dispatch: dy of every row of this cycle's tiles, pulled from the source ranks'
// buffers into the ring (g = dy W2 reads it), a warp per token (for_each_token_slots, as the forward's
// pull); padding rows zero. In the fp8 mode (kFp8) the ring holds dy quantized (ringq: 1 x 128 blocks
// along H, quantize_row_to_rows; a padding row a zero block's).
template <bool kFp8>
__device__ void pull_dy(const Params& p, int cycle) {
  const int H = p.c.hidden;
  const auto ring = [&](long item) { return p.ring + item * H; };
  const auto ringq = [&](long item) { return p.ringq.row(item, H); };
  const auto no_copy = [](long) -> bf16* { return nullptr; };
  for_each_padding_row(p, [&](ExpertTileRow row) {
    if (const long item = ring_item(p, cycle, row); item >= 0) {
      if constexpr (kFp8)
        quantize_row(ringq(item), nullptr, nullptr, H);
      else
        copy_row(ring(item), nullptr, H);
    }
  });
  for_each_token_slots(
      p, [&](ExpertTileRow row) { return ring_item(p, cycle, row); },
      [&](int g, int, uint32_t lanes, long item) {
        const bf16* dy = token_row(p, g, &RankBuffers::dy);
        if constexpr (kFp8)
          quantize_row_to_rows(dy, H, lanes, item, ringq, no_copy);
        else
          copy_row_to_rows(dy, H, lanes, item, ring);
      });
}

// dye = bf16(w dy) of every padded row of this GPU's tiles (dW2's operand), from the source ranks' dy
// as the cycles' pull reads it, a warp per token (for_each_token_slots); padding rows zero. After the
// ring cycles and the dx combine, so that dye can lie over the ring and g, or over the dx_j the combine has
// read (workspace_layout).
__device__ void pull_weighted_dy(const Params& p) {
  const int H = p.c.hidden, k = p.c.top_k;
  const auto dye = [&](long pad) { return p.dye + pad * H; };
  for_each_padding_row(p, [&](ExpertTileRow row) { copy_row(dye(pad_row(p, row)), nullptr, H); });
  for_each_token_slots(
      p, [&](ExpertTileRow row) { return pad_row(p, row); },
      [&](int g, int j0, uint32_t lanes, long pad) {
        const float* topk_w = p.rank[token_rank(p, g)].topk_w + long(token_local(p, g)) * k;
        const float mine = lanes >> lane_id() & 1u ? topk_w[j0 + lane_id()] : 0.0f;
        const bf16* dy = token_row(p, g, &RankBuffers::dy);
        copy_row_to_rows(dy, H, lanes, pad, dye, [&](int lane, long, int, const uint4& v) {
          const float w = __shfl_sync(~0u, mine, lane);
          return uint4{weighted_dy_words(w, v.x), weighted_dy_words(w, v.y), weighted_dy_words(w, v.z),
                       weighted_dy_words(w, v.w)};
        });
      });
}

// g = dy W2 for ring rows: tiles (rank, ring slot, 256 columns of I); g kept in fp32 per ring row (it
// lives within the cycle).
// W2_e [H, I] is read as stored (rows along K); in the fp8 mode its transposed copy [I, H] (K-major).
template <bool kFp8>
__device__ void expert_down_grad(Pipeline& pipe, const Params& p, int cycle) {
  const int I = p.c.intermediate, H = p.c.hidden;
  ring_gemm<kFp8 ? kNT : kNN, kFp8>(
      pipe, p, cycle, kDownGrad, I,
      [&](const RingItem& it) {
        if constexpr (kFp8)
          return k_major(p.maps.ringq, p.maps.w2tq, it.ring_row, own_expert(p, it.t.expert) * I + it.n0, H,
                         {p.ringq.exps, p.w2t_exp});
        return b_as_stored(p.maps.ring, p.maps.w2, it.ring_row, it.n0, own_expert(p, it.t.expert) * H, H);
      },
      [&](const RingItem& it, Warpgroup consumer, const float(&acc)[kAccumulators]) {
        for_each_pair(
            consumer, acc,
            [&](int row, int col, float v0, float v1) {
              *reinterpret_cast<float2*>(p.g + long(it.ring_row + row) * I + it.n0 + col) = float2{v0, v1};
            },
            min(kTileN, I - it.n0));
      });
}

// The gradients through the router weight and SwiGLU, in one pass over g (fp32, the pass's largest
// operand): per ring row, a = bf16(swiglu(h)) from the gate sigmoids that swiglu_grad takes too (the
// forward's swiglu_words, the same bits; no saved buffer holds a: saved_layout), stored for dW2,
// d topk_w = <g, a> pushed to the source rank (a chain over I in the core's fma_chain order, one lane
// per row, so rows run side by side) and dh = bf16(swiglu_grad(w g)); a and dh zero in the padding rows. In the fp8
// mode (kFp8) dh is also quantized per ring row into dhq (dx_j's A; dW1 reads the bf16 dh). A warp takes kRows rows, a
// panel of kFp8Block columns at a time: lane l holds 16 bytes of h (8 columns) of row 2 i + l / 16 for each item i, so
// a half warp holds one row's 1 x 128 block (quantize_half_warp). g and a reach the lane that chains their row through
// shared memory (the GEMM stages, idle in this phase).
template <bool kFp8>
__device__ void expert_row_grads(Pipeline& pipe, const Params& p, int cycle) {
  // kBatch items' loads in flight per lane (four spilled: 424 bytes of spill loads in the bf16 kernel,
  // when a was loaded beside h and g).
  constexpr int kRows = 16, kCols = kFp8Block, kItems = kRows * kCols / 8 / 32, kBatch = 2;
  struct Panel {
    float g[kRows][kCols + 1];  // the pads make the lane-per-row reads conflict-free
    bf16 a[kRows][kCols + 2];
  };
  static_assert(kItems % kBatch == 0 && sizeof(Panel) * (kThreads / 32) <= sizeof(pipe.smem->stage));
  Panel& panel = reinterpret_cast<Panel*>(&pipe.smem->stage[0][0])[threadIdx.x / 32];
  // h's gate and up vectors and g's matching 8 columns of one row.
  struct Operands {
    uint4 gate, up;
    float4 g0, g1;
  };
  const int I = p.c.intermediate, lane = lane_id(), col8 = lane % 16 * 8;
  const float limit = p.c.swiglu_limit;
  for (long first = warp_id() * kRows; first < cycle_ring_rows(p); first += warp_count() * kRows) {
    const RingRow mine = ring_row(p, cycle, first + lane % kRows);
    const unsigned in_tile = __ballot_sync(~0u, mine.in_tile) & 0xffffu,
                   valid = __ballot_sync(~0u, mine.valid) & 0xffffu;
    if (in_tile == 0) continue;
    const RankBuffers* src = nullptr;
    const long slot = mine.valid ? source_slot(p, mine, src) : 0;
    const float mine_w = mine.valid ? src->topk_w[slot] : 0.0f;
    float acc = 0.0f;
    for (int i0 = 0; i0 < I; i0 += kCols) {
      const int n = min(kCols, I - i0), col = i0 + col8;
      for (int b0 = 0; b0 < kItems; b0 += kBatch) {
        Operands o[kBatch];
        int pads[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int r = 2 * (b0 + b) + lane / 16;
          pads[b] = __shfl_sync(~0u, int(mine.pad), r);
          o[b] = Operands{};
          if ((valid >> r & 1u) && col8 < n) {
            const uint4* h = reinterpret_cast<const uint4*>(p.h + long(pads[b]) * 2 * I + col);
            const float4* g = reinterpret_cast<const float4*>(p.g + (first + r) * I + col);
            o[b] = Operands{h[0], h[I / 8], g[0], g[1]};
          }
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int r = 2 * (b0 + b) + lane / 16;
          const float w = __shfl_sync(~0u, mine_w, r);
          const uint32_t gate[4] = {o[b].gate.x, o[b].gate.y, o[b].gate.z, o[b].gate.w};
          const uint32_t up[4] = {o[b].up.x, o[b].up.y, o[b].up.z, o[b].up.w};
          const float gv[8] = {o[b].g0.x, o[b].g0.y, o[b].g0.z, o[b].g0.w, o[b].g1.x, o[b].g1.y, o[b].g1.z, o[b].g1.w};
          uint32_t a_words[4] = {}, d_gate[4] = {}, d_up[4] = {};
          if (valid >> r & 1u) {
            float s[8];
            gate_sigmoids<4>(gate, limit, s);
            swiglu_words_given_sigmoids<4>(gate, up, limit, s, a_words);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const SwigluGrad lo =
                  swiglu_grad_given_sigmoid(low_float(gate[j]), low_float(up[j]), w * gv[2 * j], limit, s[2 * j]);
              const SwigluGrad hi = swiglu_grad_given_sigmoid(high_float(gate[j]), high_float(up[j]), w * gv[2 * j + 1],
                                                              limit, s[2 * j + 1]);
              d_gate[j] = pack_bf16(lo.gate, hi.gate);
              d_up[j] = pack_bf16(lo.up, hi.up);
            }
          }
          const uint4 gate_vec{d_gate[0], d_gate[1], d_gate[2], d_gate[3]}, up_vec{d_up[0], d_up[1], d_up[2], d_up[3]};
          const bool in_row = (in_tile >> r & 1u) && col8 < n;
          if (in_row) {
            uint4* dh = reinterpret_cast<uint4*>(p.dh + long(pads[b]) * 2 * I + col);
            dh[0] = gate_vec;
            dh[I / 8] = up_vec;
            *reinterpret_cast<uint4*>(p.a + long(pads[b]) * I + col) =
                uint4{a_words[0], a_words[1], a_words[2], a_words[3]};
          }
          if constexpr (kFp8) {  // every lane: the quantization shuffles across the half warp
            const Fp8Matrix q = p.dhq.row(first + r, 2 * I);
            store_quantized(q, col / 8, gate_vec, in_row);
            store_quantized(q, (I + col) / 8, up_vec, in_row);
          }
#pragma unroll
          for (int j = 0; j < 8; ++j) panel.g[r][col8 + j] = gv[j];
#pragma unroll
          for (int j = 0; j < 4; ++j) reinterpret_cast<uint32_t*>(&panel.a[r][col8])[j] = a_words[j];
        }
      }
      __syncwarp();
      if (lane < kRows)
        acc = fma_chain(
            n, [&](int i) { return panel.g[lane][i]; }, [&](int i) { return to_float(panel.a[lane][i]); }, acc);
      __syncwarp();
    }
    if (lane < kRows && mine.valid) src->d_topk_w[slot] = acc;
  }
  ptx::fence_async_shared();  // these generic writes come before the next GEMM's TMA writes to the stages
}

// dx_j = bf16(dh W1), pushed into the source rank's (token, slot) buffer; W1_e [2I, H] as stored (in
// the fp8 mode dhq per ring row and W1's transposed copy [H, 2I]).
template <bool kFp8>
__device__ void expert_dx_push(Pipeline& pipe, const Params& p, int cycle) {
  const int I = p.c.intermediate, H = p.c.hidden;
  ring_gemm<kFp8 ? kNT : kNN, kFp8>(
      pipe, p, cycle, kDxPush, H,
      [&](const RingItem& it) {
        if constexpr (kFp8)
          return k_major(p.maps.dhq, p.maps.w1tq, it.ring_row, own_expert(p, it.t.expert) * H + it.n0, 2 * I,
                         {p.dhq.exps, p.w1t_exp});
        return b_as_stored(p.maps.dh, p.maps.w1, it.t.pad_row, it.n0, own_expert(p, it.t.expert) * 2 * I, 2 * I);
      },
      [&](const RingItem& it, Warpgroup consumer, const float(&acc)[kAccumulators]) {
        push_to_slots(pipe, p, it, consumer, acc);
      });
}

// One weight gradient out[M, N] = chain over K rows of A^T B (A: [rows, M], B: [rows, N], both
// MN-major in the bf16 tile loads; the fp8 weight gradients read their transposed copies,
// fp8_weight_grad_load), rows k_first.. of the maps, k_rows of them. The maps are members of
// p.maps (offsets, not addresses: the producer's per-tile job, at 40 registers, held the eight maps'
// addresses hoisted out of its loop, spilled them and reloaded them every tile).
struct WeightGrad {
  using MapMember = CUtensorMap TensorMaps::*;
  MapMember a, b;
  int m, n, k_first, k_rows;
  MapMember out_map;  // the caller's whole gradient buffer (d_w1, ...) as a map (store_rows_by_tma)
  long out_row;       // this gradient's first row of it
  __device__ int tiles() const { return ceil_div(m, kTileRows) * ceil_div(n, kTileN); }
  // Tile t's first row and column (banded_tile).
  __device__ void origin(long t, int& m0, int& n0) const {
    const GridTile at = banded_tile(int(t), ceil_div(m, kTileRows), ceil_div(n, kTileN));
    m0 = at.row * kTileRows, n0 = at.col * kTileN;
  }
  // The operands of the tile at (m0, n0), the first k_blocks K-blocks of its chain.
  __device__ TileLoad load(const TensorMaps& maps, int m0, int n0, int k_blocks) const {
    return TileLoad{&(maps.*a), &(maps.*b), m0, {n0, n0 + kTileN / 2}, k_first, k_first, k_blocks};
  }
};

// dW1_e = dh^T xe and dW2_e = dye^T a over expert e's padded rows; dW1_s = dh_s^T x and
// dW2_s = dy^T a_s over the shared expert's tokens. Weight gradient w of the list: this GPU's experts'
// dW1, dW2 in expert order (into the caller's d_w1, d_w2: this GPU's experts), then the shared
// expert's, whose chains over every token run GPU after GPU: this GPU's K-steps, rows [chain_begin,
// end) of Params::shared_tokens, continue the previous GPU's (ChainRelay).
__device__ WeightGrad weight_grad(const Params& p, int w) {
  const int I = p.c.intermediate, H = p.c.hidden, Is = p.c.shared_intermediate;
  const int own = own_expert_end(p) - own_expert_begin(p);
  if (w < 2 * own) {
    const int e = own_expert_begin(p) + w / 2, first = kTileRows * (p.tile_offsets[e] - own_tile_begin(p)),
              rows = p.offsets[e + 1] - p.offsets[e];
    const long local = own_expert(p, e);
    if (w % 2 == 0)
      return WeightGrad{&TensorMaps::dh, &TensorMaps::xe, 2 * I, H, first, rows, &TensorMaps::d_w1, local * 2 * I};
    return WeightGrad{&TensorMaps::dye, &TensorMaps::a, H, I, first, rows, &TensorMaps::d_w2, local * H};
  }
  const TokenRows& s = p.shared_tokens;
  const int first = int(s.chain_begin - s.begin), rows = int(s.end - s.chain_begin);
  if (w == 2 * own)
    return WeightGrad{&TensorMaps::shared_dh, &TensorMaps::x, 2 * Is, H, first, rows, &TensorMaps::d_shared_w1, 0};
  return WeightGrad{&TensorMaps::dy, &TensorMaps::shared_a, H, Is, first, rows, &TensorMaps::d_shared_w2, 0};
}

// A finished half tile of weight gradient wg, tile origin (m0, n0), into the caller's buffer by the TMA:
// stored, or added to what it holds (Params::accumulate), in fp32 or bf16 (Params::grads_bf16). The
// map's rows past wg.m are the next gradient's, so a consumer past it skips. wg.m is a multiple of 64
// (H, I and Is are: config.h), so a consumer's 64 rows are all in or all past it.
__device__ __forceinline__ void store_weight_grad(Pipeline& pipe, const Params& p, const WeightGrad& wg, int m0, int n0,
                                                  Warpgroup consumer, const float (&acc)[kAccumulators]) {
  if (kWgmmaM * consumer_index(consumer) >= wg.m - m0) return;
  const CUtensorMap* map = &(p.maps.*wg.out_map);
  const int row0 = int(wg.out_row) + m0 + kWgmmaM * consumer_index(consumer), columns = min(kTileN, wg.n - n0);
  if (p.grads_bf16)
    store_rows_by_tma<bf16>(pipe, consumer, acc, map, n0, row0, columns, p.accumulate);
  else
    store_rows_by_tma<float>(pipe, consumer, acc, map, n0, row0, columns, p.accumulate);
}

// The gradients longest chain first (K rows descending, then list order): the persistent blocks claim
// the tiles in that order (ClaimedWalk), so the last tiles to start are the shortest, and a skewed
// routing's hot expert (the longest chains) does not finish alone at the end of the phase. Which block
// computes a tile changes no bit. k_rows: each gradient's K rows, in shared memory (the count reads it grads^2
// times).
__device__ void order_longest_first(const int* k_rows, int grads, int* order) {
  for (int w = threadIdx.x; w < grads; w += blockDim.x) {
    int place = 0;
    for (int v = 0; v < grads; ++v) place += k_rows[v] > k_rows[w] || (k_rows[v] == k_rows[w] && v < w);
    order[place] = w;
  }
}

// The fp8 weight gradients' operands of routed gradient w's tile at (m0, n0): dW1_e = dh^T xe (w even),
// dW2_e = dye^T a, their transposed E4M3 copies over the expert's tiles (K-blocks of 128 padded rows).
__device__ TileLoad fp8_weight_grad_load(const Params& p, int w, const WeightGrad& wg, int m0, int n0) {
  const GradOperand a = grad_operand(p, 2 * (w % 2)), b = grad_operand(p, 2 * (w % 2) + 1);
  TileLoad l{&(p.maps.*a.map),
             &(p.maps.*b.map),
             m0,
             {n0, n0 + kTileN / 2},
             wg.k_first,
             wg.k_first,
             ceil_div(wg.k_rows, kFp8Block)};
  l.columns = {a.q.exps, b.q.scales, b.q.exp_range, column_scale_stride(a.cols), column_scale_stride(b.cols)};
  return l;
}

// weight_grads' tables in shared memory: one pair shared by its instances (a template's static arrays
// would be one pair per instance).
struct WeightGradTables {
  int *first_tile, *order;
};
__device__ __forceinline__ WeightGradTables weight_grad_tables() {
  constexpr int kMostGrads = 2 * kMaxExperts + 2;  // two gradients per expert and the shared expert's
  __shared__ int first_tile[kMostGrads + 1], order[kMostGrads];
  static_assert(
      kSmemBytes + sizeof(first_tile) + sizeof(order) + sizeof(unsigned int) + sizeof(TileQueue) <= kMaxSmemPerBlock,
      "the block's dynamic and static shared memory (with ClaimedTiles' word and the TileQueue)");
  return {first_tile, order};
}
// The gradients of weight_grad's list that one walk takes: `count` of them, from `first`, `step` apart
// (all from 0, step 1; dW2's alone, from 1, step 2; dW1's from 0, step 2), claimed through word `walk` of
// Params::claimed_weight_grads.
struct GradWalk {
  int first, count, step, walk;
  __device__ int grad(int i) const { return first + step * i; }
};

// One walk's gradients. Each tile finds its gradient by binary search over the gradients' first tiles
// (WeightGradTiles), which the block lays out in shared memory first (a walk over the list per tile cost a
// tile's worth of latency), the gradients in order_longest_first's order. kFp8: routed gradients on their
// E4M3 operands (fp8_weight_grad_load). Inlined by force: the paired kernel calls it too, and left a call
// (cicc did so) it took the unpaired kernel's pairing at run time (its spills 94 -> 382 bytes).
template <bool kFp8>
__device__ __forceinline__ void weight_grads(Pipeline& pipe, const Params& p, const GradWalk& walk) {
  const WeightGradTables tables = weight_grad_tables();
  int *first_tile = tables.first_tile, *order = tables.order;
  const int grads = walk.count;
  for (int i = threadIdx.x; i < grads; i += blockDim.x) first_tile[i] = weight_grad(p, walk.grad(i)).k_rows;
  __syncthreads();
  order_longest_first(first_tile, grads, order);
  __syncthreads();
  for (int i = threadIdx.x; i < grads; i += blockDim.x) first_tile[i + 1] = weight_grad(p, walk.grad(order[i])).tiles();
  __syncthreads();
  if (threadIdx.x == 0) {
    first_tile[0] = 0;
    for (int w = 0; w < grads; ++w) first_tile[w + 1] += first_tile[w];
  }
  __syncthreads();
  const WeightGradTiles tiles{first_tile, grads};
  WeightGrad wg;
  int m0 = 0, n0 = 0;
  gemm_tiles<kFp8 ? kNT : kTN, kFp8, kFp8>(
      pipe, tiles.count(), p.barrier, kWeightGrad,
      [&](long t, TileLoad& l) {
        const int i = tiles.place(t), w = walk.grad(order[i]);
        wg = weight_grad(p, w);
        wg.origin(t - tiles.first[i], m0, n0);
        l = kFp8 ? fp8_weight_grad_load(p, w, wg, m0, n0) : wg.load(p.maps, m0, n0, ceil_div(wg.k_rows, kBox));
        return true;
      },
      [&](long, Warpgroup consumer, const float(&acc)[kAccumulators]) {
        store_weight_grad(pipe, p, wg, m0, n0, consumer, acc);
      },
      ZeroStart{}, ClaimedWalk{p.claimed_weight_grads + walk.walk});
  finish_chunk_copies();
}

// Across GPUs, the shared expert's weight gradients (ChainRelay), dW1_s's tiles then dW2_s's (tile t's
// consumer halves are the relay's units 2t and 2t + 1, relay_sizes). The chains:
// this GPU's K-steps continue the previous GPU's partials (the first GPU's start at zero) and go on to
// the next GPU, or from the last GPU, as the results, to every other GPU (it stores them too). kResults
// (every GPU but the last, after that): the last GPU's results, stored by a tile phase without
// K-blocks, so that the stores are weight_grads' own.
template <bool kResults>
__device__ void relayed_shared_weight_grads(Pipeline& pipe, const Params& p) {
  const int own = own_expert_end(p) - own_expert_begin(p);
  const long dw1_tiles = shared_grad_tiles(p.c, 0);
  const ChainRelay& r = p.relay;
  WeightGrad wg;
  int m0 = 0, n0 = 0;
  bool waited = true;  // this thread's wait for the unit's sums ended with them (relay_wait)
  const auto unit = [&](long t, Warpgroup consumer) { return t * kConsumers + consumer_index(consumer); };
  gemm_tiles<kTN>(
      pipe, dw1_tiles + shared_grad_tiles(p.c, 1), p.barrier, kWeightGrad,
      [&](long t, TileLoad& l) {
        const bool dw2 = t >= dw1_tiles;
        wg = weight_grad(p, 2 * own + dw2);
        wg.origin(t - (dw2 ? dw1_tiles : 0), m0, n0);
        l = wg.load(p.maps, m0, n0, kResults ? 0 : ceil_div(wg.k_rows, kBox));
        return true;
      },
      [&](long t, Warpgroup consumer, const float(&acc)[kAccumulators]) {
        if (!kResults) {
          // After an error (this GPU's, or a peer's abort) no sums go on: the next GPU then meets the
          // abort mark in its wait instead of void sums under a raised flag.
          if (!warpgroup_all(consumer, waited && !error_recorded(p.barrier))) return;
          const RelayTargets to = relay_targets(p.barrier, r);
          for (int j = to.first; j < to.end; ++j) store_half_tile(r, j, unit(t, consumer), acc);
          relay_raise(r, to, unit(t, consumer), threadIdx.x % kWarpgroupThreads == 0,
                      [&] { warpgroup_sync(consumer); });
          if (to.value != r.result) return;
        }
        store_weight_grad(pipe, p, wg, m0, n0, consumer, acc);
      },
      [&](long t, Warpgroup consumer, float(&acc)[kAccumulators]) {
        const int me = p.barrier.peers.me;
        if (kResults)
          waited = relay_wait(p.barrier, r, unit(t, consumer), r.result, p.barrier.peers.gpus - 1, kWeightGrad);
        else if (me > 0)
          waited = relay_wait(p.barrier, r, unit(t, consumer), r.partial, me - 1, kWeightGrad);
        __syncwarp();  // the warp's lanes meet again after their waits, before the aligned wgmma
        load_half_tile(r, unit(t, consumer), !kResults && me == 0, acc);
      });
  finish_chunk_copies();
}

// dh_s's two words at element `at` of its rows (a gate-half column pair; the up half Is further) from
// g_s's pair: swiglu_grad of h_s's words with weight 1, rounded to bf16, stored and returned (the fp8
// mode quantizes them too).
__device__ __forceinline__ uint2 shared_dh_words(const Params& p, long at, float g0, float g1) {
  const int Is = p.c.shared_intermediate;
  const uint32_t gate = *reinterpret_cast<const uint32_t*>(p.shared_h + at);
  const uint32_t up = *reinterpret_cast<const uint32_t*>(p.shared_h + at + Is);
  const SwigluGrad lo = swiglu_grad(low_float(gate), low_float(up), g0, p.c.swiglu_limit);
  const SwigluGrad hi = swiglu_grad(high_float(gate), high_float(up), g1, p.c.swiglu_limit);
  const uint2 dh{pack_bf16(lo.gate, hi.gate), pack_bf16(lo.up, hi.up)};
  *reinterpret_cast<uint32_t*>(p.shared_dh + at) = dh.x;
  *reinterpret_cast<uint32_t*>(p.shared_dh + at + Is) = dh.y;
  return dh;
}

// Shared expert: g_s = dy W2_s, then dh_s = bf16(swiglu_grad(g_s)) elementwise (weight 1).
__device__ void shared_down_grad_bf16(Pipeline& pipe, const Params& p) {
  const int Is = p.c.shared_intermediate;
  token_gemm<kNN>(pipe, p, p.maps.dy, p.maps.shared_w2, p.c.hidden, Is, kRouterGrad,
                  [&](long g, int col, float g0, float g1) { shared_dh_words(p, g * 2 * Is + col, g0, g1); });
}

// The fp8 mode's: g_s = dyq W2_s^T (dy of the shared expert's tokens quantized, shared_dyq; W2_s's transposed copy
// [Is, H]), dh_s as in bf16, and dh_s quantized for shared dx (shared_dhq): a tile's 128-column half of
// g_s gives one 1 x 128 block of dh_s's gate half and one of its up half (quantize_block_columns).
__device__ void shared_down_grad_fp8(Pipeline& pipe, const Params& p) {
  const long N = p.shared_tokens.rows();
  const int Is = p.c.shared_intermediate;
  constexpr int kHalf = kAccumulators / 2;  // a 128-column half's accumulators: kHalf h ..
  const auto epilogue = [&](long first, int tile_n0, Warpgroup consumer, const float(&acc)[kAccumulators]) {
    const int valid = int(min(long(kTileRows), N - first));
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int n0 = tile_n0 + kFp8Block * half;
      if (n0 >= Is) break;                      // another matrix's columns
      uint32_t gate[kHalf / 2], up[kHalf / 2];  // dh_s's words, as quantize_block_columns takes them
#pragma unroll
      for (int i = 0; i < kHalf; i += 2) {
        const int row = acc_row(consumer, i), col = n0 + acc_col(i);
        gate[i / 2] = up[i / 2] = 0;
        if (row >= valid) continue;
        const uint2 dh =
            shared_dh_words(p, (first + row) * 2 * Is + col, acc[kHalf * half + i], acc[kHalf * half + i + 1]);
        gate[i / 2] = dh.x, up[i / 2] = dh.y;
      }
      quantize_block_columns(gate, consumer, 2 * Is, n0, valid, first, p.shared_dhq);
      quantize_block_columns(up, consumer, 2 * Is, Is + n0, valid, first, p.shared_dhq);
    }
  };
  token_tiles_gemm<kNT, true>(pipe, p, p.maps.shared_dyq, p.maps.shared_w2tq, p.c.hidden, Is, kRouterGrad, epilogue,
                              {p.shared_dyq.exps, p.shared_w2t_exp});
}

// d logits of this GPU's tokens, a thread's scores and d scores in the stages.
__device__ void router_grad(Pipeline& pipe, const Params& p) {
  const int E = p.c.experts, k = p.c.top_k;
  for_own_tokens_with_scratch(pipe, p, 8 * E, [&](long g, uint8_t* scratch) {
    float* const scores = reinterpret_cast<float*>(scratch);
    const RankBuffers& rb = p.rank[token_rank(p, int(g))];
    router_scores(p.c, p.logits + own_token_row(p, g) * E, scores);
    router_backward(p.c, scores, p.topk_idx + g * k, rb.d_topk_w + long(token_local(p, int(g))) * k, scores + E,
                    p.d_logits + own_token_row(p, g) * E);
  });
}

// dWr[e, h] = the chain over every token, in token order, of d logits[g, e] x[g, h]: over this GPU's
// tokens (chain_gemm) from the value start(tile, acc) puts there (one GPU: +0), each tile handed to finish.
template <class Start, class Finish>
__device__ void router_weight_chains(Pipeline& pipe, const Params& p, Start start, Finish finish) {
  const long H = p.c.hidden, E = p.c.experts;
  chain_gemm<Contiguous::along_mn, Contiguous::along_mn, Streamed::none>(
      pipe, E, H, own_token_end(p) - own_token_begin(p), [&](long e, long t) { return p.d_logits + t * E + e; },
      [&](long t, long h) { return p.x + t * H + h; }, start, finish);
}
__device__ __forceinline__ void store_router_grad(const Params& p, long i, float d) {
  p.d_router[i] = p.accumulate ? add_f32_gradient(p.d_router[i], d) : d;
}

// Across GPUs, dWr's chains run GPU after GPU (ChainRelay), a chain tile per unit. kResults false: the
// previous GPU's partials continued over this GPU's tokens and handed on; the last GPU's are the
// gradient, which it stores and hands to every other GPU. kResults true (every GPU but the last): the
// last GPU's results, stored (as relayed_shared_weight_grads').
template <bool kResults>
__device__ void relay_router_weight_grad(Pipeline& pipe, const Params& p) {
  const ChainRelay& r = p.relay;
  const int me = p.barrier.peers.me, last = p.barrier.peers.gpus - 1;
  const long E = p.c.experts, H = p.c.hidden;
  const float* const in = router_relay(r.in, p.c);
  if constexpr (kResults) {
    for (long index = blockIdx.x; index < chain_tile_count(E, H); index += gridDim.x)
      if (relay_wait(p.barrier, r, router_unit(p.c, index), r.result, last, kWeightGrad))
        for_each_chain_output(E, H, chain_tile(index, H), [&](long e, long h, int, int) {
          store_router_grad(p, e * H + h, __ldcg(in + e * H + h));
        });
    return;
  }
  const RelayTargets to = relay_targets(p.barrier, r);
  const auto start = [&](const ChainTile& tile, ChainAcc& acc) {
    const bool waited =
        me == 0 || relay_wait(p.barrier, r, router_unit(p.c, tile.index), r.partial, me - 1, kWeightGrad);
    // After an error no sums go on (as relayed_shared_weight_grads'); the verdict is the block's.
    if (!__syncthreads_and(waited && !error_recorded(p.barrier))) return false;
    if (me > 0)
      for_each_chain_output(E, H, tile, [&](long e, long h, int i, int j) { acc[i][j] = __ldcg(in + e * H + h); });
    return true;
  };
  const auto finish = [&](const ChainTile& tile, const ChainAcc& acc) {
    for_each_chain_output(E, H, tile, [&](long e, long h, int i, int j) {
      for (int g = to.first; g < to.end; ++g) router_relay(r.out[g], p.c)[e * H + h] = acc[i][j];
      if (to.value == r.result) store_router_grad(p, e * H + h, acc[i][j]);
    });
    relay_raise(r, to, router_unit(p.c, tile.index), threadIdx.x == 0, [] { __syncthreads(); });
  };
  router_weight_chains(pipe, p, start, finish);
}

// dx = slots + shared + router share for this GPU's tokens.
__device__ void combine_dx(Pipeline& pipe, const Params& p) {
  const auto from_shared = [&](long i, float(&acc)[8]) { start_from_shared(p, p.shared_y, i, acc); };
  const auto step = [&](const RankBuffers&, long, int j, bf16 v, float acc) {
    return combine_dx_chain(
        j, 1, [&](int) { return v; }, acc);
  };
  // Vector i's dx from its slots' sums and the router's share (8 floats; none without the router).
  const auto store = [&](long i, const float(&sums)[8], const float* router) {
    Bf16x8 dx;
#pragma unroll
    for (int c = 0; c < 8; ++c) dx.e[c] = combine_dx_round(sums[c], router ? router[c] : 0.0f);
    reinterpret_cast<Bf16x8*>(p.dx)[own_vector(p, i)] = dx;
  };
  if (!has_router(p)) {
    combine_tokens(p, from_shared, step, [&](long i, int, const float(&sums)[8]) { store(i, sums, nullptr); });
    return;
  }
  // The router's share, a chain over E an output, by tiles (chain_gemm); each tile's vectors are combined
  // by the block from its shares, left in the stages.
  const long H = p.c.hidden, E = p.c.experts, first = own_token_begin(p), M = own_token_end(p) - first;
  chain_gemm<Contiguous::along_k, Contiguous::along_mn, Streamed::none>(
      pipe, M, H, E, [&](long t, long e) { return p.d_logits + t * E + e; },
      [&](long e, long h) { return p.router_w + e * H + h; }, FromZero{},
      [&](const ChainTile& tile, const ChainAcc& acc) {
        const float* const shares = stash_chain_tile(pipe, acc);
        for (int v = threadIdx.x; v < kChainM * kChainN / 8; v += kThreads) {
          const int row = v / (kChainN / 8), col = v % (kChainN / 8) * 8;
          if (tile.m0 + row < M && tile.n0 + col < H)
            combine_token_vector(
                p, (first + tile.m0 + row) * (H / 8) + (tile.n0 + col) / 8, from_shared, step,
                [&](long i, int, const float(&sums)[8]) { store(i, sums, shares + row * kChainRowB + col); });
        }
        __syncthreads();  // the shares are read before the next tile's
      },
      ClaimedTiles{p.claimed_tiles});  // the router-weight gradient's blocks come late
}

// Shared dx = bf16(dh_s W1_s), into shared_y (free in the backward).
template <bool kFp8>
__device__ void shared_dx(Pipeline& pipe, const Params& p) {
  const int Is = p.c.shared_intermediate, H = p.c.hidden;
  if constexpr (kFp8)
    token_gemm_bf16<kNT, true>(pipe, p, p.maps.shared_dhq, p.maps.shared_w1tq, 2 * Is, H, p.shared_y, kSharedDx,
                               {p.shared_dhq.exps, p.shared_w1t_exp});
  else
    token_gemm_bf16<kNN>(pipe, p, p.maps.shared_dh, p.maps.shared_w1, 2 * Is, H, p.shared_y, kSharedDx);
}

// The saved layout is the routing's (topk_idx, the caller's): another forward's saved buffer beside it
// would give gradients of neither. The host's checks (validate.h, dispatch_layout.h): each warp checks
// the offset tables, an expert a lane, and the capacity (a saved buffer of the same routing from a Layer
// of a larger capacity_rows would place rows past the per-row buffers); where they hold (false: every
// warp finds it, and nothing may index by them) each thread checks slots, every token's: across GPUs a
// peer's tokens' topk_idx from its window (copied in before kStart), so a GPU whose saved buffer is of a
// routing that differs only at a peer's tokens is refused too, and every GPU finds the same first bad
// token (kSavedLayout; tables of no layout: no token). The launch ends at the next barrier.
__device__ bool saved_layout_is_the_routings(const Params& p) {
  const int E = p.c.experts, k = p.c.top_k, N = p.c.tokens(), rows = p.c.routed_rows();
  bool tables = saved_offsets_span(E, rows, p.offsets, p.tile_offsets);
  for (int e = lane_id(); e < E; e += 32) tables &= saved_offsets_hold_at(e, N, p.offsets, p.tile_offsets);
  if (!__all_sync(~0u, tables)) {
    if (lane_id() == 0) record_error(p.barrier, kSavedLayout, kTileTable, 0, 0);
    return false;
  }
  int tiles = 0;
  if (const int g = gpu_over_capacity(p, tiles); g >= 0) {
    if (lane_id() == 0) record_error(p.barrier, kCapacity, kTileTable, g, tiles);
    return false;
  }
  for (long s = thread_id(); s < rows; s += thread_count())
    if (!slot_is_laid_out(int32_t(s), slot_expert(p, s), E, p.offsets, p.row_source, p.slot_row))
      record_bad_token(p.barrier, kSavedLayout, kTileTable, s / k);
  return true;
}

// The backward's first phases, a kernel of their own: in the backward kernel, their code (the check, the
// pulls, recompute mode's GEMM1s) raised its register pressure and spilled in the ring phases'
// epilogues (docs/benchmarks.md, session 42). The saved layout is checked before anything reads it; an
// error stops the backward kernel at its start. Across GPUs the peers' copies of this call's inputs into
// their windows land before any peer reads them (kStart), and the gathers of the next GPU's first rows
// (the shared expert's last K-step reaches them) before the backward reads them.
template <bool kFp8>
__device__ __forceinline__ void backward_prologue(const Params& p) {
  const GridBarrier& b = p.barrier;
  start_clock(b);  // the backward kernel's stamps follow
  if (!peer_sync(b, kStart, 0)) return;
  if (saved_layout_is_the_routings(p)) {
    index_tiles(p);
    // From the layout alone: no tile index needed. The fp8 mode's saving backward pulls dW1's xe alone.
    if (p.recompute)
      pull_own_x<kFp8>(p);
    else if (!saves_xe(p.c, false))
      pull_own_x<false>(p);
  }
  if (p.c.has_shared()) {
    gather_next_rows(p, p.dy, &RankBuffers::dy);
    gather_next_rows(p, p.x, &RankBuffers::x);
  }
  if (!p.recompute) return stamp_phase(b, kTileTable);
  // The fp8 mode's shared-expert A operand, x of its tokens, read from their ranks' buffers.
  if (kFp8 && p.c.has_shared()) quantize_shared_rows(p, p.shared_xq, &RankBuffers::x);
  if (!grid_sync(b, kTileTable, 0)) return;
  // The ring phases read h of any of this GPU's tiles (and write a from it), the shared phase its own.
  Pipeline pipe = pipeline_init();
  recompute_up<kFp8>(pipe, p);
  if (p.c.has_shared()) shared_up<kFp8>(pipe, p, kExpertUp, false);
  stamp_phase(b, kExpertUp);
}

// The backward in the layer's precision: kFp8, the fp8 mode's (its own kernel, so the bf16 kernel's code
// and registers are those of the bf16 path alone).
// kPaired: the paired blocks' (as forward's).
template <bool kFp8, bool kPaired>
__device__ __forceinline__ void backward(const Params& p) {
  const GridBarrier& b = p.barrier;
  Pipeline pipe = launch_pipeline<kPaired>();
  init_tile_queue();  // (the barrier below orders it before the weight gradients)
  // The prologue's error (or an earlier launch's not raised yet) stops it before anything reads the
  // layout; across GPUs peer_sync announces it, so the peers do not wait for this GPU.
  if (!peer_sync(b, kStart, 0) || __syncthreads_or(error_recorded(b))) return;
  // The workspace's one-cycle bound (from the saved tile table, the same on every GPU): where dh lies
  // over the ring, a second cycle would overwrite it. Every block of every GPU leaves here alike.
  const int cycles = ring_cycles(p);
  if (p.one_ring_cycle && cycles > 1) {
    if (blockIdx.x == 0 && threadIdx.x == 0) record_error(b, kRingCycles, kStart, 0, cycles);
    return;
  }
  // The fp8 mode's shared-expert dy, for g_s after the cycles (A of its GEMM), beside the first cycle's
  // pull: it lies over the prologue's shared_xq.
  if (kFp8 && p.c.has_shared()) quantize_shared_rows(p, p.shared_dyq, &RankBuffers::dy);
  for (int cycle = 0; cycle < cycles; ++cycle) {
    pull_dy<kFp8>(p, cycle);
    if (!grid_sync(b, kPull, cycle)) return;
    expert_down_grad<kFp8>(pipe, p, cycle);
    if (!grid_sync(b, kDownGrad, cycle)) return;
    expert_row_grads<kFp8>(pipe, p, cycle);
    if (!grid_sync(b, kRowGrad, cycle)) return;
    expert_dx_push<kFp8>(pipe, p, cycle);
    if (!grid_sync(b, kDxPush, cycle)) return;
  }
  if (!peer_sync(b, kDxPush, cycles)) return;  // every GPU's d topk_w and dx_j pushes have landed
  if (p.c.has_shared()) {
    if constexpr (kFp8)
      shared_down_grad_fp8(pipe, p);
    else
      shared_down_grad_bf16(pipe, p);
  }
  if (has_router(p)) router_grad(pipe, p);
  // With neither (given routing, no shared expert) the phase is empty: the dx push's barrier orders what
  // follows. The fp8 kernel keeps its barrier: without it ptxas spills more (94 / 268 → 126 / 348 bytes).
  if ((kFp8 || p.c.has_shared() || has_router(p)) && !grid_sync(b, kRouterGrad, 0)) return;
  // The dx combine before the dye pull: dye may lie over the dx_j (workspace_layout); the shared dx before the
  // combine, which reads it.
  if (p.c.has_shared()) {
    shared_dx<kFp8>(pipe, p);
    if (!grid_sync(b, kSharedDx, 0)) return;
  }
  // On one GPU the router-weight gradient's chains, beside the combine's tiles, which the blocks claim as
  // they finish them (across GPUs the chains are relayed, after the weight gradients).
  if (has_router(p) && !across_gpus(p)) {
    router_weight_chains(pipe, p, FromZero{}, store_each_output(p.c.experts, p.c.hidden, [&](long e, long h, float d) {
                           store_router_grad(p, e * p.c.hidden + h, d);
                         }));
    stamp_phase(b, kRouterWeightChains);
  }
  combine_dx(pipe, p);
  if (!grid_sync(b, kCombineDx, 0)) return;
  pull_weighted_dy(p);
  if (!grid_sync(b, kDyePull, 0)) return;
  // Across GPUs the shared expert's weight gradients are relayed_chains_kernel's.
  const int own = own_expert_end(p) - own_expert_begin(p);
  const int grads = 2 * own + (p.c.has_shared() && !across_gpus(p) ? 2 : 0);
  int bf16_grads = 0;  // the first gradient on bf16 operands
  if constexpr (kFp8) {
    if (p.fp8_weight_gradients) {  // the routed experts' on E4M3 operands, the shared expert's bf16
      quantize_grad_operands(pipe, p);
      if (!grid_sync(b, kGradOperands, 0)) return;
      weight_grads<true>(pipe, p, GradWalk{0, 2 * own, 1, 0});
      // After an error the claimed walk's queue may be out of step (Pipeline::queued): no second walk.
      if (__syncthreads_or(error_recorded(b))) return;
      bf16_grads = 2 * own;
    }
  }
  if (!kFp8 && p.dw2_first) {  // dye and a lie in d_w1 (bf16 alone: workspace_layout) until dW2's tiles read them
    weight_grads<false>(pipe, p, GradWalk{1, grads / 2, 2, 0});
    if (!grid_sync(b, kDownWeightGrad, 0)) return;
    weight_grads<false>(pipe, p, GradWalk{0, grads / 2, 2, 1});
  } else {
    weight_grads<false>(pipe, p, GradWalk{bf16_grads, grads - bf16_grads, 1, 1});
  }
  // Across GPUs with no relay after it (given routing, no shared expert), a barrier across GPUs ends the
  // launch: the dye pull read the peers' topk_w in their windows, which a peer's next forward copies anew
  // before its first barrier (a relay's waits order that otherwise).
  const bool closing = across_gpus(p) && !has_router(p) && !p.c.has_shared();
  if (!(closing ? peer_sync(b, kWeightGrad, 0) : grid_sync(b, kWeightGrad, 0))) return;
  // Across GPUs the router-weight gradient's chains, relayed GPU after GPU (the last GPU's results waited
  // for last).
  if (has_router(p) && across_gpus(p)) {
    relay_router_weight_grad<false>(pipe, p);
    stamp_phase(b, kRouterWeightChains);
    if (b.peers.me < b.peers.gpus - 1) relay_router_weight_grad<true>(pipe, p);
  }
  stamp_phase(b, kEnd);
}

}  // namespace

}  // namespace mok::gpu
