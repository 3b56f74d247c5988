// Routing replay (RoutingMode::replay_ids), gradient accumulation and the saved buffer, on the
// reference: the contracts the device API and the PyTorch op rest on.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "mok/core/saved_layout.h"
#include "mok/reference/layer.h"
#include "mok/reference/oracle.h"
#include "mok/reference/problem.h"
#include "test_support.h"

namespace mok::ref::test {
namespace {

LayerConfig sigmoid_shared() {
  LayerConfig c = with_grouped_sigmoid(make_config(2, 48, 128, 64, 8, 3));
  c.shared_intermediate = 64;
  return c;
}

// Replaying the router's own choice of experts is the router: the same logits, weights, y and every
// gradient, the router's included.
TEST(ReplayIds, OfTheRoutersOwnChoiceIsTheRouter) {
  const LayerConfig c = sigmoid_shared();
  const Problem p = make_problem(c, 5);
  const Options opt{};
  const Forward routed = forward(c, p.x, p.weights, nullptr, opt);
  Options replay = opt;
  replay.replay_ids = true;
  const Routing ids{routed.routing.topk_idx, {}};
  const Forward replayed = forward(c, p.x, p.weights, &ids, replay);
  EXPECT_PRED_FORMAT2(same_bits, replayed.logits, routed.logits);
  EXPECT_PRED_FORMAT2(same_bits, replayed.routing.topk_w, routed.routing.topk_w);
  EXPECT_PRED_FORMAT2(same_bits, replayed.y, routed.y);
  expect_same_gradients(backward(c, p.x, p.weights, replayed, p.dy, replay),
                        backward(c, p.x, p.weights, routed, p.dy, opt));
}

// Replayed ids that differ from the router's choice: the weights are the live router's scores of the
// replayed experts (so they differ from a full replay of old weights), and the router's gradient flows:
// every tensor within its bound of the fp64 oracle, which weighs the replayed ids by its own scores.
TEST(ReplayIds, WeighsOtherExpertsByTheLiveRouter) {
  const LayerConfig c = sigmoid_shared();
  const Problem p = make_problem(c, 6);
  const Forward routed = forward(c, p.x, p.weights, nullptr, {});
  Routing ids{routed.routing.topk_idx, {}};
  for (int32_t& e : ids.topk_idx) e = (e + 1) % c.experts;  // a rotation keeps each token's ids distinct
  Options replay{};
  replay.replay_ids = true;
  const Forward replayed = forward(c, p.x, p.weights, &ids, replay);
  EXPECT_EQ(replayed.routing.topk_idx, ids.topk_idx);
  EXPECT_PRED_FORMAT2(same_bits, replayed.logits, routed.logits);
  EXPECT_NE(replayed.routing.topk_w, routed.routing.topk_w);
  const Gradients g = backward(c, p.x, p.weights, replayed, p.dy, replay);
  const std::vector<OracleCheck> checks =
      compare_with_oracle(replayed, g, oracle(oracle_inputs(c, p.x, p.weights, p.dy, replayed)));
  EXPECT_EQ(checks.size(), 11u);  // the router's tensors (logits, d_logits, d_router) among them
  for (const OracleCheck& ch : checks) {
    EXPECT_TRUE(ch.passed()) << to_string(ch.tensor) << ": relative " << ch.error.relative << ", bound " << ch.bound;
    EXPECT_GT(ch.error.max_ref, 0.0) << to_string(ch.tensor) << " is all zeros in the oracle";
  }
}

// A token whose selected scores all underflow to zero (every logit -H = -128: sigmoid 0) is valid:
// its weights are zero, its y the shared expert's alone, and the backward takes its own forward and
// gives finite gradients (0/0 before the renormaliser's 1e-20; the backward then refused the forward's
// NaN weights), with a dy as large as 1e18 too (d topk_w past 3.4e18: (dw - ...) / 1e-20 overflowed).
TEST(ReplayIds, ScoresUnderflowingToZeroGiveZeroWeights) {
  const LayerConfig c = sigmoid_shared();
  Problem p = make_problem(c, 9);
  std::fill(p.x.begin(), p.x.end(), to_bf16(1.0f));
  std::fill(p.weights.router.begin(), p.weights.router.end(), -1.0f);  // every logit -H = -128
  std::fill(p.weights.expert_bias.begin(), p.weights.expert_bias.end(), 0.0f);
  for (bf16& v : p.dy) v = to_bf16(to_float(v) * 1e18f);
  const Forward f = forward(c, p.x, p.weights, nullptr, {});
  ASSERT_EQ(f.logits[0], -float(c.hidden));
  EXPECT_EQ(f.routing.topk_w, std::vector<float>(f.routing.topk_w.size(), 0.0f));
  const Gradients g = backward(c, p.x, p.weights, f, p.dy, {});
  for (const std::vector<float>* d :
       {&g.d_topk_w, &g.d_logits, &g.d_router, &g.d_w1, &g.d_w2, &g.d_shared_w1, &g.d_shared_w2})
    EXPECT_TRUE(all_finite(*d));
  EXPECT_TRUE(all_finite(g.dx));
  EXPECT_GT(*std::max_element(g.d_topk_w.begin(), g.d_topk_w.end()), 3.4e18f);  // (dw - ...) / 1e-20: Inf
}

TEST(ReplayIds, RejectsOutOfRangeIds) {
  const LayerConfig c = sigmoid_shared();
  const Problem p = make_problem(c, 7);
  Routing ids{std::vector<int32_t>(size_t(c.tokens()) * c.top_k, 0), {}};
  for (size_t i = 0; i < ids.topk_idx.size(); ++i) ids.topk_idx[i] = int32_t(i % c.top_k);
  ids.topk_idx[4] = c.experts;
  Options replay{};
  replay.replay_ids = true;
  expect_error([&] { forward(c, p.x, p.weights, &ids, replay); }, "topk_idx[1, 1] = 8 is outside [0, 8)");
}

// The saved buffer holds what the backward needs: unpacked, it gives the layout and activations back,
// and the backward from it equals the backward from the Forward. Between h and the shared expert's h
// it holds nothing: no routed a, which the backward makes from h again.
TEST(SavedBuffer, RoundTripsTheForward) {
  const LayerConfig c = sigmoid_shared();
  const Problem p = make_problem(c, 8);
  const Forward f = forward(c, p.x, p.weights, nullptr, {});
  const std::vector<uint8_t> saved = pack_saved(c, f, p.x);
  const SavedLayout s = saved_layout(c);
  EXPECT_EQ(saved.size(), s.bytes);
  EXPECT_EQ(s.shared_h - s.h, (size_t(padded_rows(c)) * 2 * c.intermediate * 2 + 255) / 256 * 256);
  Forward back = unpack_saved(c, saved);
  EXPECT_EQ(back.layout.offsets, f.layout.offsets);
  EXPECT_EQ(back.layout.counts, f.layout.counts);
  EXPECT_EQ(back.layout.row_source, f.layout.row_source);
  EXPECT_EQ(back.layout.slot_row, f.layout.slot_row);
  EXPECT_PRED_FORMAT2(same_bits, back.h, f.h);
  EXPECT_PRED_FORMAT2(same_bits, back.shared_h, f.shared_h);
  EXPECT_PRED_FORMAT2(same_bits, back.shared_a, f.shared_a);
  back.routing = f.routing;
  back.logits = f.logits;
  expect_same_gradients(backward(c, p.x, p.weights, back, p.dy, {}), backward(c, p.x, p.weights, f, p.dy, {}));
}

// The GPU's recompute mode (LaunchConfig::recompute) saves the layout alone: the same buffer without its
// xe and h sections (P (2 H + 4 I) bytes) nor the shared expert's. It unpacks as the reference's
// Forward in recompute mode (no h, shared_h or shared_a); a recompute-mode forward packs into it,
// and the backward from it equals the saving backward's.
TEST(SavedBuffer, RecomputeLayoutHoldsTheLayoutAlone) {
  const LayerConfig c = sigmoid_shared();
  const Problem p = make_problem(c, 8);
  const Forward f = forward(c, p.x, p.weights, nullptr, {});
  const SavedLayout saving = saved_layout(c), recompute = saved_layout(c, true);
  EXPECT_EQ(recompute.bytes, saving.xe);
  EXPECT_EQ(recompute.shared_a, saving.xe);
  ASSERT_GT(saving.bytes - saving.shared_h, 0u);
  const std::vector<uint8_t> whole = pack_saved(c, f, p.x);
  const std::vector<uint8_t> saved(whole.begin(), whole.begin() + long(saving.xe));
  Options recomputing;
  recomputing.recompute = true;
  const Forward recomputed = forward(c, p.x, p.weights, nullptr, recomputing);
  EXPECT_TRUE(recomputed.h.empty() && recomputed.shared_h.empty() && recomputed.shared_a.empty());
  EXPECT_EQ(pack_saved(c, recomputed, p.x, true), saved);
  expect_error([&] { pack_saved(c, recomputed, p.x); }, "pack_saved: the forward holds no h");
  Forward back = unpack_saved(c, saved, true);
  EXPECT_EQ(back.layout.row_source, f.layout.row_source);
  EXPECT_TRUE(back.h.empty() && back.shared_h.empty() && back.shared_a.empty());
  expect_error([&] { unpack_saved(c, whole, true); }, "saved buffer has " + std::to_string(whole.size()) + " bytes");
  back.routing = f.routing;
  back.logits = f.logits;
  // h: the recomputing backward's from its GEMM1, the saving one's from the buffer; a from h in both.
  expect_same_gradients(backward(c, p.x, p.weights, back, p.dy, recomputing), backward(c, p.x, p.weights, f, p.dy, {}));
  expect_error([&] { backward(c, p.x, p.weights, back, p.dy, {}); }, "forward saved no activations: use recompute");
}

// The fp8 mode saves no xe (saves_xe: its backward pulls xe from x): the bf16 buffer without that section,
// and the h and shared expert's sections after it pack and unpack as they do in bf16.
TEST(SavedBuffer, Fp8LayoutHoldsNoXe) {
  LayerConfig bf16 = make_config(1, 64, 128, 128, 8, 2);
  bf16.shared_intermediate = 128;
  LayerConfig fp8 = bf16;
  fp8.precision = Precision::fp8;
  const SavedLayout with_xe = saved_layout(bf16), without = saved_layout(fp8);
  EXPECT_EQ(without.h, with_xe.xe);
  EXPECT_EQ(with_xe.bytes - without.bytes, size_t(padded_rows(bf16)) * bf16.hidden * 2);
  const Problem p = make_problem(fp8, 8);
  const Forward f = forward(fp8, p.x, p.weights, nullptr, {});
  const std::vector<uint8_t> saved = pack_saved(fp8, f, p.x);
  ASSERT_EQ(saved.size(), without.bytes);
  const Forward back = unpack_saved(fp8, saved);
  EXPECT_PRED_FORMAT2(same_bits, back.h, f.h);
  EXPECT_PRED_FORMAT2(same_bits, back.shared_h, f.shared_h);
  EXPECT_PRED_FORMAT2(same_bits, back.shared_a, f.shared_a);
}

// A buffer of another size, or whose tables hold no layout: offsets of -1, a forward's with one tile
// count off or two rows' sources swapped without their slots' rows (no longer inverse).
TEST(SavedBuffer, RejectsAForeignBuffer) {
  const LayerConfig c = sigmoid_shared();
  const SavedLayout s = saved_layout(c);
  expect_error([&] { unpack_saved(c, std::vector<uint8_t>(s.bytes - 256)); },
               "saved buffer has " + std::to_string(s.bytes - 256) + " bytes, expected " + std::to_string(s.bytes));
  std::vector<uint8_t> corrupt(s.bytes, 0xff);  // offsets of -1
  expect_error([&] { unpack_saved(c, corrupt); }, "saved holds no dispatch layout of this config");
  const Problem p = make_problem(c, 8);
  const std::vector<uint8_t> saved = pack_saved(c, forward(c, p.x, p.weights, nullptr, {}), p.x);
  ASSERT_NO_THROW(unpack_saved(c, saved));
  std::vector<uint8_t> tiles_off = saved, rows_swapped = saved;
  reinterpret_cast<int32_t*>(tiles_off.data() + s.tile_offsets)[2] += 1;
  int32_t* row_source = reinterpret_cast<int32_t*>(rows_swapped.data() + s.row_source);
  std::swap(row_source[3], row_source[9]);
  for (const std::vector<uint8_t>* bad : {&tiles_off, &rows_swapped})
    expect_error([&] { unpack_saved(c, *bad); }, "saved holds no dispatch layout of this config");
}

// A GPU's share whose capacity is below the rows its experts' tiles take (every token to expert 0 of
// GPU 0 of 2, a capacity of one row: 256 padded rows against 512) holds no layout it could have saved:
// refused before any row is read past the share's.
TEST(SavedBuffer, RejectsAShareWhoseTilesPassItsRows) {
  const LayerConfig c = make_config(2, 256, 64, 64, 2, 1);
  const Problem p = make_problem(c, 10);
  const Routing all_to_one{std::vector<int32_t>(size_t(c.tokens()), 0), std::vector<float>(size_t(c.tokens()), 1.0f)};
  const std::vector<uint8_t> whole = pack_saved(c, forward(c, p.x, p.weights, &all_to_one, {}), p.x);
  const auto share_buffer = [&](const RowShare& share) {  // the layout's sections lie alike in every share's
    std::vector<uint8_t> saved(saved_layout(c, false, share).bytes, 0);
    std::copy_n(whole.begin(), saved_layout(c).xe, saved.begin());
    return saved;
  };
  const RowShare short_share{2, 0, 1}, whole_share{2, 0, 512};
  expect_error([&] { unpack_saved(c, share_buffer(short_share), false, short_share); },
               "saved's layout gives GPU 0's experts 512 padded rows, more than the 256 its buffers hold "
               "(capacity_rows = 1)");
  EXPECT_NO_THROW(unpack_saved(c, share_buffer(whole_share), false, whole_share));
}

}  // namespace
}  // namespace mok::ref::test
