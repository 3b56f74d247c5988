// The workspace's buffers by lifetime, checked against the layout's offsets (workspace_layout): no two
// buffers that one phase of the backward holds at once share a byte. The lifetimes are
// docs/architecture.md's table ("The backward's buffers"), written here in the backward's phase order;
// the layout's own code is not consulted for them. No GPU needed.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <tuple>
#include <vector>

#include "mok/core/saved_layout.h"
#include "test_configs.h"
#include "workspace_layout.h"

namespace mok::gpu {
namespace {

// The backward's phases in order, with two ring cycles where the layout allows several (the second
// cycle's buffers reuse the first's bytes).
struct Phases {
  int cycles;
  static constexpr int kPrologue = 0, kRecompute = 1;  // the tile table; recompute mode's h
  int pull(int c) const { return 2 + 4 * c; }
  int down(int c) const { return 3 + 4 * c; }
  int row(int c) const { return 4 + 4 * c; }
  int push(int c) const { return 5 + 4 * c; }
  int router() const { return 2 + 4 * cycles; }  // the router backward, shared dy W2
  int shared_dx() const { return router() + 1; }
  int combine() const { return router() + 2; }
  int dye_pull() const { return router() + 3; }
  int operands() const { return router() + 4; }      // the fp8 weight gradients' operands
  int weight_grads() const { return router() + 5; }  // all of them, or dW2's first (the scratch in d_w1)
  int dw1_grads() const { return router() + 6; }     // dW1's after dW2's, or (one walk) still the same walk
};

// Bytes [begin, end) of the workspace (or of d_w1: in_d_w1), live from phase `first` to phase `last`, both
// included.
struct Buffer {
  std::string name;
  size_t begin, end;
  int first, last;
  bool in_d_w1;
};

class Buffers {
 public:
  void add(const std::string& name, size_t at, size_t bytes, int first, int last, bool in_d_w1 = false) {
    if (bytes) list_.push_back({name, at, at + bytes, first, last, in_d_w1});
  }
  void add(const std::string& name, const Fp8Section& at, size_t values, int first, int last) {
    add(name, at.values, values, first, last);
    add(name + " exponents", at.exps, at.exp_bytes, first, last);
  }
  // Every pair sharing a byte (of one buffer) is live in no phase together.
  void expect_disjoint_where_live_together() const {
    for (size_t i = 0; i < list_.size(); ++i)
      for (size_t j = i + 1; j < list_.size(); ++j) {
        const Buffer &a = list_[i], &b = list_[j];
        const bool share_bytes = a.in_d_w1 == b.in_d_w1 && a.begin < b.end && b.begin < a.end;
        const bool live_together = a.first <= b.last && b.first <= a.last;
        EXPECT_FALSE(share_bytes && live_together) << a.name << " and " << b.name << " share bytes while both live";
      }
  }
  void expect_within(size_t workspace_bytes, size_t d_w1_bytes) const {  // d_w1's: as bf16
    for (const Buffer& b : list_) EXPECT_LE(b.end, b.in_d_w1 ? d_w1_bytes : workspace_bytes) << b.name;
  }

 private:
  std::vector<Buffer> list_;
};

struct LayoutCase {
  const char* name;
  LayerConfig c;
  LaunchConfig launch;  // ring_rows given: the layout takes them as they are
};

// The backward's buffers of one layout, with their lifetimes.
Buffers backward_buffers(const LayerConfig& c, const LaunchConfig& launch, const WorkspaceLayout& l) {
  const size_t N = c.tokens(), H = c.hidden, I = c.intermediate, Is = c.shared_intermediate, k = c.top_k;
  const size_t P = own_padded_rows(c, launch.gpus, launch.capacity_rows), S = shared_rows_capacity(c, launch.gpus);
  const size_t rows = size_t(c.ranks / launch.gpus) * launch.ring_rows;  // the GPU's rings
  const bool fp8 = c.precision == Precision::fp8, recompute = launch.recompute, d = l.in_d_w1;
  const Phases ph{l.one_cycle ? 1 : 2};
  const int end = ph.dw1_grads(), last_row = ph.row(ph.cycles - 1);
  // dW2's operands: read until dW1's tiles start where the scratch lies in d_w1 (dW2's first), else to the end.
  const int dw2_end = d ? ph.weight_grads() : end;
  Buffers b;
  b.add("barrier and layout tables", l.barrier, l.shared_y - l.barrier, Phases::kPrologue, end);
  for (int cycle = 0; cycle < ph.cycles; ++cycle) {
    const std::string in = " of cycle " + std::to_string(cycle);
    if (fp8) {
      b.add("ringq" + in, l.ringq, rows * H, ph.pull(cycle), ph.down(cycle));
      b.add("dhq" + in, l.dhq, rows * 2 * I, ph.row(cycle), ph.push(cycle));
    } else {
      b.add("ring" + in, l.ring, rows * H * 2, ph.pull(cycle), ph.down(cycle), d);
    }
    b.add("g" + in, l.g, rows * I * 4, ph.down(cycle), ph.row(cycle), d);
  }
  if (!l.dh_over_h) b.add("dh", l.dh, P * 2 * I * 2, ph.row(0), end);  // else in the saved buffer, over h
  if (launch.transport == Transport::simulated)
    b.add("dx slots", l.dx_slots, N * k * H * 2, ph.push(0), ph.combine(), d);
  b.add("shared_dh", l.shared_dh, S * 2 * Is * 2, ph.router(), end);
  if (c.has_shared()) b.add("shared_y", l.shared_y, S * H * 2, ph.shared_dx(), ph.combine());
  b.add("dye", l.dye, P * H * 2, ph.dye_pull(), dw2_end, d);
  if (!saves_xe(c, recompute)) b.add("xe", l.xe, P * H * 2, Phases::kPrologue, end);
  b.add("a", l.a, P * I * 2, ph.row(0), dw2_end, d);  // from h, by the per-row phase (no saved buffer holds it)
  // d_w1 itself, written by dW1's tiles.
  if (d) b.add("d_w1's gradients", 0, c.experts / launch.gpus * 2 * I * H * 2, ph.dw1_grads(), end, true);
  if (recompute) {
    b.add("h", l.h, P * 2 * I * 2, Phases::kRecompute, last_row);
    b.add("shared_h", l.shared_h, S * 2 * Is * 2, Phases::kRecompute, ph.router());
    b.add("shared_a", l.shared_a, S * Is * 2, Phases::kRecompute, end);
  }
  if (fp8) {
    b.add("shared_xq as shared_dyq", l.fp8.shared_xq, S * (Is ? H : 0), Phases::kPrologue, ph.router());
    b.add("shared_dhq", l.shared_dhq, S * 2 * Is, ph.router(), ph.shared_dx());
    // No aq: no backward writes or reads it (the recompute's GEMM1 writes the routed h alone), so the shared
    // expert's h and a may lie over it; a backward that came to read it would be caught by the GPU tests alone.
    if (recompute) {  // the GEMM1s read xq; the shared one writes shared_aq, which nothing reads (the routed h alone)
      b.add("xq", l.fp8.xq, P * H, Phases::kPrologue, Phases::kRecompute);
      b.add("shared_aq", l.fp8.shared_aq, S * Is, Phases::kRecompute, Phases::kRecompute);
    }
    if (!launch.fp8_weights_given)  // both copies, quantized before the launch
      b.add("quantized weights", l.fp8_weights, layer_memory(c, launch).fp8_weights, Phases::kPrologue, end);
    using Columns = std::tuple<const char*, ColumnsSection, size_t>;  // a [cols, P] operand's codes
    if (launch.fp8_weight_gradients)
      for (const auto& [name, at, cols] : std::initializer_list<Columns>{
               {"dhtq", l.dhtq, 2 * I}, {"xetq", l.xetq, H}, {"dyetq", l.dyetq, H}, {"atq", l.atq, I}})
        b.add(name, at.values, cols * P, ph.operands(), end);
  }
  return b;
}

TEST(BackwardBuffers, NoTwoLiveTogetherShareAByte) {
  const LaunchConfig colocated{.gpus = 2, .transport = Transport::colocated};
  LaunchConfig colocated_recompute = colocated;
  colocated_recompute.recompute = true;
  LaunchConfig colocated_capacity_given = colocated;
  colocated_capacity_given.capacity_rows = 128;
  colocated_capacity_given.fp8_weights_given = true;
  const auto launch = [](LaunchConfig l, int ring_rows) {
    l.ring_rows = ring_rows;
    return l;
  };
  const LayerConfig one_rank = with_every_branch(make_config(1, 80, 128, 64, 8, 3));
  const LayerConfig two_ranks = with_every_branch(make_config(2, 40, 128, 64, 8, 3));
  LayerConfig fp8_one_rank = with_every_branch(make_config(1, 80, 256, 128, 8, 3));
  fp8_one_rank.shared_intermediate = 128;
  fp8_one_rank.precision = Precision::fp8;
  const LayerConfig olmoe = make_config(1, 8192, 2048, 1024, 64, 8);
  // H = 16 I: the backward's own shorter than what follows the forward's slots.
  LayerConfig fp8_wide = with_every_branch(make_config(1, 1024, 2048, 128, 8, 3));
  fp8_wide.shared_intermediate = 128;
  fp8_wide.precision = Precision::fp8;
  LayerConfig fp8_olmoe = olmoe;
  fp8_olmoe.precision = Precision::fp8;
  LayerConfig fp8_wide_shared = fp8_one_rank;  // the shared expert's h and a too large to lie over aq
  fp8_wide_shared.shared_intermediate = 1024;
  const int olmoe_ring = (8192 * 8 / 128 + 64) * 128;  // the default ring: an average rank's rows
  // H = 512, I = 256: the scratch fits in d_w1 (BackwardScratch::in_d_w1), with one ring cycle or several.
  const LayerConfig scratch_fits = with_every_branch(make_config(1, 80, 512, 256, 8, 3));
  const LayerConfig scratch_fits_two_ranks = with_every_branch(make_config(2, 40, 512, 256, 8, 3));
  const std::vector<LayoutCase> cases = {
      {"one rank, one cycle", one_rank, launch({}, 1152)},
      {"one rank, one-tile ring", one_rank, launch({}, 128)},
      {"one rank, one cycle, recompute", one_rank, launch({.recompute = true}, 1152)},
      {"one rank, one-tile ring, recompute", one_rank, launch({.recompute = true}, 128)},
      {"two ranks, 5-tile ring (one cycle)", two_ranks, launch({}, 640)},
      {"two ranks, 4-tile ring", two_ranks, launch({}, 512)},
      {"two GPUs, 5-tile ring", two_ranks, launch(colocated, 640)},
      {"two GPUs, 4-tile ring", two_ranks, launch(colocated, 512)},
      {"fp8, one cycle", fp8_one_rank, launch({}, 1152)},
      {"fp8, one cycle, weights given", fp8_one_rank, launch({.fp8_weights_given = true}, 1152)},
      {"fp8, one-tile ring, weights given", fp8_one_rank, launch({.fp8_weights_given = true}, 128)},
      {"fp8, H = 16 I, one cycle, weights given", fp8_wide, launch({.fp8_weights_given = true}, 4096)},
      {"fp8, one cycle, recompute", fp8_one_rank, launch({.recompute = true}, 1152)},
      {"fp8, one-tile ring, recompute", fp8_one_rank, launch({.recompute = true}, 128)},
      {"fp8, one cycle, recompute, a wide shared expert", fp8_wide_shared, launch({.recompute = true}, 1152)},
      {"fp8, two GPUs, recompute", fp8_every_branch(), launch(colocated_recompute, 512)},
      {"fp8, one cycle, fp8 weight gradients", fp8_one_rank, launch({.fp8_weight_gradients = true}, 1152)},
      {"fp8, two ranks", fp8_every_branch(), launch({}, 512)},
      {"fp8, two GPUs", fp8_every_branch(), launch(colocated, 512)},
      {"fp8, two GPUs, a capacity, weights given", fp8_every_branch(), launch(colocated_capacity_given, 512)},
      {"fp8, one cycle, weights given, fp8 weight gradients", fp8_one_rank,
       launch({.fp8_weights_given = true, .fp8_weight_gradients = true}, 1152)},
      {"fp8, one-tile ring, fp8 weight gradients", fp8_one_rank, launch({.fp8_weight_gradients = true}, 128)},
      {"fp8, one cycle, recompute, fp8 weight gradients", fp8_one_rank,
       launch({.recompute = true, .fp8_weight_gradients = true}, 1152)},
      {"olmoe", olmoe, launch({}, olmoe_ring)},
      {"olmoe, recompute", olmoe, launch({.recompute = true}, olmoe_ring)},
      {"olmoe, fp8, weights given", fp8_olmoe, launch({.fp8_weights_given = true}, olmoe_ring)},
      {"scratch fits d_w1, one cycle", scratch_fits, launch({}, 1152)},
      {"scratch fits d_w1, one-tile ring", scratch_fits, launch({}, 128)},
      {"scratch fits d_w1, two GPUs, one cycle", scratch_fits_two_ranks, launch(colocated, 640)}};
  int in_d_w1 = 0;  // layouts with the scratch in d_w1: the three above
  for (const LayoutCase& t : cases) {
    SCOPED_TRACE(t.name);
    const bool slots_in_workspace = t.launch.transport == Transport::simulated;
    for (const BackwardScratch scratch :
         {BackwardScratch{}, BackwardScratch{true, false}, BackwardScratch{false, true}, BackwardScratch{true, true}}) {
      SCOPED_TRACE(std::string(scratch.in_d_w1 ? "scratch in d_w1" : "") +
                   (scratch.dh_over_saved_h ? ", dh over h" : ""));
      const WorkspaceLayout l = workspace_layout(t.c, t.launch, slots_in_workspace, scratch);
      const Buffers b = backward_buffers(t.c, t.launch, l);
      b.expect_disjoint_where_live_together();
      b.expect_within(l.bytes, size_t(t.c.experts / t.launch.gpus) * 2 * t.c.intermediate * t.c.hidden * 2);
      in_d_w1 += l.in_d_w1 && scratch.dh_over_saved_h;
    }
  }
  EXPECT_EQ(in_d_w1, 3);
}

// The scratch in d_w1 (BackwardScratch::in_d_w1): where it fits in d_w1's bytes as bf16, the backward's
// workspace ends where the forward's a begins (with no shared expert, and dh over the saved h), shorter than
// the forward's; where it does not fit, the layout is the one without it. Sizes of bench/shapes.py.
TEST(BackwardBuffers, ScratchInDw1EndsTheWorkspaceAtTheForwardsA) {
  const LayerConfig deepseek_v4 = make_config(1, 8192, 7168, 3072, 32, 6),
                    kimi_k2 = make_config(1, 8192, 7168, 2048, 32, 8);
  for (const LayerConfig& c : {deepseek_v4, kimi_k2}) {
    const LaunchConfig launch{.ring_rows = resolved_ring_rows(c, {})};
    const WorkspaceLayout kept = workspace_layout(c, launch, true);
    const WorkspaceLayout both = workspace_layout(c, launch, true, {true, true});
    EXPECT_TRUE(both.in_d_w1 && both.dh_over_h && both.one_cycle);
    EXPECT_EQ(both.bytes, kept.a);
    EXPECT_LT(both.bytes, kept.forward_bytes);
    EXPECT_LE(both.d_w1_bytes, size_t(c.experts) * 2 * c.intermediate * c.hidden * 2);
    const WorkspaceLayout d_w1_alone = workspace_layout(c, launch, true, {true, false});
    EXPECT_EQ(d_w1_alone.bytes, kept.a + aligned_section(own_padded_rows(c, 1, 0) * 2 * c.intermediate * 2));
  }
  // Eight experts of I = 64: their d_w1 (256 KiB) holds less than one cycle's ring and g.
  const LayerConfig small = make_config(1, 80, 128, 64, 8, 3);
  const LaunchConfig launch{.ring_rows = 1152};
  const WorkspaceLayout over_h = workspace_layout(small, launch, true, {false, true});
  const WorkspaceLayout both = workspace_layout(small, launch, true, {true, true});
  EXPECT_FALSE(both.in_d_w1);
  EXPECT_EQ(both.bytes, over_h.bytes);
  EXPECT_EQ(both.dye, over_h.dye);
}

// The recompute forward's tests' configs: every branch and a shared expert as wide as a routed one, in bf16 and
// in fp8.
struct BothPrecisions {
  LayerConfig bf16, fp8;
};
BothPrecisions recompute_forward_configs() {
  LayerConfig bf16 = with_every_branch(make_config(1, 80, 256, 128, 8, 3));
  bf16.shared_intermediate = 128;
  LayerConfig fp8 = bf16;
  fp8.precision = Precision::fp8;
  return {bf16, fp8};
}

// Recompute mode's forward writes its GEMMs' bf16 operands (xe, a, shared_a; in the fp8 mode none: its
// GEMMs read E4M3 ones) and none of what the backward recomputes for itself (h, shared_h), so its
// workspace ends before those: a forward-only call needs no room for them. In the fp8 mode the shared
// expert's h and a lie over the forward's aq, which the recompute backward does not touch.
TEST(ForwardBuffers, RecomputeForwardHoldsWhatItWritesAlone) {
  const auto [bf16, fp8] = recompute_forward_configs();
  const LaunchConfig recompute{.ring_rows = 1152, .recompute = true};
  const size_t H = bf16.hidden, I = bf16.intermediate, Is = bf16.shared_intermediate;
  const size_t P = own_padded_rows(bf16, 1, 0), S = shared_rows_capacity(bf16, 1);
  for (const LayerConfig& c : {bf16, fp8}) {
    const bool is_fp8 = c.precision == Precision::fp8;
    SCOPED_TRACE(is_fp8 ? "fp8" : "bf16");
    const WorkspaceLayout l = workspace_layout(c, recompute, true);
    const size_t forward_end = l.forward_bytes;
    for (const auto& [name, at, bytes] : std::initializer_list<std::tuple<const char*, size_t, size_t>>{
             {"xe", l.xe, P * H * 2}, {"a", l.a, P * I * 2}, {"shared_a", l.shared_a, S * Is * 2}}) {
      if (!is_fp8) {
        EXPECT_LE(at + bytes, forward_end) << name;
      } else if (name != std::string("shared_a")) {
        EXPECT_GE(at, forward_end) << name;
      }
    }
    EXPECT_GE(l.h, forward_end);
    EXPECT_LE(l.h + P * 2 * I * 2, l.bytes);
    if (!is_fp8) {
      EXPECT_GE(l.shared_h, forward_end);
      continue;
    }
    for (const auto& [name, at, bytes] : std::initializer_list<std::tuple<const char*, size_t, size_t>>{
             {"shared_h", l.shared_h, S * 2 * Is * 2}, {"shared_a", l.shared_a, S * Is * 2}}) {
      EXPECT_GE(at, l.fp8.aq.values) << name;
      EXPECT_LE(at + bytes, l.fp8.aq.values + P * I) << name;
    }
  }
}

// A bf16 recompute forward on one GPU (simulated ranks) pushes its y_j over xe: GEMM1 is xe's last reader and a
// grid barrier comes before GEMM2 (the forward runs one cycle), so no two of its buffers live at once share a byte,
// all within the forward's workspace; its slots section, then the backward's dx_j alone, lies past it. Elsewhere (a
// saving forward, fp8, a peer group's Layer, a capacity under N k rows) y_j go to the slots. The forward's phases: the
// layout (the shared expert's GEMM1), the pull (its GEMM2), GEMM1, GEMM2, the combine.
TEST(ForwardBuffers, ABf16RecomputeForwardOnOneGpuPushesItsYOverXe) {
  const auto [bf16, fp8] = recompute_forward_configs();
  const LaunchConfig recompute{.ring_rows = 1152, .recompute = true};
  const size_t N = bf16.tokens(), H = bf16.hidden, I = bf16.intermediate, Is = bf16.shared_intermediate;
  const size_t k = bf16.top_k, P = own_padded_rows(bf16, 1, 0), S = shared_rows_capacity(bf16, 1);
  // One GPU's capacity may give xe fewer rows than the (token, slot) buffer (a forward then stops at its capacity
  // check): 4096 tokens of k = 8 over E = 64, a capacity of 8192 rows.
  const LayerConfig many_tokens = make_config(1, 4096, 256, 128, 64, 8);
  const LaunchConfig capacity{.ring_rows = 128, .recompute = true, .capacity_rows = 8192};
  ASSERT_LT(own_padded_rows(many_tokens, 1, capacity.capacity_rows), long(many_tokens.tokens()) * many_tokens.top_k);
  const WorkspaceLayout l = workspace_layout(bf16, recompute, true);
  EXPECT_EQ(l.y_slots, l.xe);
  EXPECT_GE(l.slots, l.forward_bytes);
  constexpr int kPlace = 0, kPull = 1, kUp = 2, kDown = 3, kCombine = 4;
  Buffers b;
  b.add("barrier and layout tables", l.barrier, l.shared_y - l.barrier, kPlace, kCombine);
  b.add("shared_y", l.shared_y, S * H * 2, kPull, kCombine);
  b.add("shared_a", l.shared_a, S * Is * 2, kPlace, kPull);
  b.add("xe", l.xe, P * H * 2, kPull, kUp);
  b.add("a", l.a, P * I * 2, kUp, kDown);
  b.add("y_j", l.y_slots, N * k * H * 2, kDown, kCombine);
  b.expect_disjoint_where_live_together();
  b.expect_within(l.forward_bytes, 0);
  for (const auto& [name, c, launch, slots_in_workspace] :
       std::initializer_list<std::tuple<const char*, LayerConfig, LaunchConfig, bool>>{
           {"saving", bf16, LaunchConfig{.ring_rows = 1152}, true},
           {"fp8 recompute", fp8, recompute, true},
           {"a peer group's", bf16, recompute, false},
           {"a capacity under N k rows", many_tokens, capacity, true}}) {
    const WorkspaceLayout other = workspace_layout(c, launch, slots_in_workspace);
    EXPECT_EQ(other.y_slots, other.slots) << name;
    EXPECT_LE(other.slots, other.forward_bytes) << name;
  }
}

// Where the shared expert's h and a do not fit over aq (Is large against I), the fp8 recompute backward
// takes them past the forward's workspace, before h; where they fit, nothing lies between its a and h.
TEST(ForwardBuffers, Fp8RecomputeTakesTheSharedActivationsPastTheForwardWhereAqIsTooSmall) {
  LayerConfig fits = with_every_branch(make_config(1, 80, 256, 128, 8, 3));
  fits.shared_intermediate = 128;
  fits.precision = Precision::fp8;
  LayerConfig wide = fits;
  wide.shared_intermediate = 1024;  // S 2 Is 2 + S Is 2 = 480 KiB against aq's P I = 160 KiB
  const LaunchConfig recompute{.ring_rows = 1152, .recompute = true};
  const size_t I = fits.intermediate, P = own_padded_rows(fits, 1, 0), S = shared_rows_capacity(wide, 1);
  const size_t Is = wide.shared_intermediate;
  const WorkspaceLayout l = workspace_layout(wide, recompute, true);
  EXPECT_EQ(l.shared_a, l.a + aligned_section(P * I * 2));
  EXPECT_EQ(l.shared_h, l.shared_a + aligned_section(S * Is * 2));
  EXPECT_EQ(l.h, l.shared_h + aligned_section(S * 2 * Is * 2));
  const WorkspaceLayout over = workspace_layout(fits, recompute, true);
  EXPECT_EQ(over.h, over.a + aligned_section(P * I * 2));
}

// The saving forward's routed a (no saved buffer holds it): in bf16 its GEMM2's operand, a forward
// section before the slots, over which the backward's own sections may start; in fp8, whose GEMM2 reads
// aq, past the forward's sections.
TEST(ForwardBuffers, SavingForwardHoldsTheRoutedAInBf16Alone) {
  LayerConfig bf16 = with_every_branch(make_config(1, 80, 256, 128, 8, 3));
  LayerConfig fp8 = bf16;
  fp8.precision = Precision::fp8;
  const size_t I = bf16.intermediate, P = own_padded_rows(bf16, 1, 0);
  for (const LaunchConfig& launch : {LaunchConfig{.ring_rows = 1152}, LaunchConfig{.ring_rows = 128}}) {
    SCOPED_TRACE(launch.ring_rows);
    const WorkspaceLayout b = workspace_layout(bf16, launch, true), f = workspace_layout(fp8, launch, true);
    EXPECT_LE(b.a + P * I * 2, b.slots);
    EXPECT_GE(f.a, f.forward_bytes);
    EXPECT_LE(f.a + P * I * 2, f.bytes);
  }
}

// The checker itself: dye over the (token, slot) buffer while the combine still reads it (the phase
// order before session 46, on this layout) is reported. The test above checks the layout against the
// phase order written here; the kernel's order is checked on the GPU
// (LayerApi.BackwardSectionsOverOneAnotherMatchTheReference).
TEST(BackwardBuffers, ACombineAfterTheDyePullOverItsSlotsIsCaught) {
  const LayerConfig c = with_every_branch(make_config(1, 80, 128, 64, 8, 3));
  const LaunchConfig launch{.ring_rows = 1152};
  const WorkspaceLayout l = workspace_layout(c, launch, true);
  ASSERT_NE(l.dx_slots, l.slots);  // the dx_j past dh, dye over them
  Buffers b;
  const size_t N = c.tokens(), H = c.hidden, k = c.top_k, P = own_padded_rows(c, 1, 0);
  const Phases ph{1};
  b.add("dx slots", l.dx_slots, N * k * H * 2, ph.push(0), ph.weight_grads() + 1);  // combined last
  b.add("dye", l.dye, P * H * 2, ph.router(), ph.weight_grads());                   // pulled first
  EXPECT_NONFATAL_FAILURE(b.expect_disjoint_where_live_together(), "dx slots and dye share bytes while both live");
}

}  // namespace
}  // namespace mok::gpu
