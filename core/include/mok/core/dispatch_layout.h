// The dispatch layout (schedule table): a pure integer function of the routing.
// Expert rows are ordered by expert, then by global token id g = rank * T + t (a token meets an
// expert at most once). Row r of expert e is layout row offsets[e] + r.
//   counts[e]            rows routed to expert e
//   offsets[e]           exclusive prefix sum of counts (offsets[E] = N * k)
//   row_source[row]      g * k + j, the (token, slot) a layout row serves
//   slot_row[g * k + j]  the inverse: the layout row of (token, slot)
// Built in chunks of kLayoutChunk tokens so the GPU runs these same functions one chunk per thread:
// count per chunk, scan over (expert, chunk), place per chunk.
#pragma once

#include "mok/core/host_device.h"

namespace mok {

inline constexpr int kLayoutChunk = 128;

MOK_HD int layout_chunks(int tokens) { return (tokens + kLayoutChunk - 1) / kLayoutChunk; }

// chunk_counts[e] = rows of expert e among the chunk's tokens.
MOK_HD void count_chunk(const int32_t* topk_idx, int k, int chunk, int tokens, int experts, int32_t* chunk_counts) {
  for (int e = 0; e < experts; ++e) chunk_counts[e] = 0;
  const int end = (chunk + 1) * kLayoutChunk < tokens ? (chunk + 1) * kLayoutChunk : tokens;
  for (int g = chunk * kLayoutChunk; g < end; ++g)
    for (int j = 0; j < k; ++j) ++chunk_counts[topk_idx[g * k + j]];
}

// counts_by_chunk: [chunks, E] in, chunk_base: [chunks, E] out (first layout row of each expert's
// rows from each chunk), offsets: [E + 1] out. Order: expert-major, then chunk: a pure scan.
MOK_HD void scan_chunks(const int32_t* counts_by_chunk, int chunks, int experts, int32_t* chunk_base,
                        int32_t* offsets) {
  int32_t running = 0;
  for (int e = 0; e < experts; ++e) {
    offsets[e] = running;
    for (int c = 0; c < chunks; ++c) {
      chunk_base[c * experts + e] = running;
      running += counts_by_chunk[c * experts + e];
    }
  }
  offsets[experts] = running;
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
