// The workspace's layout (workspace_layout.h): its sections' byte offsets for a config and launch, and the
// rings and the quantized weights' buffer they are sized by. Host arithmetic only.
#include <algorithm>
#include <limits>
#include <string>

#include "gemm_geometry.cuh"
#include "mok/core/dispatch_layout.h"
#include "mok/core/saved_layout.h"
#include "workspace_layout.h"

namespace mok::gpu {
namespace {

// Ring rows that hold `rows` routed rows of one rank's experts in whole tiles (each expert's last tile
// may be part empty).
int ring_rows_for(const LayerConfig& c, int64_t rows) {
  const int64_t ring = (rows / kTileRows + c.experts_per_rank()) * kTileRows;
  require(ring <= std::numeric_limits<int>::max(), "the ring of " + std::to_string(rows) + " rows is too large");
  return int(ring);
}

// The backward's default ring: an average rank's rows, so balanced routing takes one cycle.
int average_rank_ring_rows(const LayerConfig& c) {
  const int64_t rows = int64_t(c.tokens()) * c.top_k;
  return ring_rows_for(c, (rows + c.ranks - 1) / c.ranks);
}

// The most expert tiles one rank can hold: its experts' rows, N min(k, experts per rank) (a token picks
// distinct experts), each expert's last tile part padding, and no more than its GPU's per-row buffers
// hold (own_padded_rows: the forward refuses a layout past them, kCapacity).
long most_rank_tiles(const LayerConfig& c, const LaunchConfig& launch) {
  const long experts = c.experts_per_rank(), rows = long(c.tokens()) * std::min<long>(c.top_k, experts);
  const long own_tiles = own_padded_rows(c, launch.gpus, launch.capacity_rows) / kTileRows;
  return std::min((rows + (kTileRows - 1) * experts) / kTileRows, own_tiles);
}

// Whether the backward runs one ring cycle whatever the routing: every rank's tiles fit its ring
// (ring_cycles counts the busiest rank's). The default ring does with R = 1 (one rank on one GPU: the
// op without a process group); with R > 1 an average rank's rows are fewer than a rank's most.
bool one_ring_cycle(const LayerConfig& c, const LaunchConfig& launch) {
  return launch.ring_rows / kTileRows >= most_rank_tiles(c, launch);
}

ColumnsSection columns_section(Sections& sections, size_t base, size_t P, size_t cols, bool b) {
  const size_t blocks = P / kFp8Block, stride = column_scale_stride(int(cols));
  const auto take = [&](size_t bytes) { return base + sections.take(bytes); };
  ColumnsSection s{take(cols * P), 0, 0, 0};
  if (b) {
    s.scales = take(blocks * stride * sizeof(float));
    s.exp_range = take(blocks * sizeof(int4));
  } else {
    s.exps = take(blocks * stride);
  }
  return s;
}

constexpr size_t kSectionAlign = 256;

// An fp8 section of `sections`: a matrix's E4M3 values, then its scale exponents per 1 x 128 block of
// each of exp_rows rows.
Fp8Section fp8_section(Sections& sections, size_t rows, size_t cols, size_t exp_rows) {
  const size_t values = sections.take(rows * cols), exps = sections.take(exp_rows * (cols / kFp8Block) * 4);
  return Fp8Section{values, exps, sections.bytes() - exps};
}
// An activation's: its exponents in whole 128-row tiles, tile-major (Fp8Matrix: a GEMM stage copies a
// tile's 128 exponents of one K-block at once, past the matrix's last row too).
Fp8Section activation_section(Sections& sections, size_t rows, size_t cols) {
  return fp8_section(sections, rows, cols, (rows + kFp8Block - 1) / kFp8Block * kFp8Block);
}
// An fp8 section `at` of a Sections that starts at `base`, from the buffer's start.
Fp8Section offset_by(size_t base, const Fp8Section& at) { return {base + at.values, base + at.exps, at.exp_bytes}; }

}  // namespace

// The forward stages nothing in the ring (it pulls x straight into xe): one cycle over the most rows a
// rank can receive, N min(k, experts per rank) (a token picks distinct experts).
int forward_cycle_rows(const LayerConfig& c) {
  return ring_rows_for(c, int64_t(c.tokens()) * std::min(c.top_k, c.experts_per_rank()));
}

// The ring a launch runs (Layer::ring_rows): LaunchConfig::ring_rows, or (0) an average rank's rows; at most
// the forward's one cycle, the most rows a rank can receive in whole tiles of its experts. A larger ring is
// never filled (one cycle either way, the same bits: D3) but was allocated: --ring-rows 10^9 planned an
// 8 TB workspace. Clamped, not refused: the bound grows with the batch, and a ring the verify and fuzz
// backends map from the reference's, or one a caller sets for its largest batch, stays valid for a smaller one.
int resolved_ring_rows(const LayerConfig& c, const LaunchConfig& launch) {
  return std::min(launch.ring_rows ? launch.ring_rows : average_rank_ring_rows(c), forward_cycle_rows(c));
}

// The weights' (one GPU's experts and the shared expert), each as W and as W^T: exponents per
// 128 x 128 block, plus one block row (a tile's half past the matrix's last row reads it). Zero bytes
// in bf16.
Fp8WeightLayout fp8_weight_layout(const LayerConfig& c, size_t own_experts) {
  if (c.precision != Precision::fp8) return {};
  const size_t H = c.hidden, I = c.intermediate, Is = c.shared_intermediate, B = kFp8Block;
  Sections sections(kSectionAlign);
  const auto weight = [&](size_t rows, size_t cols) {
    return fp8_section(sections, rows, cols, rows ? rows / B + 1 : 0);  // none without a shared expert
  };
  Fp8WeightLayout l{};
  l.w1 = weight(own_experts * 2 * I, H);
  l.w2 = weight(own_experts * H, I);
  l.shared_w1 = weight(2 * Is, H);
  l.shared_w2 = weight(H, Is);
  l.forward_bytes = sections.bytes();
  l.w1t = weight(own_experts * H, 2 * I);
  l.w2t = weight(own_experts * I, H);
  l.shared_w1t = weight(H, 2 * Is);
  l.shared_w2t = weight(Is, H);
  l.bytes = sections.bytes();
  return l;
}

WorkspaceLayout workspace_layout(const LayerConfig& c, const LaunchConfig& launch, bool slots_in_workspace,
                                 BackwardScratch scratch) {
  const size_t N = c.tokens(), H = c.hidden, I = c.intermediate, E = c.experts, k = c.top_k;
  const size_t Is = c.shared_intermediate, chunks = layout_chunks(c.tokens());
  const size_t P = own_padded_rows(c, launch.gpus, launch.capacity_rows), S = shared_rows_capacity(c, launch.gpus);
  const size_t dh = P * 2 * I * 2;  // h and dh: [P, 2I] bf16
  WorkspaceLayout l{};
  Sections sections(kSectionAlign);
  l.barrier = sections.take(kBarrierWords * sizeof(unsigned int));
  l.chunk_counts = sections.take(chunks * E * 4);
  l.chunk_base = sections.take(chunks * E * 4);
  l.tile_expert = sections.take(padded_rows(c) / kTileRows * 4);  // the layout's tiles, at most
  l.shared_y = sections.take(c.has_shared() ? S * H * 2 : 0);     // read only with a shared expert
  const bool fp8 = c.precision == Precision::fp8;
  // The routed a, which no saved buffer holds (saved_layout): the bf16 forward's GEMM2 operand and dW2's,
  // which the backward's per-row phase writes from h. Saving in bf16, here, before the slots: none of the
  // backward's own sections lie over it; in fp8, whose forward reads aq, apart (below); in recompute
  // mode among take_operands'.
  if (!launch.recompute && !fp8) l.a = sections.take(P * I * 2);
  // The fp8 shared expert's x quantized before the slots: the backward's shared_dyq, live while the
  // sections past it are dead (the backward's own may start at the slots or at xq).
  if (fp8) l.fp8.shared_xq = activation_section(sections, S, Is ? H : 0);
  // A bf16 recompute forward on one GPU pushes its y_j over xe, which only GEMM1 reads (the forward runs one
  // cycle: forward_cycle_rows; a grid barrier between GEMM1 and GEMM2, and no peer to push early): its slots
  // are then the backward's dx_j alone, past the forward's sections. Not where a capacity leaves xe fewer rows
  // than the (token, slot) buffer (such a forward stops at its capacity check).
  const bool y_over_xe = launch.recompute && !fp8 && slots_in_workspace && N * k <= P;
  require(!y_over_xe || forward_cycle_rows(c) / kTileRows >= most_rank_tiles(c, launch),
          "internal: the forward's ring does not hold a rank's tiles in one cycle, which y_j over xe needs");
  l.slots = sections.take(slots_in_workspace && !y_over_xe ? N * k * H * 2 : 0);
  const size_t slots_end = sections.bytes();
  // Recompute mode: the saved buffer's activations (saved_layout) are the workspace's, no later section
  // over the shared expert's (read after the cycles) nor over xe (read by dW1, the last phase). The
  // forward writes its GEMMs' bf16 operands among them (xe, a, shared_a; the fp8 mode's GEMMs read E4M3
  // ones), within its workspace; h and shared_h (and in the fp8 mode all five) only the backward writes,
  // past the forward's workspace, but for the fp8 mode's shared h and a, which lie over aq where they fit:
  // the recompute backward's GEMM1 writes h alone, so it neither writes nor reads aq.
  const bool recompute = launch.recompute, bf16_operands = recompute && !fp8;
  Sections over_aq(kSectionAlign);
  const size_t shared_h_over_aq = over_aq.take(S * 2 * Is * 2), shared_a_over_aq = over_aq.take(S * Is * 2);
  const bool shared_over_aq = recompute && fp8 && over_aq.bytes() <= P * I;
  const auto take_operands = [&] {  // xe, a, shared_a: forward sections in bf16, past the forward's in fp8
    l.xe = sections.take(P * H * 2);
    l.a = sections.take(P * I * 2);
    if (!shared_over_aq) l.shared_a = sections.take(S * Is * 2);
  };
  if (bf16_operands) take_operands();
  const bool one_cycle = l.one_cycle = one_ring_cycle(c, launch);
  const Fp8WeightLayout fp8w = fp8_weight_layout(c, E / launch.gpus);
  if (fp8) {
    l.fp8.xq = activation_section(sections, P, H);
    l.fp8.aq = activation_section(sections, P, I);
    l.fp8.shared_aq = activation_section(sections, S, Is);
    l.fp8_weights = sections.take(launch.fp8_weights_given ? 0 : fp8w.forward_bytes);
  }
  l.forward_bytes = sections.bytes();
  sections.take(launch.fp8_weights_given ? 0 : fp8w.bytes - fp8w.forward_bytes);  // the transposed copies
  if (recompute && fp8) take_operands();
  if (y_over_xe) l.slots = sections.take(N * k * H * 2);
  l.y_slots = y_over_xe ? l.xe : l.slots;
  if (shared_over_aq) {
    l.shared_h = l.fp8.aq.values + shared_h_over_aq;
    l.shared_a = l.fp8.aq.values + shared_a_over_aq;
  } else {
    l.shared_h = sections.take(recompute ? S * 2 * Is * 2 : 0);
  }
  l.h = sections.take(recompute ? dh : 0);  // last of a recompute forward's: see below
  const size_t h_end = sections.bytes();
  const size_t ring_rows = size_t(c.ranks / launch.gpus) * launch.ring_rows;  // own ranks' rings
  const bool dh_over_h = l.dh_over_h = scratch.dh_over_saved_h && !recompute;
  if (scratch.in_d_w1 && !fp8 && !recompute) {  // the scratch in d_w1, where it fits (workspace_layout.h)
    Sections in_cycles(kSectionAlign), rest(kSectionAlign);
    const size_t ring = in_cycles.take(ring_rows * H * 2), g = in_cycles.take(ring_rows * I * 4);
    const size_t rest_base = one_cycle && P * I * 2 <= g - ring ? 0 : in_cycles.bytes();
    const size_t a = rest_base + rest.take(P * I * 2);
    const size_t dx = rest_base + rest.take(std::max(slots_in_workspace ? N * k * H * 2 : 0, P * H * 2));
    const size_t d_w1_bytes = std::max(in_cycles.bytes(), rest_base + rest.bytes());
    if (d_w1_bytes <= E / launch.gpus * 2 * I * H * 2) {
      // The forward's a and slots, its last sections, are dead in such a backward: its own start there.
      const size_t base = l.a;
      require(l.forward_bytes == slots_end, "internal: the forward's a and slots are not its last sections");
      Sections own(kSectionAlign);
      if (!dh_over_h) l.dh = base + own.take(dh);
      l.shared_dh = base + own.take(S * 2 * Is * 2);
      l.ring = ring, l.g = g, l.a = a, l.dx_slots = l.dye = dx;
      l.in_d_w1 = true, l.d_w1_bytes = d_w1_bytes;
      l.bytes = base + own.bytes();
      return l;
    }
  }
  // Over one another from base: the ring and g, dead after the last per-row phase; and what is written
  // after them (dye, shared_dh), or with one cycle after that cycle's dy W2 (dh). With several cycles in
  // bf16 recompute mode, dye and shared_dh start at h (the per-row phase is its last reader), which ends
  // the sections before them.
  // Without recompute the backward reads none of the forward's E4M3 activations but shared_xq (as
  // shared_dyq, before the slots): with the weights given (no bytes after them), its own sections lie
  // over xq, aq and shared_aq.
  const bool over_activations = fp8 && !launch.recompute && launch.fp8_weights_given;
  // One ring cycle, the (token, slot) buffer in the workspace (simulated ranks), no recompute, bf16 or fp8
  // with the weights given: the dx_j lie past dh (and dhq, which the dx push reads), over g (dead once the
  // per-row phase has read it), and dye over them once the dx combine has read them (it comes before the
  // dye pull); the forward's slots, followed by nothing such a backward reads, are dead in it, and its own
  // sections start there.
  const bool dx_slots_past_dh = one_cycle && slots_in_workspace && !launch.recompute && (!fp8 || over_activations);
  const size_t base = dx_slots_past_dh ? l.slots : over_activations ? l.fp8.xq.values : sections.bytes();
  require(!dx_slots_past_dh || (fp8 ? l.fp8.xq.values : sections.bytes()) == slots_end,
          "internal: the slots are not followed by the backward's dead sections alone");
  const size_t late_base = !one_cycle && bf16_operands ? l.h : base;
  require(late_base == base || h_end == base, "internal: h is not the last section before the backward's");
  Sections cycles(kSectionAlign), late(kSectionAlign), after(kSectionAlign);
  if (fp8)
    l.ringq = offset_by(base, activation_section(cycles, ring_rows, H));
  else
    l.ring = base + cycles.take(ring_rows * H * 2);
  if (one_cycle && !dh_over_h) l.dh = base + late.take(dh);
  Sections row_grad = late;  // the per-row phase's outputs: dh (one cycle) and dhq
  if (fp8) l.dhq = offset_by(base, activation_section(row_grad, ring_rows, 2 * I));
  if (row_grad.bytes() > cycles.bytes()) cycles.take(row_grad.bytes() - cycles.bytes());  // g past them
  l.g = base + cycles.take(ring_rows * I * 4);
  if (dx_slots_past_dh) {  // one cycle: past dh and dhq; the dx_j are written after the last reader of g
    late = row_grad;
    l.dx_slots = l.dye = base + late.take(std::max(N * k * H * 2, P * H * 2));
  } else {
    l.dx_slots = l.slots;
    l.dye = late_base + late.take(P * H * 2);
  }
  l.shared_dh = late_base + late.take(S * 2 * Is * 2);
  if (fp8) {
    l.shared_dhq = offset_by(late_base, activation_section(late, S, 2 * Is));
    l.shared_dyq = l.fp8.shared_xq;
  }
  const size_t end = std::max(base + cycles.bytes(), late_base + late.bytes());
  if (!one_cycle && !dh_over_h) l.dh = end + after.take(dh);  // apart: from the first cycle to the weight gradients
  // The fp8 mode saves no xe (saves_xe) and its forward writes none: the backward pulls it for dW1, apart.
  if (!launch.recompute && !saves_xe(c, false)) l.xe = end + after.take(P * H * 2);
  if (!launch.recompute && fp8) l.a = end + after.take(P * I * 2);  // from the per-row phase on
  if (fp8 && launch.fp8_weight_gradients) {  // apart: written beside dh, xe, dye and a, which they copy
    const auto columns = [&](size_t cols, bool b) { return columns_section(after, end, P, cols, b); };
    l.dhtq = columns(2 * I, false), l.xetq = columns(H, true), l.dyetq = columns(H, false), l.atq = columns(I, true);
  }
  // The forward's workspace is a prefix of the backward's also where the backward's own lie over its
  // dead tail (from the slots, the forward's E4M3 activations outweighed dh, dhq and the dx_j at H = 16 I
  // until the fp8 saving backward's xe, 2 P H bytes against xq's P H, came apart: no layout reaches it now).
  l.bytes = std::max(end + after.bytes(), l.forward_bytes);
  return l;
}

}  // namespace mok::gpu
