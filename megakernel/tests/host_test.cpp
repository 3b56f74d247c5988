// The megakernel's host arithmetic (no GPU needed, so these run in CI): the workspace's quantized weights'
// bytes and the backward's sections over one another, computed here from their rules; the ring rows the
// GPU backends take; the order of a GEMM phase's tiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "banded_tile.h"
#include "core_test_support.h"
#include "mok/megakernel/check.h"
#include "mok/megakernel/layer.h"
#include "mok/megakernel/megakernel.h"
#include "test_configs.h"

namespace mok::gpu {
namespace {

using mok::test::error_of, mok::test::expect_error;

// A machine without a CUDA driver (CI's) has no GPU to count, and that is no error: the GPU tests and
// tools skip there. (Any other CUDA failure throws, so a broken or too old driver is not taken for it.)
TEST(CudaDevices, NoDriverIsNoDeviceAndNoError) {
  int driver = -1;
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver != 0) GTEST_SKIP() << "a CUDA driver is installed";
  EXPECT_EQ(cuda_device_count(), 0);
  EXPECT_FALSE(device_available());
  EXPECT_EQ(hopper_gpus(), 0);
}

// A GEMM phase's tile order visits every tile of its grid once, band by band (kBandRows row tiles, the
// last band what is left), and within a band column by column, each column's rows in order.
TEST(BandedTiles, VisitEachTileOnceBandByBandColumnByColumn) {
  for (const int rows : {1, 2, 15, 16, 17, 33, 64, 1024})
    for (const int cols : {1, 2, 7, 8, 28}) {
      SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols) + " tiles");
      std::vector<int> visits(size_t(rows) * cols, 0);
      GridTile last{};
      for (int item = 0; item < rows * cols; ++item) {
        const GridTile t = banded_tile(item, rows, cols);
        ASSERT_TRUE(t.row >= 0 && t.row < rows && t.col >= 0 && t.col < cols) << "item " << item;
        ++visits[size_t(t.row) * cols + t.col];
        const int band = t.row / kBandRows, band_end = std::min(rows, (band + 1) * kBandRows);
        if (item > 0 && last.row / kBandRows == band) {  // within a band: down a column, then the next one's top
          const bool down = t.col == last.col && t.row == last.row + 1;
          const bool next = t.col == last.col + 1 && t.row == band * kBandRows && last.row == band_end - 1;
          EXPECT_TRUE(down || next) << "item " << item;
        } else {  // a band starts at its first tile, after the whole band before it
          EXPECT_EQ(t.col, 0) << "item " << item;
          EXPECT_EQ(t.row, band * kBandRows) << "item " << item;
          EXPECT_EQ(item, band * kBandRows * cols) << "item " << item;
        }
        last = t;
      }
      EXPECT_TRUE(std::all_of(visits.begin(), visits.end(), [](int v) { return v == 1; }));
    }
}

// The verify and fuzz GPU backends map a reference ring onto whole GPU tiles, and a ring
// the reference rejects stays rejected.
TEST(WholeTileRingRows, RoundsAReferenceRingUpAndRejectsAnInvalidOne) {
  EXPECT_EQ(whole_tile_ring_rows(16), 128);
  EXPECT_EQ(whole_tile_ring_rows(256), 256);
  EXPECT_EQ(whole_tile_ring_rows(272), 384);
  EXPECT_THROW(whole_tile_ring_rows(24), Error);
  EXPECT_THROW(whole_tile_ring_rows(0), Error);
  EXPECT_THROW(whole_tile_ring_rows(-16), Error);
}

// fp8_weights_given leaves exactly the quantized weights out of
// the workspace, whose size is this GPU's E4M3 w1, w2 and shared expert and their scale tables (a
// block row of padding each, each section 256-byte aligned), as W for the forward and as W^T for the
// backward (a forward's workspace holds the former only); none in bf16, where the flag is refused. In
// recompute mode: without it, a backward given the weights also lies over the forward's E4M3
// activations (Fp8BackwardSectionsShareBytesByLifetime).
TEST(LayerMemory, Fp8WeightsGivenLeaveTheQuantizedWeightsOutOfTheWorkspace) {
  const LayerConfig c = fp8_every_branch();
  for (const int gpus : {1, 2}) {
    SCOPED_TRACE(std::to_string(gpus) + " GPU(s)");
    const LaunchConfig launch{
        .gpus = gpus, .transport = gpus > 1 ? Transport::colocated : Transport::simulated, .recompute = true};
    LaunchConfig given_launch = launch;
    given_launch.fp8_weights_given = true;
    const LayerMemory quantizing = layer_memory(c, launch), given = layer_memory(c, given_launch);
    const size_t E = c.experts / gpus, H = c.hidden, I = c.intermediate, Is = c.shared_intermediate;
    const auto aligned = aligned_section;
    const auto weight = [&](size_t rows, size_t cols) {
      return rows * cols + aligned((rows / 128 + 1) * (cols / 128) * 4);
    };
    const size_t forward = weight(E * 2 * I, H) + weight(E * H, I) + weight(2 * Is, H) + weight(H, Is);
    const size_t transposed = weight(E * H, 2 * I) + weight(E * I, H) + weight(H, 2 * Is) + weight(Is, H);
    EXPECT_EQ(quantizing.fp8_weights, forward + transposed);
    EXPECT_EQ(given.fp8_weights, quantizing.fp8_weights);
    EXPECT_EQ(quantizing.workspace_forward - given.workspace_forward, forward);
    EXPECT_EQ(quantizing.workspace_backward - given.workspace_backward, quantizing.fp8_weights);
    EXPECT_EQ(given.saved, quantizing.saved);
  }
  LayerConfig bf16_config = c;
  bf16_config.precision = Precision::bf16;
  EXPECT_EQ(layer_memory(bf16_config, {}).fp8_weights, 0u);
  expect_error([&] { layer_memory(bf16_config, LaunchConfig{.fp8_weights_given = true}); },
               "fp8_weights_given needs precision = fp8");
}

// fp8_weight_gradients adds exactly its operands' transposed copies to the backward's workspace, after
// its other sections: for each of dh, xe, dye and a ([P, cols]) its codes [cols, P], then as A (dh,
// dye) its exponents (int8) or as B (xe, a) its scales (fp32) [P / 128, cols padded to a tile's 256] and
// its exponent ranges [P / 128] (16 bytes each), each section 256-byte aligned; nothing to the forward's
// or the saved buffer; refused in bf16.
TEST(LayerMemory, Fp8WeightGradientsAddTheirOperandsToTheBackwardWorkspace) {
  const LayerConfig c = fp8_every_branch();
  for (const int gpus : {1, 2}) {
    SCOPED_TRACE(std::to_string(gpus) + " GPU(s)");
    const LaunchConfig launch{.gpus = gpus, .transport = gpus > 1 ? Transport::colocated : Transport::simulated};
    LaunchConfig fp8_grads = launch;
    fp8_grads.fp8_weight_gradients = true;
    const LayerMemory bf16_grads = layer_memory(c, launch), with = layer_memory(c, fp8_grads);
    const size_t P = own_padded_rows(c, gpus, 0), H = c.hidden, I = c.intermediate;
    const auto padded = [](size_t cols) { return (cols + 255) / 256 * 256; };
    const auto a = [&](size_t cols) { return aligned_section(cols * P) + aligned_section(P / 128 * padded(cols)); };
    const auto b = [&](size_t cols) {
      return aligned_section(cols * P) + aligned_section(P / 128 * padded(cols) * 4) + aligned_section(P / 128 * 16);
    };
    EXPECT_EQ(with.workspace_backward - bf16_grads.workspace_backward, a(2 * I) + b(H) + a(H) + b(I));
    EXPECT_EQ(with.workspace_forward, bf16_grads.workspace_forward);
    EXPECT_EQ(with.saved, bf16_grads.saved);
  }
  LayerConfig bf16_config = c;
  bf16_config.precision = Precision::bf16;
  expect_error([&] { layer_memory(bf16_config, LaunchConfig{.fp8_weight_gradients = true}); },
               "fp8_weight_gradients needs precision = fp8");
}

// layer_memory refuses what a Layer refuses (no device needed for either check): a ring that is not
// whole tiles, a negative block count, simulated ranks over several GPUs, a watchdog that is not a finite positive
// number of seconds up to kMaxWatchdogSeconds, paired blocks of an odd count or over several GPUs.
TEST(LayerMemory, RefusesTheLaunchesALayerRefuses) {
  const LayerConfig c = make_config(2, 256, 256, 128, 8, 2);
  const auto refused = [&](const LaunchConfig& launch, const std::string& what) {
    expect_error([&] { layer_memory(c, launch); }, what);
  };
  refused({.ring_rows = 100}, "ring_rows = 100 is not a positive multiple of 128");
  refused({.ring_rows = -128}, "ring_rows = -128 is not a positive multiple of 128");
  refused({.blocks = -1}, "blocks = -1 is negative");
  refused({.gpus = 2}, "gpus > 1 needs the nccl or the colocated transport");
  refused({.blocks = 3, .paired_blocks = true}, "blocks = 3 is odd: paired_blocks runs the blocks in pairs");
  refused({.gpus = 2, .transport = Transport::colocated, .paired_blocks = true}, "paired_blocks runs on one GPU");
  EXPECT_NO_THROW(layer_memory(c, {.blocks = 4, .paired_blocks = true}));
  for (const double seconds :
       {0.0, -1.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN(), 1e12})
    refused({.watchdog_seconds = seconds}, "watchdog_seconds = " + std::to_string(seconds) + " is outside (0, ");
  EXPECT_NO_THROW(layer_memory(c, {.watchdog_seconds = kMaxWatchdogSeconds}));
}

// A ring past a rank's most rows (N min(k, E/R) and a tile per expert, the forward's one cycle) would never be
// filled: it is that ring (mok-bench --plan --ring-rows 1000000000 planned an 8 TB workspace).
TEST(LayerMemory, ARingPastARanksMostRowsIsThatRing) {
  const LayerConfig c = make_config(2, 256, 256, 128, 8, 2);  // a rank's 4 experts: 512 min(2, 4) = 1024 rows
  const int most = (1024 / 128 + 4) * 128;
  const int largest = std::numeric_limits<int>::max() / 128 * 128;
  const LaunchConfig colocated{.gpus = 2, .transport = Transport::colocated};
  for (const LaunchConfig& base : {LaunchConfig{}, LaunchConfig{.recompute = true}, colocated}) {
    SCOPED_TRACE(std::to_string(base.gpus) + " GPU(s)" + (base.recompute ? ", recompute" : ""));
    LaunchConfig at_most = base;
    at_most.ring_rows = most;
    const LayerMemory want = layer_memory(c, at_most);
    for (const int ring : {most + 128, 1 << 20, largest}) {
      SCOPED_TRACE("ring_rows = " + std::to_string(ring));
      LaunchConfig past = base;
      past.ring_rows = ring;
      const LayerMemory got = layer_memory(c, past);
      EXPECT_EQ(got.workspace_backward, want.workspace_backward);
      EXPECT_EQ(got.workspace_forward, want.workspace_forward);
      EXPECT_EQ(got.saved, want.saved);
      EXPECT_EQ(got.window, want.window);
    }
  }
}

// At validate's bounds the workspace's sizes do not wrap: with R = 64 ranks' rings, each of a rank's most
// rows (the whole batch), and g beside them at I = 2^30 - 64 (T halved until validate accepts the config:
// its tensors within 1 PiB), each workspace holds at least its largest sections (taken in double) and stays
// below 2^63, where the size_t sums wrapped before. (validate_test has the saved buffer's exact size.)
TEST(LayerMemory, TheLargestRingsOfTheLargestConfigDoNotWrap) {
  LayerConfig c = make_config(64, std::numeric_limits<int>::max() / 64 / 512, 64, (1 << 30) - 64, 512, 8);
  c.shared_intermediate = c.intermediate;
  const auto refused = [&] { return !error_of([&] { validate(c); }).empty(); };
  while (c.tokens_per_rank > 1 && refused()) c.tokens_per_rank /= 2;
  ASSERT_FALSE(refused());
  const long rank_rows = long(c.tokens()) * std::min(c.top_k, c.experts_per_rank());
  const int ring = int((rank_rows / 128 + c.experts_per_rank()) * 128);
  const LayerMemory m = layer_memory(c, {.ring_rows = ring, .recompute = true});
  const double g = double(c.ranks) * ring * c.intermediate * 4;  // g: fp32 [R ring_rows, I], apart from the rest
  EXPECT_GE(double(m.workspace_backward), g);
  EXPECT_LT(double(m.workspace_backward), 0x1p63);
  const double P = double(own_padded_rows(c, 1, 0));
  EXPECT_GE(double(m.workspace_forward), P * 2 * (c.hidden + c.intermediate));  // xe and a
  EXPECT_GE(double(m.workspace_backward), P * 6 * c.intermediate);              // h and a
}

// A peer group's Layer keeps the (token, slot) rows in its window, one GPU's too: layer_memory gives it
// a window and no slots section in the workspace (N k H bf16 less than simulated ranks').
TEST(LayerMemory, APeerGroupsLayerHasAWindowAndNoSlotsInItsWorkspace) {
  const LayerConfig c = make_config(2, 256, 256, 128, 8, 2);
  const LayerMemory simulated = layer_memory(c, {}), one_gpu = layer_memory(c, {.transport = Transport::nccl});
  EXPECT_EQ(simulated.window, 0u);
  EXPECT_GT(one_gpu.window, 0u);
  EXPECT_EQ(simulated.workspace_forward - one_gpu.workspace_forward,
            aligned_section(size_t(c.tokens()) * c.top_k * c.hidden * 2));
}

// Recompute mode moves each routed row's xe and h (P (2 H + 4 I) bytes, P a GPU's per-row rows) and
// the shared expert's h and a from the saved buffer into the workspace: the saved buffer keeps the
// layout alone, in bf16 and fp8, on one GPU and on each of two, with a capacity too. The forward's
// workspace grows by the bf16 operands of its GEMMs alone (xe and the shared expert's a; the routed a
// is the bf16 forward's in either mode, as no saved buffer holds it; in the fp8 mode none, its GEMMs
// read E4M3 ones), less, on one GPU, the (token, slot) rows, which it pushes over xe; h and the shared
// expert's h only the backward writes. The fp8 mode saves no xe in either mode (saves_xe): its saving
// backward's workspace holds it.
TEST(LayerMemory, RecomputeMovesTheActivationsFromSavedToTheWorkspace) {
  const LayerConfig bf16_config = with_every_branch(make_config(2, 40, 128, 64, 8, 3));
  const LaunchConfig colocated{.gpus = 2, .transport = Transport::colocated};
  LaunchConfig capacity = colocated;
  capacity.capacity_rows = 128;
  for (const LayerConfig& c : {bf16_config, fp8_every_branch()})
    for (const LaunchConfig& saving : {LaunchConfig{}, LaunchConfig{.ring_rows = 128}, colocated, capacity}) {
      SCOPED_TRACE(std::string(c.precision == Precision::fp8 ? "fp8" : "bf16") + ", " + std::to_string(saving.gpus) +
                   " GPU(s), capacity " + std::to_string(saving.capacity_rows));
      LaunchConfig recomputing = saving;
      recomputing.recompute = true;
      const LayerMemory with = layer_memory(c, saving), without = layer_memory(c, recomputing);
      // xe and h [P, H], [P, 2I] and the shared expert's h and a [S, 2 Is], [S, Is] (bf16).
      const size_t P = own_padded_rows(c, saving.gpus, saving.capacity_rows), Is = c.shared_intermediate;
      const size_t S = shared_rows_capacity(c, saving.gpus);
      const size_t moved = P * (2 * size_t(c.hidden) + 4 * size_t(c.intermediate)) + aligned_section(S * 2 * Is * 2) +
                           aligned_section(S * Is * 2);
      const size_t bf16_operands = P * 2 * size_t(c.hidden) + aligned_section(S * Is * 2);
      const bool one_gpu = saving.transport == Transport::simulated;
      const size_t y_over_xe = one_gpu ? aligned_section(size_t(c.tokens()) * c.top_k * c.hidden * 2) : 0;
      const size_t operands = c.precision == Precision::fp8 ? 0 : bf16_operands - y_over_xe;
      const size_t xe_in_workspace = saves_xe(c, false) ? 0 : P * size_t(c.hidden) * 2;
      ASSERT_GT(Is, 0u);
      EXPECT_EQ(with.saved - without.saved, moved - xe_in_workspace);
      EXPECT_EQ(without.workspace_forward - with.workspace_forward, operands);
      // What stays: the layout, offsets and tile offsets [E + 1], row_source and slot_row [N k] (int32).
      const size_t E = c.experts, Nk = size_t(c.tokens()) * c.top_k;
      EXPECT_EQ(without.saved, 2 * aligned_section((E + 1) * 4) + 2 * aligned_section(Nk * 4));
    }
}

// A case of the backward's section tests: a config and launch, its ring rows per rank, and whether one
// ring cycle holds every rank's tiles whatever the routing.
struct SectionCase {
  const char* name;
  LayerConfig c;
  LaunchConfig launch;
  size_t ring_rows;
  bool one_cycle;
};

// The backward's own sections share bytes by lifetime (docs/architecture.md, "The backward's
// buffers"): g per ring row; dye and shared_dh over the ring and g (both dead after the ring cycles),
// and in recompute mode with several cycles over h too (which, with the shared expert's h, only the
// backward writes: they lie past the forward's workspace, h last, and on one GPU the (token, slot) buffer
// before them, as the recompute forward pushes its y_j over xe); with one
// ring cycle whatever the routing (every rank's most tiles, N min(k, E/R) rows and a part tile per
// expert, capped by the GPU's capacity, fit its ring), dh over the ring too, g past it. With one cycle,
// the (token, slot) buffer in the workspace (simulated ranks) and no recompute, the dx_j lie past dh
// (over g), dye over them, and the backward's sections start at the forward's slots (their bytes come
// off). The sizes are computed here from that rule, not by the layout's code.
TEST(LayerMemory, BackwardSectionsShareBytesByLifetime) {
  const LayerConfig one_rank = with_every_branch(make_config(1, 80, 128, 64, 8, 3));  // N 80, k 3, E 8
  const LayerConfig two_ranks = with_every_branch(make_config(2, 40, 128, 64, 8, 3));
  const LaunchConfig colocated{.gpus = 2, .transport = Transport::colocated};
  // One rank: at most N k = 240 rows, 9 tiles; the default ring holds N k rows and a tile per expert (9).
  // Two ranks: a rank's 4 experts hold at most N min(k, 4) = 240 rows, 5 tiles; the default ring an
  // average rank's 120 rows (4 tiles). Two GPUs: the same 5 tiles (each GPU's capacity holds 6).
  // Two GPUs of 400 tokens per rank, a capacity of 128 rows: each GPU's buffers hold 5 tiles, fewer
  // than a rank's 22 (N min(k, 4) = 2400 rows).
  LaunchConfig recompute{.ring_rows = 640, .recompute = true}, two_gpus_ring = colocated;
  two_gpus_ring.ring_rows = 640;
  LaunchConfig capacity = two_gpus_ring, past_capacity = colocated;
  capacity.capacity_rows = past_capacity.capacity_rows = 128;
  past_capacity.ring_rows = 512;
  const LayerConfig long_ranks = with_every_branch(make_config(2, 400, 128, 64, 8, 3));
  const SectionCase cases[] = {
      {"one rank, default ring", one_rank, {}, 1152, true},
      {"one rank, one-tile ring", one_rank, {.ring_rows = 128}, 128, false},
      {"two ranks, default ring", two_ranks, {}, 512, false},
      {"two ranks, 5-tile ring", two_ranks, {.ring_rows = 640}, 640, true},
      {"two ranks, 4-tile ring", two_ranks, {.ring_rows = 512}, 512, false},
      {"two ranks, 5-tile ring, recompute", two_ranks, recompute, 640, true},
      {"two ranks, default ring, recompute", two_ranks, {.recompute = true}, 512, false},
      {"one rank, one-tile ring, recompute", one_rank, {.ring_rows = 128, .recompute = true}, 128, false},
      {"two GPUs, default ring", two_ranks, colocated, 512, false},
      {"two GPUs, 5-tile ring", two_ranks, two_gpus_ring, 640, true},
      {"two GPUs, capacity 128, 5-tile ring", long_ranks, capacity, 640, true},
      {"two GPUs, capacity 128, 4-tile ring", long_ranks, past_capacity, 512, false}};
  const auto aligned = aligned_section;
  for (const SectionCase& t : cases) {
    SCOPED_TRACE(t.name);
    const LayerConfig& c = t.c;
    const size_t H = c.hidden, I = c.intermediate, Is = c.shared_intermediate;
    // A GPU's shared expert's rows: its tokens and the next GPU's up to the next 16-row step.
    const size_t S = shared_rows_capacity(c, t.launch.gpus);
    const size_t P = own_padded_rows(c, t.launch.gpus, t.launch.capacity_rows),
                 rows = size_t(c.ranks / t.launch.gpus) * t.ring_rows;
    const size_t ring = aligned(rows * H * 2), g = aligned(rows * I * 4), dh = aligned(P * 2 * I * 2);
    const size_t dye = aligned(P * H * 2), shared_dh = aligned(S * 2 * Is * 2);
    const size_t h = t.launch.recompute ? aligned(P * 2 * I * 2) : 0;  // the last section before the backward's
    const bool one_gpu = t.launch.transport == Transport::simulated;
    const size_t slots = aligned(size_t(c.tokens()) * c.top_k * H * 2);
    // h, the shared expert's h and (one GPU) the slots
    const size_t backward_only = t.launch.recompute ? shared_dh + h + (one_gpu ? slots : 0) : 0;
    const size_t late = dye + shared_dh, past_h = late > h ? late - h : 0;
    const bool dx_slots_past_dh = t.one_cycle && !t.launch.recompute && one_gpu;
    const size_t own = dx_slots_past_dh ? std::max(std::max(ring, dh) + g, dh + std::max(slots, dye) + shared_dh)
                       : t.one_cycle    ? std::max(std::max(ring, dh) + g, dh + late)
                                        : dh + std::max(ring + g, past_h);
    const LayerMemory m = layer_memory(c, t.launch);
    EXPECT_EQ(m.workspace_backward - m.workspace_forward + (dx_slots_past_dh ? slots : 0), backward_only + own);
    // Each section apart, g per padded row (the layout before): every case holds less.
    EXPECT_LT(own, ring + aligned(P * I * 4) + dh + dye + shared_dh);
  }
}

// The fp8 backward's own sections by lifetime (docs/architecture.md, "The backward's
// buffers"): the weights' transposed copies first (unless the caller's); the ring quantized (values
// and a scale exponent per 1 x 128 block) in the bf16 ring's place; dh quantized per ring row over the
// ring (after dh with one cycle), g past both; shared dh quantized after shared_dh; the shared
// expert's tokens' dy quantized in the forward's shared_xq section (no bytes of its own). Without recompute and with
// the weights given, all of them over the forward's xq, aq and shared_aq (only the bytes past those are the backward's
// own), and with one cycle and simulated ranks from the slots, the dx_j past dh and dhq, dye over them. In recompute
// mode the activations the backward makes again (xe, a, h, the shared expert's a and h), which the fp8 forward does not
// write, lie past the transposed copies, but for the shared expert's h and a where they fit over the forward's aq
// (which the recompute backward does not touch); without it, xe, which the forward saves none of (saves_xe), and the
// routed a, which no saved buffer holds, apart past them all. Computed here from that rule.
TEST(LayerMemory, Fp8BackwardSectionsShareBytesByLifetime) {
  LayerConfig one_rank = with_every_branch(make_config(1, 80, 256, 128, 8, 3));  // N 80, k 3, E 8
  one_rank.shared_intermediate = 128;
  one_rank.precision = Precision::fp8;
  const LayerConfig two_ranks = fp8_every_branch();  // R 2, T 40
  // H = 16 I: the forward's E4M3 activations past the slots outweigh the backward's own sections but xe.
  LayerConfig wide = with_every_branch(make_config(1, 1024, 2048, 128, 8, 3));
  wide.shared_intermediate = 128;
  wide.precision = Precision::fp8;
  const LaunchConfig colocated{.gpus = 2, .transport = Transport::colocated};
  const LaunchConfig given{.fp8_weights_given = true};
  const LaunchConfig given_one_tile{.ring_rows = 128, .fp8_weights_given = true};
  const LaunchConfig given_recompute{.recompute = true, .fp8_weights_given = true};
  LaunchConfig colocated_given = colocated;
  colocated_given.fp8_weights_given = true;
  LaunchConfig colocated_recompute = colocated;
  colocated_recompute.recompute = true;
  LayerConfig wide_shared = one_rank;  // the shared expert's h and a too large to lie over aq
  wide_shared.shared_intermediate = 1024;
  const SectionCase cases[] = {
      {"one rank, default ring", one_rank, {}, 1152, true},
      {"one rank, default ring, weights given", one_rank, given, 1152, true},
      {"one rank, one-tile ring, weights given", one_rank, given_one_tile, 128, false},
      {"one rank, default ring, recompute, weights given", one_rank, given_recompute, 1152, true},
      {"one rank, one-tile ring", one_rank, {.ring_rows = 128}, 128, false},
      {"one rank, one-tile ring, recompute", one_rank, {.ring_rows = 128, .recompute = true}, 128, false},
      {"one rank, default ring, recompute, a wide shared expert", wide_shared, {.recompute = true}, 1152, true},
      {"two GPUs, default ring, recompute", two_ranks, colocated_recompute, 512, false},
      {"two ranks, default ring", two_ranks, {}, 512, false},
      {"two ranks, 5-tile ring", two_ranks, {.ring_rows = 640}, 640, true},
      {"two GPUs, default ring", two_ranks, colocated, 512, false},
      {"two GPUs, default ring, weights given", two_ranks, colocated_given, 512, false},
      {"one rank, H = 16 I, default ring, weights given", wide, given, 4096, true}};
  const auto aligned = aligned_section;
  const auto fp8 = fp8_section_bytes;
  for (const SectionCase& t : cases) {
    SCOPED_TRACE(t.name);
    const LayerConfig& c = t.c;
    const size_t H = c.hidden, I = c.intermediate, Is = c.shared_intermediate, E = c.experts;
    const size_t S = shared_rows_capacity(c, t.launch.gpus);  // a GPU's shared expert's rows
    const size_t P = own_padded_rows(c, t.launch.gpus, t.launch.capacity_rows),
                 rows = size_t(c.ranks / t.launch.gpus) * t.ring_rows;
    // A weight's table has one block row more.
    const auto weight = [&](size_t r, size_t cols) { return fp8(r, cols, r ? r / 128 + 1 : 0); };
    const size_t Eg = E / t.launch.gpus;
    const size_t transposed =
        t.launch.fp8_weights_given ? 0 : weight(Eg * H, 2 * I) + weight(Eg * I, H) + weight(H, 2 * Is) + weight(Is, H);
    const size_t ringq = fp8(rows, H, rows), dhq = fp8(rows, 2 * I, rows), g = aligned(rows * I * 4);
    const size_t dh = aligned(P * 2 * I * 2), dye = aligned(P * H * 2), shared_dh = aligned(S * 2 * Is * 2);
    const size_t shared = shared_dh + fp8(S, 2 * Is, (S + 127) / 128 * 128), late = dye + shared;
    const size_t dead = t.launch.fp8_weights_given && !t.launch.recompute ? fp8_activation_bytes(c, P, S) : 0;
    // One cycle, simulated ranks, the weights given, no recompute: from the forward's slots, the dx_j past
    // dh and dhq, dye over them.
    const bool dx_slots_past_dh = t.one_cycle && dead && t.launch.transport == Transport::simulated;
    const size_t slots = dx_slots_past_dh ? aligned(size_t(c.tokens()) * c.top_k * H * 2) : 0;
    const size_t shared_h = aligned(S * 2 * Is * 2), shared_h_and_a = shared_h + aligned(S * Is * 2), aq = P * I;
    const size_t shared_apart = shared_h_and_a <= aq ? 0 : shared_h_and_a;
    const size_t recomputed = t.launch.recompute ? aligned(P * H * 2) + aligned(P * I * 2) + shared_apart + dh : 0;
    // The saving backward's xe (pulled: saves_xe) and a (from h: never saved), apart.
    const size_t apart = t.launch.recompute ? 0 : aligned(P * H * 2) + aligned(P * I * 2);
    const size_t own =
        transposed + recomputed + apart +
        (dx_slots_past_dh ? std::max(std::max(ringq, dh + dhq) + g, dh + dhq + std::max(slots, dye) + shared)
         : t.one_cycle    ? std::max(std::max(ringq, dh + dhq) + g, dh + late)
                          : dh + std::max(std::max(ringq, dhq) + g, late));
    const LayerMemory m = layer_memory(c, t.launch);
    EXPECT_EQ(m.workspace_backward - m.workspace_forward, own - slots - dead);
  }
}

}  // namespace
}  // namespace mok::gpu
