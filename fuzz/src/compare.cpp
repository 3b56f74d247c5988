#include "mok/fuzz/compare.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

namespace mok::fuzz {
namespace {

uint32_t raw_bits(bf16 v) { return v.bits; }
uint32_t raw_bits(float v) { return bits_of(v); }
uint32_t raw_bits(int32_t v) { return uint32_t(v); }

std::vector<int> iota_rows(size_t n) {
  std::vector<int> rows(n);
  std::iota(rows.begin(), rows.end(), 0);
  return rows;
}

}  // namespace

std::string show_element(bf16 v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "0x%04x (%a)", unsigned(v.bits), double(to_float(v)));
  return buf;
}

std::string show_element(float v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "0x%08x (%a)", unsigned(bits_of(v)), double(v));
  return buf;
}

std::string show_element(int32_t v) { return std::to_string(v); }

template <class T>
Verdict compare_rows(const std::string& name, const std::vector<T>& a, const std::vector<T>& b, int width,
                     const std::vector<int>& rows_a, const std::vector<int>& rows_b) {
  if (a.empty() && b.empty()) return std::nullopt;
  const auto fits = [width](const std::vector<T>& v, const std::vector<int>& rows) {
    return std::all_of(rows.begin(), rows.end(), [&](int r) { return r >= 0 && size_t(r + 1) * width <= v.size(); });
  };
  if (!fits(a, rows_a) || !fits(b, rows_b))
    return name + ": " + std::to_string(a.size()) + " and " + std::to_string(b.size()) +
           " elements, too few for rows of " + std::to_string(width);
  for (size_t i = 0; i < rows_a.size(); ++i)
    for (int col = 0; col < width; ++col) {
      const T va = a[size_t(rows_a[i]) * width + col], vb = b[size_t(rows_b[i]) * width + col];
      if (raw_bits(va) == raw_bits(vb)) continue;
      const std::string where = rows_a[i] == rows_b[i] ? std::to_string(rows_a[i])
                                                       : std::to_string(rows_a[i]) + " / " + std::to_string(rows_b[i]);
      return name + "[" + where + ", " + std::to_string(col) + "]: " + show_element(va) + " vs " + show_element(vb);
    }
  return std::nullopt;
}

template <class T>
Verdict compare_bits(const std::string& name, const std::vector<T>& a, const std::vector<T>& b, int width) {
  if (a.size() != b.size())
    return name + ": " + std::to_string(a.size()) + " vs " + std::to_string(b.size()) + " elements";
  if (width == 0 || a.empty()) return std::nullopt;
  const std::vector<int> rows = iota_rows(a.size() / width);
  return compare_rows(name, a, b, width, rows, rows);
}

template Verdict compare_rows(const std::string&, const std::vector<bf16>&, const std::vector<bf16>&, int,
                              const std::vector<int>&, const std::vector<int>&);
template Verdict compare_rows(const std::string&, const std::vector<float>&, const std::vector<float>&, int,
                              const std::vector<int>&, const std::vector<int>&);
template Verdict compare_rows(const std::string&, const std::vector<int32_t>&, const std::vector<int32_t>&, int,
                              const std::vector<int>&, const std::vector<int>&);
template Verdict compare_bits(const std::string&, const std::vector<bf16>&, const std::vector<bf16>&, int);
template Verdict compare_bits(const std::string&, const std::vector<float>&, const std::vector<float>&, int);
template Verdict compare_bits(const std::string&, const std::vector<int32_t>&, const std::vector<int32_t>&, int);

Verdict compare_forward(const LayerConfig& c, const ref::Forward& a, const ref::Forward& b, bool activations) {
  const int k = c.top_k, E = c.experts, H = c.hidden, I = c.intermediate, Is = c.shared_intermediate;
  if (auto v = compare_bits("topk_idx", a.routing.topk_idx, b.routing.topk_idx, k)) return v;
  if (auto v = compare_bits("topk_w", a.routing.topk_w, b.routing.topk_w, k)) return v;
  if (auto v = compare_bits("logits", a.logits, b.logits, E)) return v;
  if (auto v = compare_bits("counts", a.layout.counts, b.layout.counts, 1)) return v;
  if (auto v = compare_bits("offsets", a.layout.offsets, b.layout.offsets, 1)) return v;
  if (auto v = compare_bits("row_source", a.layout.row_source, b.layout.row_source, 1)) return v;
  if (auto v = compare_bits("slot_row", a.layout.slot_row, b.layout.slot_row, 1)) return v;
  if (auto v = compare_bits("y", a.y, b.y, H)) return v;
  if (activations) {
    if (auto v = compare_bits("h", a.h, b.h, 2 * I)) return v;
    if (auto v = compare_bits("a", a.a, b.a, I)) return v;
  }
  if (auto v = compare_bits("shared_h", a.shared_h, b.shared_h, 2 * Is)) return v;
  return compare_bits("shared_a", a.shared_a, b.shared_a, Is);
}

Verdict compare_gradients(const LayerConfig& c, const ref::Gradients& a, const ref::Gradients& b) {
  const int k = c.top_k, E = c.experts, H = c.hidden, I = c.intermediate, Is = c.shared_intermediate;
  if (auto v = compare_bits("dx", a.dx, b.dx, H)) return v;
  if (auto v = compare_bits("d_topk_w", a.d_topk_w, b.d_topk_w, k)) return v;
  if (auto v = compare_bits("d_logits", a.d_logits, b.d_logits, E)) return v;
  if (auto v = compare_bits("d_router", a.d_router, b.d_router, H)) return v;
  if (auto v = compare_bits("d_w1", a.d_w1, b.d_w1, H)) return v;
  if (auto v = compare_bits("d_w2", a.d_w2, b.d_w2, I)) return v;
  if (auto v = compare_bits("d_shared_w1", a.d_shared_w1, b.d_shared_w1, H)) return v;
  return compare_bits("d_shared_w2", a.d_shared_w2, b.d_shared_w2, Is);
}

}  // namespace mok::fuzz
