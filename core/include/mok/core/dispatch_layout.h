// The dispatch layout (schedule table): a pure integer function of the routing.
// Expert rows are ordered by expert, then by global token id g = rank * T + t (a token meets an
// expert at most once). Row r of expert e is layout row offsets[e] + r.
//   counts[e]            rows routed to expert e
//   offsets[e]           exclusive prefix sum of counts (offsets[E] = N * k)
//   row_source[row]      g * k + j, the (token, slot) a layout row serves
//   slot_row[g * k + j]  the inverse: the layout row of (token, slot)
// Built in chunks of kLayoutChunk = 32 tokens, one bit per token: a chunk's route masks (bit l of
// masks[e]: the chunk's token l routes to expert e) give its rows per expert (population counts) and
// each row's place among them, since a token meets an expert at most once and so an expert's rows
// within a chunk are in token order. The GPU runs a chunk per warp (lane = token) and builds the
// same masks as route_masks with atomicOr (OR is order-free); chunk_rows, place_token and the scan
// are shared code.
#pragma once

#include "mok/core/host_device.h"

namespace mok {

inline constexpr int kLayoutChunk = 32;  // the bits of a route mask

// Chunks of `tokens` (up to 2^31 - 1: no sum past it).
MOK_HD int layout_chunks(int tokens) { return tokens / kLayoutChunk + (tokens % kLayoutChunk != 0); }

// The bit of global token g in its chunk's route masks.
MOK_HD uint32_t route_bit(int g) { return 1u << (g % kLayoutChunk); }

// masks[e] for the chunk's tokens (masks: [E]).
MOK_HD void route_masks(const int32_t* topk_idx, int k, int chunk, int tokens, int experts, uint32_t* masks) {
  for (int e = 0; e < experts; ++e) masks[e] = 0;
  const int end = chunk < tokens / kLayoutChunk ? (chunk + 1) * kLayoutChunk : tokens;
  for (int g = chunk * kLayoutChunk; g < end; ++g)
    for (int j = 0; j < k; ++j) masks[topk_idx[g * k + j]] |= route_bit(g);
}

// Rows of an expert among a chunk's tokens.
MOK_HD int32_t chunk_rows(uint32_t mask) { return popcount32(mask); }

// Rows of expert e from chunks [begin, end) (counts_by_chunk: [chunks, E]).
MOK_HD int32_t expert_rows(const int32_t* counts_by_chunk, int begin, int end, int experts, int e) {
  int32_t rows = 0;
  for (int c = begin; c < end; ++c) rows += counts_by_chunk[c * experts + e];
  return rows;
}

// Column e of chunk_base over chunks [begin, end): the first layout row of expert e's rows from each
// chunk, its rows from chunk `begin` starting at layout row `first`. Experts are independent given their
// offsets, and a run of chunks given its first row, so the GPU scans runs of chunks of 32 experts a warp
// (forward.cuh, layout_scan).
MOK_HD void scan_expert(const int32_t* counts_by_chunk, int begin, int end, int experts, int e, int32_t first,
                        int32_t* chunk_base) {
  for (int c = begin; c < end; ++c) {
    chunk_base[c * experts + e] = first;
    first += counts_by_chunk[c * experts + e];
  }
}

// offsets[1..E] hold the experts' rows on entry; on return offsets is their exclusive prefix sum.
MOK_HD void prefix_offsets(int experts, int32_t* offsets) {
  offsets[0] = 0;
  for (int e = 0; e < experts; ++e) offsets[e + 1] += offsets[e];
}

// counts_by_chunk: [chunks, E] in, chunk_base: [chunks, E] out, offsets: [E + 1] out. Order:
// expert-major, then chunk: a pure scan.
MOK_HD void scan_chunks(const int32_t* counts_by_chunk, int chunks, int experts, int32_t* chunk_base,
                        int32_t* offsets) {
  for (int e = 0; e < experts; ++e) offsets[e + 1] = expert_rows(counts_by_chunk, 0, chunks, experts, e);
  prefix_offsets(experts, offsets);
  for (int e = 0; e < experts; ++e) scan_expert(counts_by_chunk, 0, chunks, experts, e, offsets[e], chunk_base);
}

// The last index i in [0, n) with table[i] <= value, by binary search: table is non-decreasing and
// table[0] <= value. (Runs of equal entries are empty ranges: the last of them owns the value.)
template <class Value>
MOK_HD int last_at_or_below(const int32_t* table, int n, Value value) {
  int i = 0, last = n - 1;
  while (i < last) {
    const int mid = (i + last + 1) / 2;
    if (table[mid] <= value)
      i = mid;
    else
      last = mid - 1;
  }
  return i;
}

// The expert of layout row `row` among experts [first, end), or -1 where the row is none of theirs: a
// function of the layout alone (offsets), so the GPU's backward finds a slot's expert without topk_idx.
MOK_HD int row_expert(const int32_t* offsets, int first, int end, int32_t row) {
  if (first >= end || row < offsets[first] || row >= offsets[end]) return -1;
  return first + last_at_or_below(offsets + first, end - first, row);
}

// A layout read back from memory (the saved buffer) is checked against the routing it is to serve by
// the host (validate.h: layout_tables_hold, first_token_laid_out_otherwise) and by the GPU's backward
// with these functions: offsets from 0 (offsets_span) to N k, rising by at most N at every expert
// (offsets_step_at), then slot_is_laid_out for every slot. Together they hold exactly where the layout
// is the one place_token makes of the routing: slot_row is then one-to-one (row_source undoes it), so a
// permutation that row_source inverts, each row lies in its slot's expert's rows, and each expert's rows
// serve rising slots. row_is_laid_out checks a layout alone, without its routing (the host's unpacking
// of a saved buffer).
MOK_HD bool offsets_span(int experts, int32_t rows, const int32_t* offsets) {
  return offsets[0] == 0 && offsets[experts] == rows;
}
// Expert e's rows: from offsets[e], at most one a token (a token meets an expert once).
MOK_HD bool offsets_step_at(int e, int32_t tokens, const int32_t* offsets) {
  return offsets[e] <= offsets[e + 1] && int64_t(offsets[e + 1]) - offsets[e] <= tokens;
}

// Row `row` of `rows` serves a slot in range whose row it is.
MOK_HD bool row_is_laid_out(int32_t row, int32_t rows, const int32_t* row_source, const int32_t* slot_row) {
  const int32_t slot = row_source[row];
  return slot >= 0 && slot < rows && slot_row[slot] == row;
}

// Slot g k + j of token g, routed to `expert` (topk_idx[g k + j]): its row is among the expert's rows,
// serves it back, and follows the row of an earlier slot (or is the expert's first).
MOK_HD bool slot_is_laid_out(int32_t slot, int32_t expert, int experts, const int32_t* offsets,
                             const int32_t* row_source, const int32_t* slot_row) {
  if (expert < 0 || expert >= experts) return false;
  const int32_t row = slot_row[slot];
  if (row < offsets[expert] || row >= offsets[expert + 1] || row_source[row] != slot) return false;
  return row == offsets[expert] || row_source[row - 1] < slot;
}

// Places token g's k rows: masks and base are its chunk's route masks and row of chunk_base.
MOK_HD void place_token(const int32_t* topk_idx, int k, int g, const uint32_t* masks, const int32_t* base,
                        int32_t* row_source, int32_t* slot_row) {
  for (int j = 0; j < k; ++j) {
    const int e = topk_idx[g * k + j];
    const int32_t row = base[e] + popcount32(masks[e] & (route_bit(g) - 1u));  // the chunk's earlier tokens
    row_source[row] = g * k + j;
    slot_row[g * k + j] = row;
  }
}

}  // namespace mok
