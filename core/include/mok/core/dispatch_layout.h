// The dispatch layout (schedule table): a pure integer function of the routing.
// Expert rows are ordered by expert, then by global token id g = rank * T + t (a token meets an
// expert at most once). Row r of expert e is layout row offsets[e] + r.
//   counts[e]            rows routed to expert e
//   offsets[e]           exclusive prefix sum of counts (offsets[E] = N * k)
//   row_source[row]      g * k + j, the (token, slot) a layout row serves
//   slot_row[g * k + j]  the inverse: the layout row of (token, slot)
// Built in chunks of kLayoutChunk tokens so the GPU runs these same functions one chunk per thread:
// count per chunk, scan over (expert, chunk) (one expert per thread), place per chunk.
#pragma once

#include "mok/core/host_device.h"

namespace mok {

inline constexpr int kLayoutChunk = 32;  // small: the GPU runs count and place one thread per chunk

MOK_HD int layout_chunks(int tokens) { return (tokens + kLayoutChunk - 1) / kLayoutChunk; }

// chunk_counts[e] = rows of expert e among the chunk's tokens.
MOK_HD void count_chunk(const int32_t* topk_idx, int k, int chunk, int tokens, int experts, int32_t* chunk_counts) {
  for (int e = 0; e < experts; ++e) chunk_counts[e] = 0;
  const int end = (chunk + 1) * kLayoutChunk < tokens ? (chunk + 1) * kLayoutChunk : tokens;
  for (int g = chunk * kLayoutChunk; g < end; ++g)
    for (int j = 0; j < k; ++j) ++chunk_counts[topk_idx[g * k + j]];
}

// Rows of expert e over all chunks (counts_by_chunk: [chunks, E]).
MOK_HD int32_t expert_rows(const int32_t* counts_by_chunk, int chunks, int experts, int e) {
  int32_t rows = 0;
  for (int c = 0; c < chunks; ++c) rows += counts_by_chunk[c * experts + e];
  return rows;
}

// Column e of chunk_base: the first layout row of expert e's rows from each chunk, the expert's rows
// starting at layout row `first` (its offset). Experts are independent given their offsets, so the
// GPU runs one expert per thread.
MOK_HD void scan_expert(const int32_t* counts_by_chunk, int chunks, int experts, int e, int32_t first,
                        int32_t* chunk_base) {
  for (int c = 0; c < chunks; ++c) {
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
  for (int e = 0; e < experts; ++e) offsets[e + 1] = expert_rows(counts_by_chunk, chunks, experts, e);
  prefix_offsets(experts, offsets);
  for (int e = 0; e < experts; ++e) scan_expert(counts_by_chunk, chunks, experts, e, offsets[e], chunk_base);
}

// cursor: this chunk's row of chunk_base, advanced as rows are placed.
MOK_HD void place_chunk(const int32_t* topk_idx, int k, int chunk, int tokens, int32_t* cursor, int32_t* row_source,
                        int32_t* slot_row) {
  const int end = (chunk + 1) * kLayoutChunk < tokens ? (chunk + 1) * kLayoutChunk : tokens;
  for (int g = chunk * kLayoutChunk; g < end; ++g)
    for (int j = 0; j < k; ++j) {
      const int32_t row = cursor[topk_idx[g * k + j]]++;
      row_source[row] = g * k + j;
      slot_row[g * k + j] = row;
    }
}

}  // namespace mok
