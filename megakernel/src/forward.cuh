// The persistent forward: router, dispatch layout, then ring cycles of pull dispatch (x rows into xe,
// per padded row), GEMM1 + SwiGLU and GEMM2 + push combine, and the slot-ordered combine on the source
// ranks. Each of its kernels (forward.cu, forward_fp8.cu, forward_paired.cu, forward_fp8_paired.cu) is a
// translation unit of its own, so the build compiles them side by side; the phases below stay in an
// unnamed namespace, each unit's own copy, as when the kernels shared one file.
// Phases are separated by the watchdog grid barrier; every reduction is in the order of the shared
// core code, so the bits equal the CPU reference's (docs/architecture.md, docs/numerics.md).
#pragma once

#include "chain_gemm.cuh"
#include "combine_tokens.cuh"
#include "epilogue_store.cuh"
#include "expert_up.cuh"
#include "gather.cuh"
#include "gemm_phases.cuh"
#include "grid_sync.cuh"
#include "kernels.cuh"
#include "layout_scan.cuh"
#include "mok/core/combine.h"
#include "mok/core/dispatch_layout.h"
#include "mok/core/routing.h"
#include "router_scratch.cuh"
#include "row_copy.cuh"
#include "schedule.cuh"
#include "tile_gemm.cuh"
#include "tile_schedules.cuh"

namespace mok::gpu {
namespace {

// Logits of this GPU's tokens (a chain over H each), into the caller's rows of them. Where E fits a
// tile's rows, experts by tokens: the rows past E are whole idle warps (chain_gemm) and the tokens fill
// the SMs (kimi-k2, E = 32: 0.55 -> 0.46 ms); beyond, tokens by experts, whose tiles are whole where E
// is a multiple of kChainN (qwen3-30b-a3b, E = 128: 0.48 against 0.64 ms; results/2026-12-04-h200-c).
__device__ void router_logits(Pipeline& pipe, const Params& p) {
  const long H = p.c.hidden, E = p.c.experts, first = own_token_begin(p);
  const long tokens = own_token_end(p) - first;
  const auto x = [&](long t, long h) { return p.x + t * H + h; };
  const auto w = [&](long e, long h) { return p.router_w + e * H + h; };
  const auto store = [&](long t, long e, float logit) {
    p.logits[t * E + e] = logit;
    if (logit - logit != 0.0f) record_bad_token(p.barrier, kLogitOverflow, kRouterLogits, first + t);
  };
  constexpr Contiguous kK = Contiguous::along_k;
  if (E <= kChainM)
    chain_gemm<kK, kK, Streamed::b>(
        pipe, E, tokens, H, w, [&](long h, long t) { return x(t, h); }, FromZero{},
        store_each_output(E, tokens, [&](long e, long t, float logit) { store(t, e, logit); }));
  else
    chain_gemm<kK, kK, Streamed::a>(
        pipe, tokens, E, H, x, [&](long h, long e) { return w(e, h); }, FromZero{},
        store_each_output(tokens, E, store));
}

// A non-finite expert_bias would order the selection keys arbitrarily (a NaN key that is the best so far
// never loses, one that is not never wins) where the reference refuses it: block 0's first warp records
// the smallest such expert (kExpertBias); the launch stops at the selection's barrier, before anything
// reads the routing. After the logits' barrier, so that a logit overflow, recorded before it, is the one
// message where both are found, run to run.
__device__ void check_expert_bias(const Params& p) {
  if (blockIdx.x != 0 || threadIdx.x >= 32 || !p.expert_bias || p.routing != RoutingMode::router) return;
  for (int first = 0; first < p.c.experts; first += 32) {
    const int e = first + int(threadIdx.x);
    const float bias = e < p.c.experts ? p.expert_bias[e] : 0.0f;
    if (const unsigned bad = __ballot_sync(~0u, !is_finite(bias))) {
      if (threadIdx.x == 0) record_error(p.barrier, kExpertBias, kRouterSelect, 0, first + __ffs(int(bad)) - 1);
      return;
    }
  }
}

// Top-k (unless replayed) and weights of this GPU's tokens, a thread's scratch in the stages: scores, key
// and group_key, then allowed and group_allowed (router_select).
__device__ void router_select_tokens(Pipeline& pipe, const Params& p) {
  const int E = p.c.experts, k = p.c.top_k, G = selected_groups(p.c);
  for_own_tokens_with_scratch(pipe, p, 4 * (2 * E + G) + E + G, [&](long g, uint8_t* scratch) {
    float* const scores = reinterpret_cast<float*>(scratch);
    bool* const allowed = reinterpret_cast<bool*>(scores + 2 * E + G);
    const SelectScratch s{scores + E, allowed, scores + 2 * E, allowed + E};
    router_scores(p.c, p.logits + own_token_row(p, g) * E, scores);
    if (p.routing == RoutingMode::router) router_select(p.c, scores, p.expert_bias, s, p.topk_idx + g * k);
    router_weights(p.c, scores, p.topk_idx + g * k, p.topk_w + g * k);
  });
}

// A given routing (every token's, gathered: every GPU lays out all of them), copied where the layer
// reads it and checked before anything else does: an expert id outside [0, E) or twice in one token
// would send rows out of bounds, a non-finite given weight poisons y. The smallest bad token is recorded
// (kBadRouting) and the launch ends at the next barrier.
__device__ void take_given_routing(const Params& p) {
  const int E = p.c.experts, k = p.c.top_k;
  const bool weights = p.routing == RoutingMode::given;
  for (long g = thread_id(); g < p.c.tokens(); g += thread_count()) {
    uint32_t seen[kMaxExperts / 32] = {};
    bool ok = true;
    for (int j = 0; j < k; ++j) {
      const int32_t e = p.given_topk_idx[g * k + j];
      p.topk_idx[g * k + j] = e;
      const bool fresh = e >= 0 && e < E && !(seen[e / 32] >> (e % 32) & 1u);
      if (fresh) seen[e / 32] |= 1u << (e % 32);
      const float w = weights ? p.given_topk_w[g * k + j] : 0.0f;
      if (weights) p.topk_w[g * k + j] = w;
      ok = ok && fresh && w - w == 0.0f;
    }
    if (!ok) record_bad_token(p.barrier, kBadRouting, kRoutingCheck, g);
  }
}

// The route masks of chunk ch in this warp's shared-memory table (lane = the chunk's token).
__device__ void warp_route_masks(const Params& p, long ch, uint32_t* masks) {
  const int E = p.c.experts, k = p.c.top_k;
  for (int e = lane_id(); e < E; e += 32) masks[e] = 0;
  __syncwarp();
  const long g = ch * kLayoutChunk + lane_id();
  if (g < p.c.tokens())
    for (int j = 0; j < k; ++j) atomicOr(&masks[p.topk_idx[g * k + j]], route_bit(int(g)));
  __syncwarp();
}

// Each warp's route-mask table, in the GEMM stages: no copy is in flight during the layout, and the
// shared expert's GEMM that follows the place starts only after layout_place's proxy fence and
// gemm_tiles' entry barrier.
__device__ uint32_t* warp_masks(Pipeline& pipe) {
  static_assert(kLayoutChunk == 32 && sizeof(uint32_t) * kMaxExperts * (kThreads / 32) <= sizeof(pipe.smem->stage));
  return reinterpret_cast<uint32_t*>(&pipe.smem->stage[0][0]) + threadIdx.x / 32 * kMaxExperts;
}

__device__ void layout_count(Pipeline& pipe, const Params& p) {
  const int E = p.c.experts;
  uint32_t* masks = warp_masks(pipe);
  for (long ch = warp_id(); ch < layout_chunks(p.c.tokens()); ch += warp_count()) {
    warp_route_masks(p, ch, masks);
    for (int e = lane_id(); e < E; e += 32) p.chunk_counts[ch * E + e] = chunk_rows(masks[e]);
    __syncwarp();  // read before the next chunk clears them
  }
}

// Every GPU checks every GPU's tiles against the capacity (each holds the whole layout), so all stop at
// the scan's barrier together, before any row is placed, and none waits for another.
__device__ void check_capacity(const Params& p) {
  int tiles = 0;
  if (const int g = gpu_over_capacity(p, tiles); g >= 0) record_error(p.barrier, kCapacity, kLayoutScan, g, tiles);
}

// Block 0's scan (layout_scan.cuh), then its capacity check on the tile offsets.
__device__ void layout_scan(Pipeline& pipe, const Params& p) {
  if (blockIdx.x != 0) return;
  scan_layout_block(pipe, p.c.experts, layout_chunks(p.c.tokens()), p.chunk_counts, p.offsets, p.tile_offsets,
                    p.chunk_base);
  if (threadIdx.x == 0) check_capacity(p);
}

__device__ void layout_place(Pipeline& pipe, const Params& p) {
  uint32_t* masks = warp_masks(pipe);
  for (long ch = warp_id(); ch < layout_chunks(p.c.tokens()); ch += warp_count()) {
    warp_route_masks(p, ch, masks);
    const long g = ch * kLayoutChunk + lane_id();
    if (g < p.c.tokens())
      place_token(p.topk_idx, p.c.top_k, int(g), masks, p.chunk_base + ch * p.c.experts, p.row_source, p.slot_row);
    __syncwarp();
  }
  ptx::fence_async_shared();  // these generic writes come before the next GEMM's TMA writes to the stages
}

// The saved buffer's gaps are zero, so a forward gives the same bytes run to run (D1) in all of it.
// The layout region is cleared whole at the start (its arrays are written after a grid barrier);
// its offset is 256-byte aligned, so 16-byte stores cover it.
__device__ void zero_saved_gaps(const Params& p) {
  const SavedGaps& s = p.saved_gaps;
  int4* head = reinterpret_cast<int4*>(s.base);
  for (long i = thread_id(); i < s.head / long(sizeof(int4)); i += thread_count()) head[i] = int4{};
  for (long i = s.tail + thread_id(); i < s.end; i += thread_count()) s.base[i] = 0;
}

// Padded rows past this GPU's last expert's tiles, and the shared expert's rows past its last token:
// no tile writes them, so they are zeroed here and the saved buffer holds the same bytes run to run
// (D1) also where nothing reads it. In recompute mode they are the workspace's (some past the forward's:
// workspace_layout), and nothing reads them; so are the routed a, which no saved buffer holds, and xe
// where the saved buffer holds none (saves_xe).
__device__ void zero_unused_rows(const Params& p) {
  if (p.recompute) return;
  const int H = p.c.hidden, I = p.c.intermediate, Is = p.c.shared_intermediate;
  const bool xe_saved = saves_xe(p.c, false);
  for (long row = own_tile_rows(p) + warp_id(); row < p.padded_rows; row += warp_count()) {
    if (xe_saved) copy_row(p.xe + row * H, nullptr, H);
    copy_row(p.h + row * 2 * I, nullptr, 2 * I);
  }
  for (long row = p.shared_tokens.rows() + warp_id(); row < p.shared_capacity; row += warp_count()) {
    copy_row(p.shared_h + row * 2 * Is, nullptr, 2 * Is);
    copy_row(p.shared_a + row * Is, nullptr, Is);
  }
}

// The shared expert's GEMM2: shared_y = bf16(shared_a W2s^T) over its tokens.
template <bool kFp8>
__device__ void shared_down(Pipeline& pipe, const Params& p) {
  const int Is = p.c.shared_intermediate, H = p.c.hidden;
  if constexpr (kFp8)
    token_gemm_bf16<kNT, true>(pipe, p, p.maps.shared_aq, p.maps.shared_w2q, Is, H, p.shared_y, kPull,
                               {p.shared_aq.exps, p.shared_w2_exp});
  else
    token_gemm_bf16<kNT>(pipe, p, p.maps.shared_a, p.maps.shared_w2, Is, H, p.shared_y, kPull);
}

// GEMM2 and push combine: y_j = bf16(a W2^T) into the source rank's (token, slot) buffer.
template <bool kFp8>
__device__ void expert_down(Pipeline& pipe, const Params& p, int cycle) {
  const int I = p.c.intermediate, H = p.c.hidden;
  ring_gemm<kNT, kFp8>(
      pipe, p, cycle, kExpertDown, H,
      [&](const RingItem& it) {
        const int w = own_expert(p, it.t.expert) * H + it.n0;
        if constexpr (kFp8) return k_major(p.maps.aq, p.maps.w2q, it.t.pad_row, w, I, {p.aq.exps, p.w2_exp});
        return k_major(p.maps.a, p.maps.w2, it.t.pad_row, w, I);
      },
      [&](const RingItem& it, Warpgroup consumer, const float(&acc)[kAccumulators]) {
        push_to_slots(pipe, p, it, consumer, acc);
      });
}

// y of this GPU's tokens.
__device__ void combine(const Params& p) {
  const int k = p.c.top_k;
  combine_tokens(
      p, [&](long i, float(&acc)[8]) { start_from_shared(p, p.shared_y, i, acc); },
      [&](const RankBuffers& rb, long t, int j, bf16 v, float acc) {
        return combine_y_chain(
            j, 1, rb.topk_w + t * k, [&](int) { return v; }, acc);
      },
      [&](long i, int, const float(&acc)[8]) {
        Bf16x8 y;
#pragma unroll
        for (int col = 0; col < 8; ++col) y.e[col] = to_bf16(acc[col]);
        reinterpret_cast<Bf16x8*>(p.y)[own_vector(p, i)] = y;
      });
}

}  // namespace

// The forward in the layer's precision: kFp8, the fp8 mode's (its own kernel, so the bf16 kernel's code
// and registers are those of the bf16 path alone). Inlined by force, as backward() is: left a call (cicc
// did so on the GPU machine, host g++ 13), it serializes every wgmma of the kernel (ptxas C7510).
// kPaired: the paired blocks' (LaunchConfig::paired_blocks; kernels of their own, so the others keep their
// registers).
template <bool kFp8, bool kPaired>
__device__ __forceinline__ void forward(const Params& p) {
  const GridBarrier& b = p.barrier;
  start_clock(b);
  Pipeline pipe = launch_pipeline<kPaired>();
  zero_saved_gaps(p);
  // Across GPUs every GPU's copies of this call's inputs into its window land before any peer reads them.
  if (!peer_sync(b, kStart, 0)) return;
  // Across GPUs the shared expert's last K-step may reach the next GPU's first tokens.
  if (p.c.has_shared()) gather_next_rows(p, p.x, &RankBuffers::x);
  if (p.routing != RoutingMode::router) {
    if (across_gpus(p)) {  // each GPU copied in its tokens' routing; every GPU checks and lays out all
      gather_token_values(p, p.topk_idx, p.c.top_k, [&](int r) { return p.rank[r].topk_idx; });
      if (p.routing == RoutingMode::given)
        gather_token_values(p, p.topk_w, p.c.top_k, [&](int r) { return p.rank[r].topk_w; });
      if (!grid_sync(b, kStart, 0)) return;
    }
    take_given_routing(p);
    if (!grid_sync(b, kRoutingCheck, 0)) return;
  }
  if (has_router(p)) {
    router_logits(pipe, p);
    if (!grid_sync(b, kRouterLogits, 0)) return;
    check_expert_bias(p);
    router_select_tokens(pipe, p);
    if (!grid_sync(b, kRouterSelect, 0)) return;
    if (across_gpus(p) && p.routing == RoutingMode::router) {  // every GPU lays out every token's top-k
      if (!peer_sync(b, kRouterSelect, 0)) return;
      gather_token_values(p, p.topk_idx, p.c.top_k, [&](int r) { return p.rank[r].topk_idx; });
      if (!grid_sync(b, kRouterSelect, 0)) return;
    }
  }
  layout_count(pipe, p);
  if (kFp8 && p.c.has_shared()) quantize_shared_rows(p, p.shared_xq, &RankBuffers::x);
  if (!grid_sync(b, kLayoutCount, 0)) return;
  layout_scan(pipe, p);
  if (!grid_sync(b, kLayoutScan, 0)) return;
  layout_place(pipe, p);
  index_tiles(p);
  zero_unused_rows(p);
  if (p.c.has_shared()) shared_up<kFp8>(pipe, p, kLayoutPlace, true);
  if (!grid_sync(b, kLayoutPlace, 0)) return;
  if (p.c.has_shared()) shared_down<kFp8>(pipe, p);
  const int cycles = ring_cycles(p);
  for (int cycle = 0; cycle < cycles; ++cycle) {
    pull_x<kFp8>(p, cycle);
    if (!grid_sync(b, kPull, cycle)) return;
    expert_up<kFp8>(pipe, p, cycle);
    if (!grid_sync(b, kExpertUp, cycle)) return;
    expert_down<kFp8>(pipe, p, cycle);
    if (!grid_sync(b, kExpertDown, cycle)) return;
  }
  if (!peer_sync(b, kExpertDown, cycles)) return;  // every GPU's pushes have landed
  combine(p);
  stamp_phase(b, kEnd);
}

}  // namespace mok::gpu
