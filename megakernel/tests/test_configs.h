// Configs the megakernel's tests share, and the workspace's section sizes as workspace_layout.cu lays them out.
#pragma once

#include <cstddef>

#include "mok/core/config.h"

namespace mok::gpu {

// c with every routing and expert branch on at once: sigmoid, group-limited routing with a routed
// scale, a shared expert, the clamped SwiGLU (E must be a multiple of 4: 4 groups).
inline LayerConfig with_every_branch(LayerConfig c) {
  c.score_mode = ScoreMode::sigmoid;
  c.n_group = 4;
  c.topk_group = 2;
  c.routed_scale = 2.5f;
  c.shared_intermediate = 64;
  c.swiglu_limit = 0.75f;
  return c;
}

// Every branch in the fp8 mode (H, I, Is multiples of 128): a shared expert whose last 128-row tile
// passes N = 80, two experts per rank.
inline LayerConfig fp8_every_branch() {
  LayerConfig c = with_every_branch(make_config(2, 40, 256, 128, 8, 3));
  c.shared_intermediate = 128;
  c.precision = Precision::fp8;
  return c;
}

// The workspace's sections are 256-byte aligned.
inline std::size_t aligned_section(std::size_t n) { return (n + 255) / 256 * 256; }
// An E4M3 matrix of the workspace or the weights' buffer and its table of exponents (exp_rows rows
// of them), as workspace_layout.cu lays them out.
inline std::size_t fp8_section_bytes(std::size_t rows, std::size_t cols, std::size_t exp_rows) {
  return aligned_section(rows * cols) + aligned_section(exp_rows * (cols / 128) * 4);
}
// The forward's E4M3 activations a backward given the weights, without recompute, lies over: xq, aq
// and shared_aq, their tables in whole 128-row tiles; P the GPU's padded rows, S its shared expert's
// (shared_rows_capacity).
inline std::size_t fp8_activation_bytes(const LayerConfig& c, std::size_t P, std::size_t S) {
  const std::size_t tiles_P = (P + 127) / 128 * 128, tiles_S = (S + 127) / 128 * 128;
  return fp8_section_bytes(P, c.hidden, tiles_P) + fp8_section_bytes(P, c.intermediate, tiles_P) +
         fp8_section_bytes(S, c.shared_intermediate, tiles_S);
}

}  // namespace mok::gpu
