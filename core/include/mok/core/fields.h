// The one list of the fields of Forward, Gradients and LayerConfig, by name (host code only).
//
//   for_each_field(fwd, f)        calls f("y", fwd.y) for every tensor of a Forward, in this order;
//   for_each_field(a, b, f)       calls f("y", a.y, b.y): two of the same struct side by side;
// the same for Gradients, and for LayerConfig's scalar fields. Names are those of the golden files
// (format v1: /routing/..., /outputs/..., /config attributes); h, shared_h and shared_a are not
// stored in goldens. A new field is added here once, and every user sees it.
//
// Bitwise comparison, shared by every consumer that compares results bit for bit:
//   raw_bits(v)                     an element's bits as one word (what "bit for bit" compares);
//   show_element(v)                 an element for a message: bits and value ("0x3f80 (0x1p+0)");
//   first_bit_mismatch(name, a, b)  the first element whose bits differ, both values in hex, or "".
//   first_field_mismatch(a, b)      the same over every field of two Forwards (or Gradients), or "".
//   first_step_mismatch(...)        the same over two steps' Forward, then their Gradients.
//   first_poisoned_field(s)         the first element of any field that holds the GPU tools' poison, or "".
#pragma once

#include <concepts>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "mok/core/bf16.h"
#include "mok/core/config.h"
#include "mok/core/layer_io.h"

namespace mok {

template <class S, class T>
concept FieldsOf = std::same_as<std::remove_const_t<S>, T>;

namespace detail {

template <class F, class... S>
void forward_fields(F&& f, S&... s) {
  f("topk_idx", s.routing.topk_idx...);
  f("topk_w", s.routing.topk_w...);
  f("logits", s.logits...);
  f("counts", s.layout.counts...);
  f("offsets", s.layout.offsets...);
  f("row_source", s.layout.row_source...);
  f("slot_row", s.layout.slot_row...);
  f("y", s.y...);
  f("h", s.h...);
  f("shared_h", s.shared_h...);
  f("shared_a", s.shared_a...);
}

template <class F, class... S>
void gradient_fields(F&& f, S&... s) {
  f("dx", s.dx...);
  f("d_topk_w", s.d_topk_w...);
  f("d_logits", s.d_logits...);
  f("d_router", s.d_router...);
  f("d_w1", s.d_w1...);
  f("d_w2", s.d_w2...);
  f("d_shared_w1", s.d_shared_w1...);
  f("d_shared_w2", s.d_shared_w2...);
}

// In the order of the struct and of a golden file's /config attributes.
template <class F, class... S>
void config_fields(F&& f, S&... s) {
  f("ranks", s.ranks...);
  f("tokens_per_rank", s.tokens_per_rank...);
  f("experts", s.experts...);
  f("hidden", s.hidden...);
  f("intermediate", s.intermediate...);
  f("top_k", s.top_k...);
  f("score_mode", s.score_mode...);
  f("renormalize", s.renormalize...);
  f("n_group", s.n_group...);
  f("topk_group", s.topk_group...);
  f("routed_scale", s.routed_scale...);
  f("swiglu_limit", s.swiglu_limit...);
  f("shared_intermediate", s.shared_intermediate...);
  f("precision", s.precision...);
}

}  // namespace detail

template <FieldsOf<Forward> S, class F>
void for_each_field(S& s, F&& f) {
  detail::forward_fields(f, s);
}
template <FieldsOf<Forward> A, FieldsOf<Forward> B, class F>
void for_each_field(A& a, B& b, F&& f) {
  detail::forward_fields(f, a, b);
}

template <FieldsOf<Gradients> S, class F>
void for_each_field(S& s, F&& f) {
  detail::gradient_fields(f, s);
}
template <FieldsOf<Gradients> A, FieldsOf<Gradients> B, class F>
void for_each_field(A& a, B& b, F&& f) {
  detail::gradient_fields(f, a, b);
}

template <FieldsOf<LayerConfig> S, class F>
void for_each_field(S& s, F&& f) {
  detail::config_fields(f, s);
}
template <FieldsOf<LayerConfig> A, FieldsOf<LayerConfig> B, class F>
void for_each_field(A& a, B& b, F&& f) {
  detail::config_fields(f, a, b);
}

// Bits, not values: -0 differs from +0 and a NaN from a NaN with another payload.
inline uint32_t raw_bits(bf16 v) { return v.bits; }
inline uint32_t raw_bits(float v) { return bits_of(v); }
inline uint32_t raw_bits(int32_t v) { return uint32_t(v); }

// Floats as their bits and their value in hex-float notation, which is exact: "0x3f80 (0x1p+0)".
inline std::string show_element(bf16 v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "0x%04x (%a)", unsigned(v.bits), double(to_float(v)));
  return buf;
}
inline std::string show_element(float v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "0x%08x (%a)", unsigned(bits_of(v)), double(v));
  return buf;
}
inline std::string show_element(int32_t v) { return std::to_string(v); }

// The first element whose bits differ, as "name[i]: 0x.. vs 0x.." (a's value first), or "" when both
// hold the same bits; a differing size is reported as such.
template <class T>
std::string first_bit_mismatch(const std::string& name, const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return name + ": " + std::to_string(a.size()) + " elements vs " + std::to_string(b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (raw_bits(a[i]) != raw_bits(b[i])) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "[%zu]: 0x%0*x vs 0x%0*x", i, int(2 * sizeof(T)), unsigned(raw_bits(a[i])),
                    int(2 * sizeof(T)), unsigned(raw_bits(b[i])));
      return name + buf;
    }
  return "";
}

// The first element whose bytes are all 0xff (bf16 0xffff, fp32 0xffffffff, an index -1), as
// "name[i]", or "": the GPU tools poison every output so before a launch, so this is an element no
// launch wrote, on which two GPU runs would agree. No layer output of finite inputs holds it: bf16 NaNs
// are the canonical 0x7fc0 (to_bf16), fp32 NaNs the canonical 0x7fffffff (host_device.h), and the
// tables hold no -1.
template <class T>
std::string first_poisoned(const std::string& name, const std::vector<T>& v) {
  constexpr uint32_t kPoison = sizeof(T) == 2 ? 0xffffu : 0xffffffffu;
  for (size_t i = 0; i < v.size(); ++i)
    if (raw_bits(v[i]) == kPoison) return name + "[" + std::to_string(i) + "]";
  return "";
}

// first_bit_mismatch of each field of a and b (a Forward or Gradients), in for_each_field's order: the first
// difference, or "".
template <class S>
std::string first_field_mismatch(const S& a, const S& b) {
  std::string found;
  for_each_field(a, b, [&](const char* name, const auto& u, const auto& v) {
    if (found.empty()) found = first_bit_mismatch(name, u, v);
  });
  return found;
}

// first_field_mismatch of two steps: their Forwards first, then their Gradients; "" when every field agrees.
inline std::string first_step_mismatch(const Forward& fwd_a, const Gradients& grads_a, const Forward& fwd_b,
                                       const Gradients& grads_b) {
  const std::string diff = first_field_mismatch(fwd_a, fwd_b);
  return diff.empty() ? first_field_mismatch(grads_a, grads_b) : diff;
}

// first_poisoned of each field of s (a Forward or Gradients), in for_each_field's order, or "".
template <class S>
std::string first_poisoned_field(const S& s) {
  std::string found;
  for_each_field(s, [&](const char* name, const auto& v) {
    if (found.empty()) found = first_poisoned(name, v);
  });
  return found;
}

}  // namespace mok
