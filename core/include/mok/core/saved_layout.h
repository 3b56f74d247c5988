// What the forward saves for the backward, as one byte buffer whose size depends only on the config
// and the recompute choice: the dispatch layout, each padded row's x (xe; bf16 only: saves_xe) and h (not
// a: SavedLayout), and the shared expert's h and a. In the GPU's recompute mode (LaunchConfig::recompute) all but the
// layout are empty: the backward pulls x into xe again and recomputes h (and a) from it and W1, and the shared expert's
// from x and W1s (the forward's own code, the same bits), so that between the passes the layer keeps nothing but the
// layout. The GPU layer writes it in place; the CPU reference's results are packed into the same layout (pack_saved),
// so a saved buffer is one thing to a caller (the PyTorch op saves it for autograd) whichever device
// made it, and unpack_saved turns either back into the reference's Forward (the PyTorch op's CPU
// path packs in the call's recompute choice).
// Padded rows: every expert's layout rows rounded up to whole 128-row tiles (padded row of layout row
// offsets[e] + i = 128 tile_offsets[e] + i); padding rows hold zeros.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "mok/core/config.h"
#include "mok/core/dispatch_layout.h"
#include "mok/core/kstep.h"
#include "mok/core/layer_io.h"

namespace mok {

inline constexpr int kTileRows = 128;  // the GPU's GEMM tile: the unit of expert padding

// The most routed rows one GPU's experts (E/G of them) can receive: N min(k, E/G), as a token picks
// distinct experts.
MOK_HD long most_own_rows(const LayerConfig& c, int gpus) {
  const long experts = c.experts / gpus;
  return long(c.tokens()) * (c.top_k < experts ? c.top_k : experts);
}

// Rows of one GPU's per-row buffers over `gpus` GPUs: its own experts' tiles (E/G experts), counted from
// its first expert's first tile, for `capacity_rows` routed rows (0: most_own_rows), each expert's last
// tile part padding at most. One GPU without a capacity: padded_rows(c).
MOK_HD long own_padded_rows(const LayerConfig& c, int gpus, long capacity_rows) {
  const long rows = capacity_rows ? capacity_rows : most_own_rows(c, gpus);
  return kTileRows * ((rows + kTileRows - 1) / kTileRows + c.experts / gpus);
}

// tile_offsets [E + 1] from offsets [E + 1]: each expert's rows in whole tiles, experts one after
// another, so expert e's tiles start at padded row 128 tile_offsets[e] (the GPU's layout scan, and
// saved_detail::tile_offsets for the CPU).
MOK_HD int64_t expert_tiles(int e, const int32_t* offsets) {  // 64-bit: offsets read back may be any bits
  return (int64_t(offsets[e + 1]) - offsets[e] + kTileRows - 1) / kTileRows;
}
MOK_HD void prefix_tile_offsets(int experts, const int32_t* offsets, int32_t* tile_offsets) {
  tile_offsets[0] = 0;
  for (int e = 0; e < experts; ++e) tile_offsets[e + 1] = tile_offsets[e] + int32_t(expert_tiles(e, offsets));
}

// A saved layout's offsets and tile_offsets read back from memory hold together (the host's
// saved_detail::validate_layout and the GPU's backward): both from 0, offsets rising to N k by at most
// N an expert, and each expert's tiles its rows' (a check an expert at a time, as a warp's lanes take
// them).
MOK_HD bool saved_offsets_span(int experts, int32_t rows, const int32_t* offsets, const int32_t* tile_offsets) {
  return offsets_span(experts, rows, offsets) && tile_offsets[0] == 0;
}
MOK_HD bool saved_offsets_hold_at(int e, int32_t tokens, const int32_t* offsets, const int32_t* tile_offsets) {
  return offsets_step_at(e, tokens, offsets) &&
         int64_t(tile_offsets[e + 1]) - tile_offsets[e] == expert_tiles(e, offsets);
}

// What is wrong with a saved buffer whose layout's tables hold no layout (the host's error, and the GPU
// backward's; `where`: " on GPU g" across GPUs).
inline std::string saved_holds_no_layout(const std::string& where = "") {
  return "saved" + where + " holds no dispatch layout of this config: pass the saved output of a forward";
}

// Rows of one GPU's padded per-row buffers: the layout's rows plus each expert's last partial tile, at most.
MOK_HD long padded_rows(const LayerConfig& c) { return own_padded_rows(c, 1, 0); }

// The shared expert's tokens on GPU `gpu` of `gpus` (docs/multi-gpu.md, "The shared expert and the
// router across GPUs"): the GPU computes it for its own tokens [begin, begin + N/G) and for the next
// GPU's first tokens up to `end`, where its last 16-row K-step reaches them; its weight-gradient
// chains take the whole K-steps that start in its tokens, rows [chain_begin, end), so that the GPUs'
// pieces, continued one after another, are the one-GPU chain over every token (K-steps from token 0).
// One GPU: every token.
struct TokenRows {
  long begin, chain_begin, end;
  MOK_HD long rows() const { return end - begin; }
};
MOK_HD TokenRows shared_token_rows(const LayerConfig& c, int gpus, int gpu) {
  const long N = c.tokens(), T = N / gpus;
  const auto step_start = [&](long t) {
    const long up = (t + kStepK - 1) / kStepK * kStepK;
    return up < N ? up : N;
  };
  return TokenRows{gpu * T, step_start(gpu * T), step_start((gpu + 1) * T)};
}
// Rows of every GPU's per-token shared-expert sections (and of its views of x and dy): the most
// shared_token_rows gives over the GPUs, N/G + 15 at most.
MOK_HD long shared_rows_capacity(const LayerConfig& c, int gpus) {
  long most = 0;
  for (int g = 0; g < gpus; ++g) {
    const long rows = shared_token_rows(c, gpus, g).rows();
    most = rows > most ? rows : most;
  }
  return most;
}

// Whose rows a saved buffer holds: GPU `gpu`'s of `gpus`, for `capacity_rows` (own_padded_rows).
struct RowShare {
  int gpus = 1, gpu = 0;
  long capacity_rows = 0;
};

// Lays out a buffer's sections one after another, each starting at a multiple of `align` bytes
// (the saved buffer's, the workspace's and the NCCL window's sections).
class Sections {
 public:
  explicit Sections(size_t align) : align_(align) {}
  // The next section's offset; `bytes` of it are reserved.
  size_t take(size_t bytes) {
    const size_t offset = at_;
    at_ += (bytes + align_ - 1) / align_ * align_;
    return offset;
  }
  size_t bytes() const { return at_; }

 private:
  size_t align_, at_ = 0;
};

// Whether the saved buffer holds xe, x of each padded row (dW1's operand). The fp8 mode's forward GEMM1
// reads the E4M3 xq, not xe, so it saves none: its backward pulls xe from x (as recompute mode's does),
// which costs the backward about what writing it cost the forward, and the buffer a model holds per layer
// between the passes drops by [P, H] bf16 (docs/benchmarks.md, session 66).
MOK_HD bool saves_xe(const LayerConfig& c, bool recompute) { return !recompute && c.precision == Precision::bf16; }

// Byte offsets of the saved buffer's sections (each 256-byte aligned: TMA bases need 16). It holds no
// routed a = bf16(swiglu(h)): the backward's per-row phase, which reads h and computes the sigmoids of
// its gates anyway, makes a again (the same function, the same bits) and writes it into its workspace
// for dW2, in the time it took to read it, so the buffer a model holds per layer between the passes is
// [P, I] bf16 smaller. The shared expert's a (S rows, small) is saved.
struct SavedLayout {
  size_t offsets, tile_offsets, row_source, slot_row;  // int32 [E + 1], [E + 1], [N k], [N k]
  size_t xe, h;                                        // bf16 [P, H], [P, 2I]
  size_t shared_h, shared_a;                           // bf16 [S, 2Is], [S, Is]
  size_t bytes;
};

// Without saves_xe, xe takes no bytes. recompute: xe, h, shared_h and shared_a take no bytes (their offsets are
// where they would start), so the buffer is the layout's alone. P, the per-row sections' rows: own_padded_rows of the
// GPU's share; S, the shared expert's rows: shared_rows_capacity of the share's GPUs (N on one GPU; rows past the GPU's
// shared_token_rows are zero).
inline SavedLayout saved_layout(const LayerConfig& c, bool recompute = false, RowShare share = {}) {
  const size_t N = c.tokens(), k = c.top_k, E = c.experts, H = c.hidden, I = c.intermediate;
  const size_t Is = c.shared_intermediate, P = own_padded_rows(c, share.gpus, share.capacity_rows);
  const size_t S = shared_rows_capacity(c, share.gpus);
  SavedLayout l{};
  Sections sections(256);
  l.offsets = sections.take((E + 1) * 4);
  l.tile_offsets = sections.take((E + 1) * 4);
  l.row_source = sections.take(N * k * 4);
  l.slot_row = sections.take(N * k * 4);
  l.xe = sections.take(saves_xe(c, recompute) ? P * H * 2 : 0);
  l.h = sections.take(recompute ? 0 : P * 2 * I * 2);
  l.shared_h = sections.take(recompute ? 0 : S * 2 * Is * 2);
  l.shared_a = sections.take(recompute ? 0 : S * Is * 2);
  l.bytes = sections.bytes();
  return l;
}

namespace saved_detail {

template <class T>
void put(std::vector<uint8_t>& out, size_t offset, const T* data, size_t n) {
  if (n) std::memcpy(out.data() + offset, data, n * sizeof(T));
}
template <class T>
std::vector<T> get(const std::vector<uint8_t>& in, size_t offset, size_t n) {
  std::vector<T> v(n);
  if (n) std::memcpy(v.data(), in.data() + offset, n * sizeof(T));
  return v;
}

// Expert e's tiles start at padded row 128 tile_offsets[e].
inline std::vector<int32_t> tile_offsets(const DispatchLayout& l) {
  std::vector<int32_t> t(l.offsets.size());
  if (!t.empty()) prefix_tile_offsets(int(t.size()) - 1, l.offsets.data(), t.data());
  return t;
}

// Moves `width` elements per layout row between compact (layout-row order) and padded rows: the rows
// of the share's experts, counted from its first expert's first tile.
template <class T, class Move>
void for_each_padded_row(const LayerConfig& c, const DispatchLayout& l, const std::vector<int32_t>& tiles,
                         const RowShare& share, Move move) {
  const int per_gpu = c.experts / share.gpus, first = share.gpu * per_gpu;
  for (int e = first; e < first + per_gpu; ++e)
    for (int32_t r = l.offsets[e]; r < l.offsets[e + 1]; ++r)
      move(size_t(r), size_t(kTileRows) * (tiles[e] - tiles[first]) + (r - l.offsets[e]));
}

// A layout read back from a saved buffer is one the layer could have made (else the rows it names
// are read out of bounds): offsets rising from 0 to N k, the tiles they imply, row_source and slot_row
// inverse permutations.
inline void validate_layout(const LayerConfig& c, const DispatchLayout& l, const std::vector<int32_t>& tiles) {
  const int32_t rows = c.tokens() * c.top_k;
  bool ok = saved_offsets_span(c.experts, rows, l.offsets.data(), tiles.data());
  for (int e = 0; ok && e < c.experts; ++e) ok = saved_offsets_hold_at(e, c.tokens(), l.offsets.data(), tiles.data());
  for (int32_t r = 0; ok && r < rows; ++r) ok = row_is_laid_out(r, rows, l.row_source.data(), l.slot_row.data());
  require(ok, [] { return saved_holds_no_layout(); });
}

}  // namespace saved_detail

// The reference's Forward (with its saved h and the shared expert's h and a, or in recompute mode
// without) and the tokens x, as the GPU would have saved them (xe from x where saves_xe, or in
// recompute mode the layout alone).
inline std::vector<uint8_t> pack_saved(const LayerConfig& c, const Forward& f, const std::vector<bf16>& x,
                                       bool recompute = false) {
  using namespace saved_detail;
  const SavedLayout s = saved_layout(c, recompute);
  const size_t H = c.hidden, I = c.intermediate, k = c.top_k;
  std::vector<uint8_t> out(s.bytes, 0);
  const std::vector<int32_t> tiles = tile_offsets(f.layout);
  put(out, s.offsets, f.layout.offsets.data(), f.layout.offsets.size());
  put(out, s.tile_offsets, tiles.data(), tiles.size());
  put(out, s.row_source, f.layout.row_source.data(), f.layout.row_source.size());
  put(out, s.slot_row, f.layout.slot_row.data(), f.layout.slot_row.size());
  if (recompute) return out;
  const size_t rows = f.layout.row_source.size(), N = c.tokens(), Is = c.shared_intermediate;
  require(f.h.size() == rows * 2 * I && f.shared_h.size() == N * 2 * Is && f.shared_a.size() == N * Is,
          "pack_saved: the forward holds no h (a recompute-mode forward packs with recompute)");
  for_each_padded_row<bf16>(c, f.layout, tiles, RowShare{}, [&](size_t row, size_t pad) {
    if (saves_xe(c, false)) put(out, s.xe + pad * H * 2, x.data() + size_t(f.layout.row_source[row]) / k * H, H);
    put(out, s.h + pad * 2 * I * 2, f.h.data() + row * 2 * I, 2 * I);
  });
  put(out, s.shared_h, f.shared_h.data(), f.shared_h.size());
  put(out, s.shared_a, f.shared_a.data(), f.shared_a.size());
  return out;
}

// The layout and saved activations of a saved buffer (routing and logits are the caller's tensors);
// one of recompute mode holds the layout alone, and its Forward has no h, nor the shared expert's h
// and a (as the reference's in that mode).
// A GPU's share over several holds h of its own experts' rows only, and the shared expert's h and a of
// its shared_token_rows only (the others' stay zero).
inline Forward unpack_saved(const LayerConfig& c, const std::vector<uint8_t>& saved, bool recompute = false,
                            const RowShare& share = {}) {
  using namespace saved_detail;
  const SavedLayout s = saved_layout(c, recompute, share);
  require(saved.size() == s.bytes, "saved buffer has " + std::to_string(saved.size()) + " bytes, expected " +
                                       std::to_string(s.bytes) + " for this config");
  const size_t N = c.tokens(), k = c.top_k, E = c.experts, I = c.intermediate, Is = c.shared_intermediate;
  Forward f;
  f.layout.offsets = get<int32_t>(saved, s.offsets, E + 1);
  f.layout.row_source = get<int32_t>(saved, s.row_source, N * k);
  f.layout.slot_row = get<int32_t>(saved, s.slot_row, N * k);
  const std::vector<int32_t> tiles = get<int32_t>(saved, s.tile_offsets, E + 1);
  validate_layout(c, f.layout, tiles);
  // The share's tiles fit its rows: a capacity below what the layout routes to its experts would read
  // past them (the forward refuses such a routing; a buffer from elsewhere need not have).
  const int per_gpu = c.experts / share.gpus, first = share.gpu * per_gpu;
  const long rows = long(kTileRows) * (tiles[first + per_gpu] - tiles[first]);
  const long held = own_padded_rows(c, share.gpus, share.capacity_rows);
  require(rows <= held, [&] {
    return "saved's layout gives GPU " + std::to_string(share.gpu) + "'s experts " + std::to_string(rows) +
           " padded rows, more than the " + std::to_string(held) +
           " its buffers hold (capacity_rows = " + std::to_string(share.capacity_rows) + ")";
  });
  f.layout.counts.resize(E);
  for (size_t e = 0; e < E; ++e) f.layout.counts[e] = f.layout.offsets[e + 1] - f.layout.offsets[e];
  if (recompute) return f;
  f.h.resize(N * k * 2 * I);
  for_each_padded_row<bf16>(c, f.layout, tiles, share, [&](size_t row, size_t pad) {
    std::memcpy(f.h.data() + row * 2 * I, saved.data() + s.h + pad * 2 * I * 2, 2 * I * 2);
  });
  const TokenRows shared = shared_token_rows(c, share.gpus, share.gpu);
  f.shared_h.resize(N * 2 * Is);
  f.shared_a.resize(N * Is);
  if (Is) {
    std::memcpy(f.shared_h.data() + shared.begin * 2 * Is, saved.data() + s.shared_h, shared.rows() * 2 * Is * 2);
    std::memcpy(f.shared_a.data() + shared.begin * Is, saved.data() + s.shared_a, shared.rows() * Is * 2);
  }
  return f;
}

}  // namespace mok
