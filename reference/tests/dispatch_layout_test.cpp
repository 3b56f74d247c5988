// The reference's dispatch layout (build_dispatch_layout over core's chunk steps), on a hand-computed
// routing and on a skewed one that spans several 32-token chunks; core's row_expert over it, and the
// checks a layout read back gets against its routing.
#include "mok/core/dispatch_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "mok/core/validate.h"
#include "mok/reference/layer.h"
#include "mok/reference/problem.h"

namespace mok::ref::test {
namespace {

TEST(DispatchLayout, HandRoutingWithAnEmptyExpert) {
  // 5 tokens, k = 2, 4 experts; expert 2 gets nothing.
  const LayerConfig c = make_config(1, 5, 64, 64, 4, 2);
  const std::vector<int32_t> topk_idx = {1, 3, /**/ 3, 0, /**/ 1, 0, /**/ 0, 3, /**/ 3, 1};
  const DispatchLayout l = build_dispatch_layout(c, topk_idx);
  EXPECT_EQ(l.counts, (std::vector<int32_t>{3, 3, 0, 4}));
  EXPECT_EQ(l.offsets, (std::vector<int32_t>{0, 3, 6, 6, 10}));
  // Rows by expert, then token: expert 0 serves (1,1) (2,1) (3,0); expert 1 (0,0) (2,0) (4,1);
  // expert 3 (0,1) (1,0) (3,1) (4,0). A row's source is token * k + slot.
  EXPECT_EQ(l.row_source, (std::vector<int32_t>{3, 5, 6, 0, 4, 9, 1, 2, 7, 8}));
  EXPECT_EQ(l.slot_row, (std::vector<int32_t>{3, 6, 7, 0, 4, 1, 2, 8, 9, 5}));
}

TEST(DispatchLayout, ChunkedBuildEqualsExpertThenTokenOrder) {
  // 300 tokens span ten 32-token chunks; a zipf routing leaves the tail experts nearly empty.
  const LayerConfig c = make_config(2, 150, 64, 64, 16, 4);
  const Problem p = make_problem(c, 5, RoutingKind::zipf, 2.0);
  const DispatchLayout l = build_dispatch_layout(c, p.routing->topk_idx);
  std::vector<int32_t> want_source;
  for (int e = 0; e < c.experts; ++e)
    for (int g = 0; g < c.tokens(); ++g)
      for (int j = 0; j < c.top_k; ++j)
        if (p.routing->topk_idx[g * c.top_k + j] == e) want_source.push_back(g * c.top_k + j);
  EXPECT_EQ(l.row_source, want_source);
  for (size_t row = 0; row < l.row_source.size(); ++row) ASSERT_EQ(l.slot_row[l.row_source[row]], int32_t(row));
  EXPECT_EQ(l.offsets.back(), c.routed_rows());
}

// The GPU's scan (forward.cuh, layout_scan) cuts the chunks into runs: each run's rows by expert_rows over
// its range, then scan_expert over it from the expert's offset plus the earlier runs' rows. Any cut
// gives scan_chunks' chunk_base, runs longer than, as long as and shorter than one chunk among them.
TEST(DispatchLayout, RunsOfChunksGiveTheWholeScan) {
  const LayerConfig c = make_config(2, 150, 64, 64, 16, 4);  // ten chunks
  const Problem p = make_problem(c, 5, RoutingKind::zipf, 2.0);
  const int E = c.experts, chunks = layout_chunks(c.tokens());
  std::vector<int32_t> counts(size_t(chunks) * E);
  std::vector<uint32_t> masks(E);
  for (int ch = 0; ch < chunks; ++ch) {
    route_masks(p.routing->topk_idx.data(), c.top_k, ch, c.tokens(), E, masks.data());
    for (int e = 0; e < E; ++e) counts[size_t(ch) * E + e] = chunk_rows(masks[e]);
  }
  std::vector<int32_t> want_base(counts.size()), offsets(E + 1);
  scan_chunks(counts.data(), chunks, E, want_base.data(), offsets.data());
  for (int runs : {1, 3, 10, 12}) {
    std::vector<int32_t> base(counts.size(), -1);
    for (int e = 0; e < E; ++e) {
      int32_t first = offsets[e];
      for (int run = 0; run < runs; ++run) {
        const int begin = chunks * run / runs, end = chunks * (run + 1) / runs;
        scan_expert(counts.data(), begin, end, E, e, first, base.data());
        first += expert_rows(counts.data(), begin, end, E, e);
      }
      EXPECT_EQ(first, offsets[e + 1]) << "expert " << e << ", " << runs << " runs";
    }
    EXPECT_EQ(base, want_base) << runs << " runs";
  }
}

// row_expert names each layout row's expert (the one its (token, slot) routes to) within every range of
// experts, and -1 outside it: an empty expert between busy ones or first (two hand routings), runs of
// empty experts between busy ones and after the last (a sparse routing), a skewed one.
TEST(DispatchLayout, RowExpertFindsEachRowsExpertWithinEveryRange) {
  const LayerConfig hand = make_config(1, 5, 64, 64, 4, 2), many = make_config(2, 150, 64, 64, 16, 4);
  const std::vector<int32_t> middle_empty = {1, 3, /**/ 3, 0, /**/ 1, 0, /**/ 0, 3, /**/ 3, 1};
  const std::vector<int32_t> first_empty = {1, 3, /**/ 3, 2, /**/ 1, 2, /**/ 2, 3, /**/ 3, 1};
  const Problem sparse = make_problem(many, 5, RoutingKind::sparse),
                zipf = make_problem(many, 5, RoutingKind::zipf, 2.0);
  for (const auto& [c, topk_idx] :
       {std::pair{hand, middle_empty}, std::pair{hand, first_empty}, std::pair{many, sparse.routing->topk_idx},
        std::pair{many, zipf.routing->topk_idx}}) {
    const DispatchLayout l = build_dispatch_layout(c, topk_idx);
    for (int first = 0; first <= c.experts; ++first)
      for (int end = first; end <= c.experts; ++end)
        for (int32_t row = 0; row < c.routed_rows(); ++row) {
          const int e = topk_idx[l.row_source[row]];
          ASSERT_EQ(row_expert(l.offsets.data(), first, end, row), e >= first && e < end ? e : -1)
              << "row " << row << ", experts [" << first << ", " << end << ")";
        }
  }
}

// The checks a layout read back gets against the routing it is to serve (validate.h; the GPU's backward
// makes them with the same functions): a routing's own layout passes; a layout of another routing is
// refused at the first token the two differ at (two slots of one token swapping experts keeps every
// count; a slot moved to another expert changes them); rows of one expert out of token order, a
// slot_row that row_source does not undo, and tables that are no layout's are refused.
TEST(DispatchLayout, ChecksNameTheFirstTokenAnotherRoutingLaysOutOtherwise) {
  const LayerConfig c = make_config(2, 150, 64, 64, 16, 4);
  const int k = c.top_k;
  const std::vector<int32_t> idx = make_problem(c, 5, RoutingKind::zipf, 2.0).routing->topk_idx;
  const DispatchLayout own = build_dispatch_layout(c, idx);
  ASSERT_TRUE(layout_tables_hold(own, size_t(c.tokens()), k));
  EXPECT_EQ(first_token_laid_out_otherwise(own, idx, k), -1);

  std::vector<int32_t> swapped = idx, moved = idx;
  std::swap(swapped[97 * k + 1], swapped[97 * k + 3]);
  int32_t* token = moved.data() + 200 * k;
  int32_t unrouted = 0;
  while (std::find(token, token + k, unrouted) != token + k) ++unrouted;
  token[2] = unrouted;
  ASSERT_NE(moved, idx);
  for (const auto& [other, token_at] : {std::pair{swapped, 97L}, std::pair{moved, 200L}}) {
    const DispatchLayout theirs = build_dispatch_layout(c, other);
    ASSERT_TRUE(layout_tables_hold(theirs, size_t(c.tokens()), k));
    EXPECT_EQ(first_token_laid_out_otherwise(theirs, idx, k), token_at);
    EXPECT_EQ(first_token_laid_out_otherwise(own, other, k), token_at);
  }

  DispatchLayout disordered = own;  // the first expert's first two rows swapped, still inverse
  ASSERT_GE(own.counts[0], 2);
  const int32_t r = own.offsets[0], s0 = own.row_source[r], s1 = own.row_source[r + 1];
  std::swap(disordered.row_source[r], disordered.row_source[r + 1]);
  std::swap(disordered.slot_row[s0], disordered.slot_row[s1]);
  EXPECT_EQ(first_token_laid_out_otherwise(disordered, idx, k), s0 / k);

  DispatchLayout not_inverse = own;
  not_inverse.slot_row[4 * k + 1] = not_inverse.slot_row[4 * k + 2];
  EXPECT_EQ(first_token_laid_out_otherwise(not_inverse, idx, k), 4);

  ASSERT_NE(own.offsets[3], own.offsets[4]);
  DispatchLayout falling = own, short_end = own, miscounted = own, crowded = own;
  std::swap(falling.offsets[3], falling.offsets[4]);
  short_end.offsets.back() -= 1;
  miscounted.counts[5] += 1;
  // Expert 0 given N + 1 rows (one token twice), expert 1 one fewer: the counts still sum to N k.
  const int32_t over = c.tokens() + 1 - own.counts[0];
  ASSERT_LE(over, own.counts[1]);
  crowded.counts[0] += over, crowded.counts[1] -= over;
  for (size_t e = 1; e < crowded.offsets.size() - 1; ++e)
    crowded.offsets[e] = crowded.offsets[e - 1] + crowded.counts[e - 1];
  for (const DispatchLayout* bad : {&falling, &short_end, &miscounted, &crowded})
    EXPECT_FALSE(layout_tables_hold(*bad, size_t(c.tokens()), k));
}

}  // namespace
}  // namespace mok::ref::test
