// The workspace's layout (workspace_layout.cu): its sections' byte offsets, for the forward and the
// backward. Host arithmetic only, so the host tests check it (LayerMemory.*: sizes; BackwardBuffers.*: that
// no two buffers live at once share a byte).
#pragma once

#include <cstddef>
#include <cstdint>

#include "mok/core/config.h"
#include "mok/megakernel/layer.h"

namespace mok::gpu {

// The workspace's sections (each 256-byte aligned): the forward's first, then the backward's own, so
// the forward's workspace is a prefix of the backward's. The routed a = bf16(swiglu(h)) is never saved:
// the bf16 forward writes it for GEMM2 and the backward's per-row phase again from h for dW2; saving, it
// lies before the slots in bf16 and, in fp8 (whose forward writes none), apart past the backward's own
// sections. In recompute mode xe and h, and the shared
// expert's h and a, are the workspace's too (otherwise they take no bytes: they are saved, but for the fp8
// mode's xe, which is never saved and lies apart past the saving backward's own sections): those the
// forward's bf16 GEMMs read (xe, a, shared a) are forward sections, before the E4M3 copies; the rest (h
// and shared h; in the fp8 mode, whose GEMMs read E4M3 copies, all five) only the backward writes, past
// the forward's sections and the transposed weights, h last, but for the fp8 mode's shared h and a, which lie
// over the forward's aq where they fit (the recompute backward writes no aq and reads none). The backward writes them
// all (xe pulled from x again, h recomputed, a from h by the per-row phase) before reading them, past its ring cycles
// (xe to its last phase, dW1), while its own sections may start at h (bf16, several cycles). The backward's own
// sections share bytes where their lifetimes are disjoint (docs/architecture.md, "The backward's buffers"): the ring
// (dy) lives in a cycle from its pull to dy W2, g (ring rows) from dy W2 to the per-row phase, dh from the per-row
// phase to the weight gradients, shared_dh from the phase after the cycles and dye from its pull (after the dx combine)
// to the weight gradients. So dye and shared_dh lie over the ring and g, and with one ring cycle (one_ring_cycle) dh
// lies over the ring too (dead once dy W2 has read it; never over g, which the per-row phase reads as it writes dh).
// With one cycle, simulated ranks (the (token, slot) buffer in the workspace) and no recompute, in bf16 or in fp8 with
// the weights given, the backward's own start at the forward's slots, the dx_j lie past dh (and dhq) over g, and dye
// over them (dx_slots_past_dh). The fp8 mode's E4M3 copies (Params::xq, aq, shared_xq, shared_aq, *_exp) are forward
// sections too: each matrix's values, then its scale exponents; none in bf16. shared_xq comes before the slots, the
// rest after them. The quantized weights are laid out as the caller's buffer of them (Fp8WeightLayout,
// ForwardInputs::fp8_weights), of no bytes with LaunchConfig::fp8_weights_given: the forward's copies are the forward's
// last section, the transposed copies (the backward's) follow them, so they are the backward's first bytes. The fp8
// backward's own: the ring holds dy quantized (ringq) in the bf16 ring's place; dh quantized per ring row (dhq: written
// with dh by the per-row phase, read by that cycle's dx push) lies over the ring, after dh with one cycle (both are
// written at once), and g past both; shared_dhq (written with shared_dh, read by the shared dx) after shared_dh; the
// shared expert's tokens' dy quantized (shared_dyq: from the first cycle's pull to the shared expert's dy W2 after
// the cycles) in the forward's shared_xq section, of its shape and not read in the backward. Without recompute and with
// the weights given, they all start over the forward's xq, aq and shared_aq, which such a backward does not read, or
// with one cycle and simulated ranks over the slots too.
// With BackwardScratch::in_d_w1 (workspace_layout below) the backward's workspace ends before the forward's a:
// then the forward's is no prefix of it.
struct Fp8Section {
  size_t values, exps;
  size_t exp_bytes;  // the exponents' section as reserved: the table, its padding and the alignment gap
};
struct Fp8Sections {
  Fp8Section xq, aq, shared_xq, shared_aq;
};
// The quantized weights' sections from the start of their buffer (each 256-byte aligned): the forward's
// B (W as stored, with W's exponent tables), then the backward's (W^T: the same codes transposed, and
// the same exponents as W^T's tables, which the FP8 GEMM indexes by B's block rows; the tables are
// 1/4096 of the values' bytes, so a second copy in that order costs nothing beside the values).
struct Fp8WeightLayout {
  Fp8Section w1, w2, shared_w1, shared_w2;
  size_t forward_bytes;  // the forward's copies
  Fp8Section w1t, w2t, shared_w1t, shared_w2t;
  size_t bytes;
};
// An operand of the fp8 weight gradients (Fp8Columns): its codes, then as A its exponents, or as B its
// scales and exponent ranges, each offset `base` + its place in `sections` (0: none).
struct ColumnsSection {
  size_t values, exps, scales, exp_range;
};
struct WorkspaceLayout {
  size_t barrier, chunk_counts, chunk_base, tile_expert, shared_y, slots, shared_h, shared_a, xe, a, h;
  Fp8Sections fp8;
  size_t fp8_weights;  // the quantized weights (Fp8WeightLayout) unless the caller's
  size_t forward_bytes;
  size_t ring, g, dh, dye, shared_dh, bytes;
  Fp8Section ringq, dhq, shared_dyq, shared_dhq;  // the fp8 backward's
  ColumnsSection dhtq, xetq, dyetq, atq;          // LaunchConfig::fp8_weight_gradients'
  bool one_cycle;                                 // dh (or, in d_w1, a) lies over the ring (one_ring_cycle)
  // The backward's (token, slot) buffer (its dx_j): the slots section (the forward's too, but in a bf16
  // recompute forward on one GPU: y_slots), or (dx_slots_past_dh in workspace_layout) the section past dh
  // that dye takes once the dx combine has read it, or (in_d_w1) d_w1's section past a, under dye too.
  size_t dx_slots;
  // The forward's (token, slot) buffer (its y_j): the slots, or in a bf16 recompute forward on one GPU xe's
  // bytes, dead once GEMM1 has read them (workspace_layout), the slots then past the forward's sections.
  size_t y_slots;
  bool dh_over_h;     // dh is the saved buffer's h (BackwardScratch::dh_over_saved_h): l.dh unused
  bool in_d_w1;       // ring, g, a, dye and dx_slots are offsets in d_w1 (BackwardScratch::in_d_w1)
  size_t d_w1_bytes;  // the scratch's bytes in d_w1
  // Where the offsets of the sections that may lie in d_w1 (in_d_w1's list) count from.
  uint8_t* scratch_base(uint8_t* workspace, uint8_t* d_w1) const { return in_d_w1 ? d_w1 : workspace; }
};

// A backward's layout given `scratch` (BackwardScratch; the forward's is that of none). With the scratch
// in d_w1 (bf16, no recompute, where it fits in d_w1's bytes as bf16): d_w1 holds the ring and g, then a
// (from the per-row phase to dW2's tiles; with one ring cycle over the ring, dead once dy W2 has read it,
// where it fits there), the dx_j past a (with one cycle over the rest of the ring and g, dead once the
// per-row phase has read g) and dye over the dx_j; the workspace keeps the forward's sections before its
// a, then dh (unless over the saved h) and shared_dh: it may be shorter than the forward's.
WorkspaceLayout workspace_layout(const LayerConfig& c, const LaunchConfig& launch, bool slots_in_workspace,
                                 BackwardScratch scratch = {});

// The workspace's first words: the grid barrier (2), the barriers across GPUs (1), combine_dx's claimed
// tiles (1), the weight gradients' (2); zeroed before each launch.
inline constexpr int kBarrierWords = 6;

// The forward's ring rows (one cycle over the most rows a rank can receive), and the backward's as a
// launch resolves them (Layer::ring_rows); mok::Error for a ring past int.
int forward_cycle_rows(const LayerConfig& c);
int resolved_ring_rows(const LayerConfig& c, const LaunchConfig& launch);

// The quantized weights' buffer of one GPU's `own_experts` and the shared expert (no bytes in bf16).
Fp8WeightLayout fp8_weight_layout(const LayerConfig& c, size_t own_experts);

}  // namespace mok::gpu
