// GPU tests (ctest label gpu; they skip without a Hopper GPU): the megakernel against the CPU
// reference in the exact tensor-core model, bit for bit (D5), and the invariances D1-D4 on the GPU,
// across GPUs and across colocated shares of one GPU.
// Outputs are poisoned (NaN) before every launch, so an element nothing wrote cannot pass.
#include "mok/megakernel/megakernel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "core_test_support.h"
#include "hopper_options.h"
#include "mok/core/fields.h"
#include "mok/core/gradient_add.h"
#include "mok/megakernel/layer.h"
#include "mok/reference/layer.h"
#include "mok/reference/problem.h"
#include "test_configs.h"

namespace mok::gpu {
namespace {

using mok::test::expect_error;

using ref::make_problem;
using ref::Problem;
using ref::RoutingKind;

// Every field of a Forward / Gradients (mok/core/fields.h), bit for bit; each failure names the
// first differing element, both values in hex. Where both are GPU runs (the invariances), an element
// neither wrote holds the same poison in both: that fails too (first_poisoned).
template <class S>
void expect_bits(const S& got, const S& want) {
  for_each_field(got, want, [](const char* name, const auto& g, const auto& w) {
    EXPECT_EQ(first_bit_mismatch(name, g, w), "") << "(got vs want)";
    EXPECT_EQ(first_poisoned(name, g), "") << "holds the poison: nothing wrote it";
    EXPECT_EQ(first_poisoned(name, w), "") << "(want) holds the poison: nothing wrote it";
  });
}

void expect_forward_bits(const Forward& got, const Forward& want) { expect_bits(got, want); }
void expect_gradient_bits(const Gradients& got, const Gradients& want) { expect_bits(got, want); }

struct GpuRun {
  Forward fwd;
  Gradients grad;
};

GpuRun run_gpu(const Problem& p, const LaunchConfig& launch = {}) {
  Megakernel mk(p.config, p.weights, launch);
  GpuRun r;
  r.fwd = mk.forward(p.x, p.routing ? &*p.routing : nullptr);
  r.grad = mk.backward(p.dy);
  return r;
}

// G colocated shares of this GPU; a short watchdog, so that a missed barrier fails instead of hanging.
LaunchConfig colocated(int gpus) {
  return LaunchConfig{.watchdog_seconds = 5.0, .gpus = gpus, .transport = Transport::colocated};
}

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_available()) GTEST_SKIP() << "no Hopper GPU";
  }
};

LayerConfig small(int R, int T, int E, int k) { return make_config(R, T, 128, 64, E, k); }

struct Case {
  const char* name;
  LayerConfig config;
  RoutingKind kind;
};

// Built in one initialiser: GCC 13 warns (a false -Wstringop-overflow) on a push_back sequence.
std::vector<Case> cases() {
  LayerConfig sig = small(4, 24, 16, 4);
  sig.score_mode = ScoreMode::sigmoid;
  sig.n_group = 4;
  sig.topk_group = 2;
  sig.routed_scale = 2.5f;
  LayerConfig shared = small(2, 33, 8, 2);
  shared.shared_intermediate = 64;
  shared.swiglu_limit = 0.75f;
  LayerConfig wide = small(2, 48, 8, 2);
  wide.hidden = 256;
  wide.intermediate = 192;
  // Past one 128 x 256 tile, with partial last tiles: H = 448 (a second column tile of 192, staged
  // in three passes), I = 320 (GEMM1's last gate tile 64 wide), Is = 192.
  LayerConfig past_one_tile = make_config(2, 40, 448, 320, 8, 2);
  past_one_tile.shared_intermediate = 192;
  return {{"softmax_router", small(2, 40, 8, 2), RoutingKind::router},
          {"sigmoid_grouped", sig, RoutingKind::router},
          {"shared_expert_clamped", shared, RoutingKind::router},
          {"zipf", small(4, 64, 16, 4), RoutingKind::zipf},
          {"all_to_one", small(2, 50, 8, 1), RoutingKind::all_to_one},
          {"empty_experts", small(8, 9, 32, 3), RoutingKind::sparse},
          {"score_ties", small(1, 37, 8, 3), RoutingKind::router_ties},
          {"one_token", small(1, 1, 4, 4), RoutingKind::router},
          {"wider_shapes", wide, RoutingKind::uniform},
          {"past_one_tile", past_one_tile, RoutingKind::router},
          // The layout scan's warps (forward.cuh, layout_scan): E 72 in three lane groups, the last 8 of
          // 32 lanes, 19 chunks in four runs; E 400 in more groups than a block has warps.
          {"experts_in_three_lane_groups", small(2, 300, 72, 4), RoutingKind::uniform},
          {"experts_past_the_warps", small(1, 96, 400, 2), RoutingKind::uniform}};
}

TEST_F(Gpu, MatchesReferenceBitForBit) {
  const ref::Options exact = hopper_options();
  for (const Case& cs : cases()) {
    SCOPED_TRACE(cs.name);
    const Problem p = make_problem(cs.config, 1234, cs.kind);
    const Forward want_f = ref::forward(p.config, p.x, p.weights, p.routing ? &*p.routing : nullptr, exact);
    const Gradients want_g = ref::backward(p.config, p.x, p.weights, want_f, p.dy, exact);
    const GpuRun got = run_gpu(p);
    expect_forward_bits(got.fwd, want_f);
    expect_gradient_bits(got.grad, want_g);
  }
}

// Selected scores that all underflow to zero (every logit -H = -128: sigmoid 0; the renormaliser's
// 1e-20 gives zero weights, not 0/0), with a dy of 1e18 (d topk_w past 3.4e18, whose zero scores' d
// scores are 0): the GPU's forward and backward are the reference's bits.
TEST_F(Gpu, ScoresUnderflowingToZeroMatchTheReference) {
  const ref::Options exact = hopper_options();
  Problem p = make_problem(with_every_branch(small(2, 24, 8, 3)), 51);
  std::fill(p.x.begin(), p.x.end(), to_bf16(1.0f));
  std::fill(p.weights.router.begin(), p.weights.router.end(), -1.0f);
  std::fill(p.weights.expert_bias.begin(), p.weights.expert_bias.end(), 0.0f);
  for (bf16& v : p.dy) v = to_bf16(to_float(v) * 1e18f);
  const Forward want_f = ref::forward(p.config, p.x, p.weights, nullptr, exact);
  ASSERT_EQ(want_f.routing.topk_w, std::vector<float>(want_f.routing.topk_w.size(), 0.0f));
  const Gradients want_g = ref::backward(p.config, p.x, p.weights, want_f, p.dy, exact);
  ASSERT_TRUE(all_finite(want_g.d_logits) && all_finite(want_g.d_router) && all_finite(want_g.dx));
  const GpuRun got = run_gpu(p);
  expect_forward_bits(got.fwd, want_f);
  expect_gradient_bits(got.grad, want_g);
}

// A dy of the largest finite bf16s overflows g, and the chains of d topk_w, d logits and d_router meet
// +Inf and -Inf: the GPU's NaNs there are the reference's bits (the canonical NaN on both sides), in
// softmax and sigmoid mode, with a shared expert, and in fp8; with fp8 weight gradients (an expert of
// 512 rows: blocks of 128 that overflow to +Inf and -Inf) in d_w1 and d_w2 too.
TEST_F(Gpu, OverflowingGradientsMatchTheReferenceNanForNan) {
  LayerConfig fp8_rows = make_config(1, 512, 128, 128, 2, 1);
  fp8_rows.precision = Precision::fp8;
  const struct {
    const char* name;
    LayerConfig config;
    LaunchConfig launch;
  } cases[] = {{"softmax", small(2, 40, 8, 2), {}},
               {"every_branch", with_every_branch(small(2, 24, 8, 3)), {}},
               {"fp8_every_branch", fp8_every_branch(), {}},
               {"fp8_weight_gradients", fp8_rows, {.fp8_weight_gradients = true}}};
  for (const auto& cs : cases) {
    SCOPED_TRACE(cs.name);
    Problem p = make_problem(cs.config, 1234);
    p.dy = mok::test::saturated(p.dy);
    ref::Options exact = hopper_options();
    exact.fp8_weight_gradients = cs.launch.fp8_weight_gradients;
    const Forward want_f = ref::forward(p.config, p.x, p.weights, nullptr, exact);
    const Gradients want_g = ref::backward(p.config, p.x, p.weights, want_f, p.dy, exact);
    ASSERT_GT(mok::test::canonical_nans("d_topk_w", want_g.d_topk_w), 0u);
    ASSERT_GT(mok::test::canonical_nans("d_logits", want_g.d_logits), 0u);
    ASSERT_GT(mok::test::canonical_nans("d_router", want_g.d_router), 0u);
    if (cs.launch.fp8_weight_gradients) {
      ASSERT_GT(mok::test::canonical_nans("d_w1", want_g.d_w1), 0u);
      ASSERT_GT(mok::test::canonical_nans("d_w2", want_g.d_w2), 0u);
    }
    const GpuRun got = run_gpu(p, cs.launch);
    expect_forward_bits(got.fwd, want_f);
    expect_gradient_bits(got.grad, want_g);
  }
}

// D1: ten runs give the same bits.
TEST_F(Gpu, RunToRun) {
  const Problem p = make_problem(cases()[2].config, 99, RoutingKind::router);
  const GpuRun first = run_gpu(p);
  for (int run = 1; run < 10; ++run) {
    const GpuRun again = run_gpu(p);
    expect_forward_bits(again.fwd, first.fwd);
    expect_gradient_bits(again.grad, first.grad);
  }
}

// D2: the same global batch over R = 1, 2, 4, 8 ranks.
TEST_F(Gpu, RankCountInvariance) {
  const Problem base = make_problem(small(1, 64, 16, 4), 7, RoutingKind::zipf);
  const GpuRun one = run_gpu(base);
  for (int R : {2, 4, 8}) {
    SCOPED_TRACE("R = " + std::to_string(R));
    Problem p = base;
    p.config.ranks = R;
    p.config.tokens_per_rank = 64 / R;
    const GpuRun got = run_gpu(p);
    expect_forward_bits(got.fwd, one.fwd);
    expect_gradient_bits(got.grad, one.grad);
  }
}

// The NCCL transport on one GPU (a one-rank communicator; every rank's buffers in its window) gives
// the simulated ranks' bits.
TEST_F(Gpu, NcclTransportOnOneGpu) {
  for (const Case& cs : cases()) {
    SCOPED_TRACE(cs.name);
    const Problem p = make_problem(cs.config, 21, cs.kind);
    const GpuRun want = run_gpu(p);
    const GpuRun got = run_gpu(p, LaunchConfig{.transport = Transport::nccl});
    expect_forward_bits(got.fwd, want.fwd);
    expect_gradient_bits(got.grad, want.grad);
  }
}

// D2 across GPUs: the ranks spread over 2 (4, 8 where present) GPUs through NCCL windows give the bits
// of the same ranks simulated on one GPU, run after run (D1). Skips with fewer than two GPUs.
TEST_F(Gpu, AcrossGpusSameBitsAsOneGpu) {
  const int available = hopper_gpus();
  if (available < 2) GTEST_SKIP() << "needs two Hopper GPUs, found " << available;
  for (const Case& cs : cases()) {
    const Problem p = make_problem(cs.config, 22, cs.kind);
    const GpuRun want = run_gpu(p);
    for (int gpus = 2; gpus <= std::min(available, cs.config.ranks); gpus *= 2) {
      SCOPED_TRACE(std::string(cs.name) + " on " + std::to_string(gpus) + " GPUs");
      for (int run = 0; run < 2; ++run) {
        const GpuRun got = run_gpu(p, LaunchConfig{.gpus = gpus, .transport = Transport::nccl});
        expect_forward_bits(got.fwd, want.fwd);
        expect_gradient_bits(got.grad, want.grad);
      }
    }
  }
}

// The same global batch on R ranks (D2: the same bits).
Problem on_ranks(Problem p, int R) {
  p.config.tokens_per_rank = p.config.tokens() / R;
  p.config.ranks = R;
  return p;
}

// Issue 17 on one GPU: G = 2 and 4 colocated shares (each Layer holding its tokens and its experts,
// windows in device memory, barriers across shares, the chains over every token relayed share after
// share) give the bits of the same ranks simulated on one GPU, for every case of the list (a case whose ranks do not
// split over G runs as the same batch on G ranks where its tokens and experts split) and the rank-count problem at R
// = 8.
TEST_F(Gpu, ColocatedSameBitsAsSimulatedRanks) {
  std::vector<Case> all = cases();
  all.push_back({"zipf_R8", small(8, 8, 16, 4), RoutingKind::zipf});
  // A shared expert over 4 tokens per rank: on 4 shares the first holds every K-step of its chains
  // (it also computes the other shares' tokens), the others hand its sums on unchanged.
  all.push_back({"shared_4_tokens_per_rank", with_every_branch(small(4, 4, 8, 2)), RoutingKind::router});
  for (const Case& cs : all) {
    const Problem p = make_problem(cs.config, 23, cs.kind);
    const GpuRun want = run_gpu(p);
    for (int gpus : {2, 4}) {
      const LayerConfig& c = p.config;
      if (c.ranks % gpus != 0 && (c.tokens() % gpus != 0 || c.experts % gpus != 0)) continue;
      SCOPED_TRACE(std::string(cs.name) + " on " + std::to_string(gpus) + " colocated shares");
      const GpuRun got = run_gpu(c.ranks % gpus == 0 ? p : on_ranks(p, gpus), colocated(gpus));
      expect_forward_bits(got.fwd, want.fwd);
      expect_gradient_bits(got.grad, want.grad);
    }
  }
}

// The weight gradients of two backward calls of the same step accumulated (GradOutputs::accumulate):
// each element the reference's gradient added to itself.
Gradients accumulated_twice(Gradients g) {
  for (auto field :
       {&Gradients::d_router, &Gradients::d_w1, &Gradients::d_w2, &Gradients::d_shared_w1, &Gradients::d_shared_w2})
    for (float& v : g.*field) v = add_f32_gradient(v, v);
  return g;
}

// Every routing mode with a shared expert and sigmoid routing on 2 and 4 colocated shares: the
// reference's bits, twice on one wrapper (the barriers' numbers carry over from launch to launch),
// and gradients accumulated over a second backward as the reference adds them (d_router on every share).
TEST_F(Gpu, ColocatedEveryRoutingModeMatchesTheReference) {
  const LayerConfig c = with_every_branch(small(4, 20, 8, 3));
  const Problem p = make_problem(c, 24, RoutingKind::uniform);
  for (RoutingMode mode : {RoutingMode::router, RoutingMode::replay_ids, RoutingMode::given}) {
    ref::Options opt = hopper_options();
    opt.replay_ids = mode == RoutingMode::replay_ids;
    const Routing* given = mode == RoutingMode::router ? nullptr : &*p.routing;
    const Forward want_f = ref::forward(c, p.x, p.weights, given, opt);
    const Gradients want_g = ref::backward(c, p.x, p.weights, want_f, p.dy, opt);
    const Gradients twice = accumulated_twice(want_g);
    for (int gpus : {2, 4}) {
      SCOPED_TRACE("mode " + std::to_string(int(mode)) + " on " + std::to_string(gpus) + " colocated shares");
      Megakernel mk(c, p.weights, colocated(gpus));
      for (int run = 0; run < 2; ++run) {
        expect_forward_bits(mk.forward(p.x, given, opt.replay_ids), want_f);
        expect_gradient_bits(mk.backward(p.dy), want_g);
      }
      expect_gradient_bits(mk.backward(p.dy, true), twice);
    }
  }
}

// Recompute mode through the wrapper, every case: with a one-tile ring (many backward cycles after one
// recompute pass) and on 2 colocated shares (each recomputes its own experts' tiles), the reference's
// bits in recompute mode, with no h returned, as the reference's.
TEST_F(Gpu, RecomputeModeMatchesTheReference) {
  const ref::Options opt = hopper_options(true);
  for (const Case& cs : cases()) {
    const Problem p = make_problem(cs.config, 4321, cs.kind);
    const Forward want_f = ref::forward(p.config, p.x, p.weights, p.routing ? &*p.routing : nullptr, opt);
    const Gradients want_g = ref::backward(p.config, p.x, p.weights, want_f, p.dy, opt);
    for (LaunchConfig launch : {LaunchConfig{.ring_rows = 128}, colocated(2)}) {
      if (p.config.ranks % launch.gpus != 0) continue;
      SCOPED_TRACE(std::string(cs.name) + (launch.gpus > 1 ? " on 2 colocated shares" : " with a 128-row ring"));
      launch.recompute = true;
      const GpuRun got = run_gpu(p, launch);
      expect_forward_bits(got.fwd, want_f);
      expect_gradient_bits(got.grad, want_g);
    }
  }
}

// LaunchConfig::capacity_rows on 2 colocated shares: the per-row buffers hold exactly the tiles the
// routing gives the busiest share (the smallest capacity that holds them): the bits of one GPU;
// 128 rows less: every share stops with an error naming the GPU and the capacity that holds its rows.
TEST_F(Gpu, CapacityHoldsTheRoutingOrStopsEveryShare) {
  for (const Case& cs : cases()) {
    const Problem p = make_problem(cs.config, 31, cs.kind);
    const LayerConfig& c = p.config;
    if (c.ranks % 2 != 0) continue;
    SCOPED_TRACE(cs.name);
    const GpuRun want = run_gpu(p);
    const std::vector<int32_t> tiles = saved_detail::tile_offsets(want.fwd.layout);
    const int per_gpu = c.experts / 2;
    int busiest = 0, most_tiles = 0;
    for (int g = 0; g < 2; ++g)
      if (tiles[(g + 1) * per_gpu] - tiles[g * per_gpu] > most_tiles)
        busiest = g, most_tiles = tiles[(g + 1) * per_gpu] - tiles[g * per_gpu];
    // own_padded_rows holds 128 (ceil(capacity / 128) + E/G) rows.
    const long holds = long(kTileRows) * (most_tiles - per_gpu), smallest = holds - kTileRows + 1;
    if (smallest < 1) continue;  // the busiest share's tiles fit in its experts' padding alone
    LaunchConfig launch = colocated(2);
    launch.capacity_rows = smallest;
    const GpuRun got = run_gpu(p, launch);
    expect_forward_bits(got.fwd, want.fwd);
    expect_gradient_bits(got.grad, want.grad);
    if (smallest - 1 < 1) continue;
    launch.capacity_rows = smallest - 1;
    try {
      run_gpu(p, launch);
      ADD_FAILURE() << "a capacity one row short ran";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("GPU " + std::to_string(busiest) + "'s experts"), std::string::npos) << m;
      EXPECT_NE(m.find("capacity_rows >= " + std::to_string(holds)), std::string::npos) << m;
    }
  }
}

TEST_F(Gpu, RefusesACapacityBeyondTheMostRowsAGpuCanReceive) {
  const Problem p = make_problem(small(2, 16, 8, 2), 3);
  LaunchConfig launch = colocated(2);
  launch.capacity_rows = 32 * 2 + 1;  // N min(k, E/G) = 32 x 2
  expect_error([&] { Megakernel(p.config, p.weights, launch); }, "capacity_rows = 65 is outside [0, 64]");
  launch.capacity_rows = -1;
  expect_error([&] { Megakernel(p.config, p.weights, launch); }, "capacity_rows = -1 is outside [0, 64]");
}

// D3 and the ring: any block count, any ring size (here many cycles) give the same bits. With the router,
// few blocks each claim several of the dx combine's router tiles (ClaimedTiles), the rest none.
TEST_F(Gpu, LaunchAndRingInvariance) {
  for (const RoutingKind routing : {RoutingKind::one_hot, RoutingKind::router}) {
    const Problem p = make_problem(small(4, 40, 8, 4), 5, routing);
    const GpuRun base = run_gpu(p);
    for (int blocks : {1, 3, 17, 132}) {
      for (int ring : {128, 384, 4096}) {
        SCOPED_TRACE(std::string(routing == RoutingKind::router ? "router" : "one-hot") + ", blocks " +
                     std::to_string(blocks) + ", ring " + std::to_string(ring));
        const GpuRun got = run_gpu(p, LaunchConfig{blocks, ring, 10.0});
        expect_forward_bits(got.fwd, base.fwd);
        expect_gradient_bits(got.grad, base.grad);
      }
    }
  }
}

// Rows [first, first + count) of a row-major [N, width] table.
template <class T>
std::vector<T> rows_of(const std::vector<T>& v, int first, int count, int width) {
  return std::vector<T>(v.begin() + long(first) * width, v.begin() + long(first + count) * width);
}

// D4: a token's results do not depend on the other tokens in the batch: tokens [10, 31) of 64 alone give the
// whole batch's y for them (the reference's bits, on each side) and, routed by the layer's router, its logits
// and routing too.
TEST_F(Gpu, BatchInvariance) {
  for (const RoutingKind kind : {RoutingKind::uniform, RoutingKind::router}) {
    SCOPED_TRACE(kind == RoutingKind::router ? "router" : "given");
    const Problem full = make_problem(small(1, 64, 8, 2), 11, kind);
    const GpuRun all = run_gpu(full);
    Problem part = full;
    const int first = 10, count = 21, H = full.config.hidden, k = full.config.top_k, E = full.config.experts;
    part.config.tokens_per_rank = count;
    part.x = rows_of(full.x, first, count, H);
    part.dy = rows_of(full.dy, first, count, H);
    if (part.routing) {
      part.routing->topk_idx = rows_of(full.routing->topk_idx, first, count, k);
      part.routing->topk_w = rows_of(full.routing->topk_w, first, count, k);
    }
    const GpuRun sub = run_gpu(part);
    const Forward want_part =
        ref::forward(part.config, part.x, part.weights, part.routing ? &*part.routing : nullptr, hopper_options());
    expect_forward_bits(sub.fwd, want_part);
    EXPECT_EQ(first_bit_mismatch("y", sub.fwd.y, rows_of(all.fwd.y, first, count, H)), "");
    EXPECT_EQ(first_poisoned("y (whole batch)", all.fwd.y), "");
    if (kind != RoutingKind::router) continue;
    EXPECT_EQ(first_bit_mismatch("logits", sub.fwd.logits, rows_of(all.fwd.logits, first, count, E)), "");
    EXPECT_EQ(
        first_bit_mismatch("topk_idx", sub.fwd.routing.topk_idx, rows_of(all.fwd.routing.topk_idx, first, count, k)),
        "");
    EXPECT_EQ(first_bit_mismatch("topk_w", sub.fwd.routing.topk_w, rows_of(all.fwd.routing.topk_w, first, count, k)),
              "");
  }
}

// A grid barrier that waits past the watchdog reports phase and block instead of hanging: with a 1 ns
// limit, every block but the last to arrive at the first barrier times out. Both precisions' kernels.
TEST_F(Gpu, WatchdogReportsInsteadOfHanging) {
  for (const Precision precision : {Precision::bf16, Precision::fp8}) {
    LayerConfig c = make_config(2, 32, 128, 128, 8, 2);  // I 128: whole fp8 scale blocks
    c.precision = precision;
    SCOPED_TRACE(precision == Precision::fp8 ? "fp8" : "bf16");
    const Problem p = make_problem(c, 4);
    Megakernel mk(p.config, p.weights, LaunchConfig{0, 256, 1e-9});
    try {
      mk.forward(p.x, nullptr);
      ADD_FAILURE() << "the watchdog did not fire";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("watchdog"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("phase"), std::string::npos) << e.what();
    }
    Megakernel healthy(p.config, p.weights, {});
    expect_forward_bits(healthy.forward(p.x, nullptr),
                        ref::forward(p.config, p.x, p.weights, nullptr, hopper_options()));
  }
}

// The fp8 mode's forward (E4M3 GEMMs with block scales, mok/core/fp8_gemm.h) against the reference's,
// bit for bit: every GEMM phase (routed and shared GEMM1 and GEMM2), H with a last 256-column tile
// half past its end (640), several 128-column GEMM1 tiles, skewed and one-expert routing.
std::vector<Case> fp8_cases() {
  const auto fp8 = [](LayerConfig c) {
    c.precision = Precision::fp8;
    return c;
  };
  LayerConfig shared = with_every_branch(make_config(4, 33, 384, 128, 16, 4));
  shared.shared_intermediate = 256;
  return {{"fp8_router", fp8(make_config(2, 40, 256, 256, 8, 2)), RoutingKind::router},
          {"fp8_every_branch", fp8(shared), RoutingKind::router},
          {"fp8_zipf_past_one_tile", fp8(make_config(2, 70, 640, 384, 8, 2)), RoutingKind::zipf},
          {"fp8_all_to_one", fp8(make_config(2, 150, 128, 128, 4, 1)), RoutingKind::all_to_one}};
}

TEST_F(Gpu, Fp8ForwardMatchesReferenceBitForBit) {
  const ref::Options exact = hopper_options();
  for (const Case& cs : fp8_cases()) {
    SCOPED_TRACE(cs.name);
    const Problem p = make_problem(cs.config, 4321, cs.kind);
    const Forward want = ref::forward(p.config, p.x, p.weights, p.routing ? &*p.routing : nullptr, exact);
    Megakernel mk(p.config, p.weights, {});
    expect_forward_bits(mk.forward(p.x, p.routing ? &*p.routing : nullptr), want);
    // D1 for the fp8 forward: a second call gives the same bits.
    expect_forward_bits(mk.forward(p.x, p.routing ? &*p.routing : nullptr), want);
  }
}

// The fp8 forward in recompute mode (h and a in the workspace) and on 2 colocated shares of this GPU
// (each share pulls and quantizes its experts' rows from the other's window): the reference's bits.
TEST_F(Gpu, Fp8ForwardAcrossLaunchModesMatchesTheReference) {
  for (const Case& cs : fp8_cases()) {
    const Problem p = make_problem(cs.config, 77, cs.kind);
    for (const bool recompute : {false, true}) {
      const ref::Options opt = hopper_options(recompute);
      const Forward want = ref::forward(p.config, p.x, p.weights, p.routing ? &*p.routing : nullptr, opt);
      for (LaunchConfig launch : {LaunchConfig{}, colocated(2)}) {
        if (!recompute && launch.gpus == 1) continue;  // Fp8ForwardMatchesReferenceBitForBit
        SCOPED_TRACE(std::string(cs.name) + (recompute ? ", recompute" : "") +
                     (launch.gpus > 1 ? ", 2 colocated shares" : ""));
        launch.recompute = recompute;
        Megakernel mk(p.config, p.weights, launch);
        expect_forward_bits(mk.forward(p.x, p.routing ? &*p.routing : nullptr), want);
      }
    }
  }
}

// The weights quantized once per optimizer step (LaunchConfig::fp8_weights_given: the wrapper's buffer,
// quantized at construction and read by every forward), on one GPU, in recompute mode and on 2
// colocated shares (each its experts' share): the reference's bits for two micro-batches of the same
// weights, and again after quantizing anew into the same buffer (that it writes every byte whatever
// the buffer held is LayerApi.Fp8QuantizedWeightsDoNotDependOnTheBufferAndReplayInAGraph's).
TEST_F(Gpu, Fp8ForwardWithWeightsQuantizedOnceMatchesTheReference) {
  for (const Case& cs : fp8_cases()) {
    const Problem p = make_problem(cs.config, 78, cs.kind);
    Problem second = p;  // the next micro-batch: other tokens, the same weights and routing
    second.x = make_problem(cs.config, 79, cs.kind).x;
    const Routing* given = p.routing ? &*p.routing : nullptr;
    for (const bool recompute : {false, true}) {
      const ref::Options opt = hopper_options(recompute);
      const Forward want = ref::forward(p.config, p.x, p.weights, given, opt);
      const Forward want_second = ref::forward(p.config, second.x, p.weights, given, opt);
      for (LaunchConfig launch : {LaunchConfig{}, colocated(2)}) {
        SCOPED_TRACE(std::string(cs.name) + (recompute ? ", recompute" : "") +
                     (launch.gpus > 1 ? ", 2 colocated shares" : ""));
        launch.recompute = recompute;
        launch.fp8_weights_given = true;
        Megakernel mk(p.config, p.weights, launch);
        expect_forward_bits(mk.forward(p.x, given), want);
        expect_forward_bits(mk.forward(second.x, given), want_second);
        mk.quantize_weights();
        expect_forward_bits(mk.forward(p.x, given), want);
      }
    }
  }
}

// The fp8 mode's backward (the input gradients' GEMMs on E4M3 operands: dy quantized by its pull, dh by
// the per-row phase, the weights' transposed copies as B; the shared expert's g and dx alike) against
// the reference's, bit for bit, every gradient: the fp8 cases (a shared expert over N = 132 tokens, H
// with a last tile half past its end, skewed and one-expert routing, R = 2 and 4 simulated ranks), the
// backward twice on one wrapper (D1). The wrapper poisons every output before each launch.
TEST_F(Gpu, Fp8BackwardMatchesReferenceBitForBit) {
  const ref::Options exact = hopper_options();
  for (const Case& cs : fp8_cases()) {
    SCOPED_TRACE(cs.name);
    const Problem p = make_problem(cs.config, 4322, cs.kind);
    const Routing* given = p.routing ? &*p.routing : nullptr;
    const Forward want_f = ref::forward(p.config, p.x, p.weights, given, exact);
    const Gradients want_g = ref::backward(p.config, p.x, p.weights, want_f, p.dy, exact);
    Megakernel mk(p.config, p.weights, {});
    expect_forward_bits(mk.forward(p.x, given), want_f);
    expect_gradient_bits(mk.backward(p.dy), want_g);
    expect_gradient_bits(mk.backward(p.dy), want_g);
  }
}

// A launch mode of the fp8 backward tests: on one rank (the same global batch: the same bits, D2) or the
// case's ranks.
struct Mode {
  const char* name;
  bool one_rank;
  LaunchConfig launch;
};
void PrintTo(const Mode& m, std::ostream* os) { *os << m.name; }

// The fp8 backward in every launch mode: one rank (the default ring then holds every tile: one cycle,
// dh and its quantized copy over the ring), a one-tile ring (a cycle per tile), recompute mode (xe
// pulled and quantized again for GEMM1) with one rank and with a one-tile ring, 2 colocated shares (each pulls and
// quantizes its experts' dy from the other's window), and the weights quantized once
// (fp8_weights_given: the backward reads the wrapper's transposed copies) alone and with the shares,
// with and without recompute (without it the backward's sections lie over the forward's E4M3
// activations): the reference's bits in that recompute mode.
TEST_F(Gpu, Fp8BackwardAcrossLaunchModesMatchesTheReference) {
  LaunchConfig shares_given = colocated(2);
  shares_given.fp8_weights_given = true;
  LaunchConfig shares_recompute_given = shares_given;
  shares_recompute_given.recompute = true;
  const Mode modes[] = {{"one rank", true, {}},
                        {"a one-tile ring", false, {.ring_rows = 128}},
                        {"recompute, one rank", true, {.recompute = true}},
                        {"recompute, a one-tile ring", false, {.ring_rows = 128, .recompute = true}},
                        {"2 colocated shares", false, colocated(2)},
                        {"weights quantized once", false, {.fp8_weights_given = true}},
                        {"2 colocated shares, weights quantized once", false, shares_given},
                        {"2 colocated shares, recompute, weights quantized once", false, shares_recompute_given}};
  for (const Case& cs : fp8_cases()) {
    const Problem p = make_problem(cs.config, 80, cs.kind);
    for (const bool recompute : {false, true}) {
      const ref::Options opt = hopper_options(recompute);
      const Forward want_f = ref::forward(p.config, p.x, p.weights, p.routing ? &*p.routing : nullptr, opt);
      const Gradients want_g = ref::backward(p.config, p.x, p.weights, want_f, p.dy, opt);
      for (const Mode& m : modes) {
        if (m.launch.recompute != recompute) continue;
        SCOPED_TRACE(std::string(cs.name) + ", " + m.name);
        // One rank: the same global batch, so the same bits (D2).
        const GpuRun got = run_gpu(m.one_rank ? on_ranks(p, 1) : p, m.launch);
        expect_forward_bits(got.fwd, want_f);
        expect_gradient_bits(got.grad, want_g);
      }
    }
  }
}

// LaunchConfig::fp8_weight_gradients: the routed experts' weight gradients on E4M3 operands (dh, xe,
// bf16(w dy) and a quantized per column along each expert's rows, grad_operands.cuh; the chain scaled
// per row of A and per column of B, promote_columns), the shared expert's bf16: the reference's bits
// with Options::fp8_weight_gradients where the operands come from different places (one rank: one
// cycle, dh over the ring; a one-tile ring; recompute; 2 colocated shares, each its experts'; the
// weights quantized once, the backward's sections over the forward's E4M3 activations), twice each, for
// every fp8 case (experts over several tiles and none, H = 640 and I = 384, whose last tile's second
// half lies past them: B's scales padded). They differ from the bf16 chains' (the option is read).
// A third backward accumulates into the second's gradients.
//
// One launch mode per test (Modes/Fp8WeightGradients.MatchTheReference/<mode>), so a sanitizer or a failure
// names the mode.
class Fp8WeightGradients : public Gpu, public ::testing::WithParamInterface<Mode> {};

std::vector<Mode> fp8_weight_gradient_modes() {
  LaunchConfig shares = colocated(2);
  shares.fp8_weight_gradients = true;
  return {{"one_rank", true, {.fp8_weight_gradients = true}},
          {"one_tile_ring", false, {.ring_rows = 128, .fp8_weight_gradients = true}},
          {"recompute_one_tile_ring", false, {.ring_rows = 128, .recompute = true, .fp8_weight_gradients = true}},
          {"colocated_shares", false, shares},
          {"weights_quantized_once", false, {.fp8_weights_given = true, .fp8_weight_gradients = true}}};
}

void expect_fp8_weight_gradients(const Problem& p, const Mode& m) {
  const Routing* given = p.routing ? &*p.routing : nullptr;
  ref::Options opt = hopper_options(m.launch.recompute);
  const Forward want_f = ref::forward(p.config, p.x, p.weights, given, opt);
  const Gradients bf16_grads = ref::backward(p.config, p.x, p.weights, want_f, p.dy, opt);
  opt.fp8_weight_gradients = true;
  const Gradients want_g = ref::backward(p.config, p.x, p.weights, want_f, p.dy, opt);
  EXPECT_NE(first_bit_mismatch("d_w1", want_g.d_w1, bf16_grads.d_w1), "");
  const Problem q = m.one_rank ? on_ranks(p, 1) : p;
  Megakernel mk(q.config, q.weights, m.launch);
  expect_forward_bits(mk.forward(q.x, q.routing ? &*q.routing : nullptr), want_f);
  expect_gradient_bits(mk.backward(q.dy), want_g);
  expect_gradient_bits(mk.backward(q.dy), want_g);  // D1: the second backward's bits
  expect_gradient_bits(mk.backward(q.dy, true), accumulated_twice(want_g));
}

TEST_P(Fp8WeightGradients, MatchTheReference) {
  for (const Case& cs : fp8_cases()) {
    SCOPED_TRACE(cs.name);
    expect_fp8_weight_gradients(make_problem(cs.config, 81, cs.kind), GetParam());
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, Fp8WeightGradients, ::testing::ValuesIn(fp8_weight_gradient_modes()),
                         [](const ::testing::TestParamInfo<Mode>& info) { return std::string(info.param.name); });

// dy scaled by 2^-100 puts the promotions outside promote_columns' window (its other path).
TEST_F(Gpu, Fp8WeightGradientsOfTinyDyMatchTheReference) {
  Problem tiny = make_problem(fp8_cases()[2].config, 82, RoutingKind::zipf);
  for (bf16& v : tiny.dy) v = to_bf16(to_float(v) * 0x1p-100f);  // exact: the products stay normal
  expect_fp8_weight_gradients(tiny, fp8_weight_gradient_modes()[0]);
}

TEST_F(Gpu, RejectsBadLaunches) {
  const Problem p = make_problem(small(1, 16, 4, 2), 3);
  const auto launch_with = [&](const LaunchConfig& launch) {
    return [&, launch] { Megakernel(p.config, p.weights, launch); };
  };
  expect_error(launch_with(LaunchConfig{0, 64, 10.0}), "ring_rows = 64 is not a positive multiple of 128");
  expect_error(launch_with(LaunchConfig{1 << 20, 256, 10.0}), "blocks = 1048576 exceeds the");
  expect_error(launch_with(LaunchConfig{.gpus = 2}), "ranks R = 1 is not a multiple of gpus = 2");
  LayerConfig two_ranks = p.config;
  two_ranks.ranks = 2, two_ranks.tokens_per_rank = 8;
  expect_error([&] { Megakernel(two_ranks, p.weights, LaunchConfig{.gpus = 2}); },
               "gpus > 1 needs the nccl or the colocated transport");
  expect_error(launch_with(LaunchConfig{.gpus = 0, .transport = Transport::nccl}), "gpus = 0 is below 1");
  expect_error(launch_with(colocated(2)), "ranks R = 1 is not a multiple of gpus = 2");
  LaunchConfig synchronous = colocated(2);
  synchronous.synchronous = true;  // GPU 0's call would wait for share 1's, not yet made
  expect_error([&] { Megakernel(two_ranks, p.weights, synchronous); }, "LaunchConfig::synchronous with gpus = 2");
  Megakernel mk(p.config, p.weights, {});
  expect_error([&] { mk.backward(p.dy); }, "backward before any forward");
  std::vector<bf16> x = p.x;
  x[5] = bf16{0x7fc0};
  expect_error([&] { mk.forward(x, nullptr); }, "x [N, H] holds NaN or Inf");
  // Finite inputs whose router logits overflow: reported by the kernel, as the reference does.
  LayerWeights w = p.weights;
  std::fill(w.router.begin(), w.router.end(), 1.0f);
  std::fill(x.begin(), x.end(), bf16{0x7f7f});  // the largest finite bf16
  Megakernel overflowing(p.config, w, {});
  expect_error([&] { overflowing.forward(x, nullptr); }, "router logit of token 0 overflows");
}

}  // namespace
}  // namespace mok::gpu
