#include "mok/fuzz/compare.h"

#include <algorithm>
#include <iterator>
#include <numeric>
#include <string_view>
#include <utility>

#include "mok/core/fields.h"

namespace mok::fuzz {
namespace {

std::vector<int> iota_rows(size_t n) {
  std::vector<int> rows(n);
  std::iota(rows.begin(), rows.end(), 0);
  return rows;
}

// The row width of a Forward or Gradients field in this config, for the "name[row, column]" of a
// mismatch: a token's (or a weight's) row, one element for the layout tables. The field list itself
// is fields.h's; a field added there without a width here is an internal error on the first compare.
int width_of(std::string_view name, const LayerConfig& c) {
  const int k = c.top_k, E = c.experts, H = c.hidden, I = c.intermediate, Is = c.shared_intermediate;
  const std::pair<std::string_view, int> widths[] = {
      {"topk_idx", k},   {"topk_w", k},   {"logits", E},      {"counts", 1},      {"offsets", 1},
      {"row_source", 1}, {"slot_row", 1}, {"y", H},           {"h", 2 * I},       {"shared_h", 2 * Is},
      {"shared_a", Is},  {"dx", H},       {"d_topk_w", k},    {"d_logits", E},    {"d_router", H},
      {"d_w1", H},       {"d_w2", I},     {"d_shared_w1", H}, {"d_shared_w2", Is}};
  const auto* it = std::find_if(std::begin(widths), std::end(widths), [&](const auto& w) { return w.first == name; });
  if (it == std::end(widths)) fail_internal("fuzz compare: no row width for the field " + std::string(name));
  return it->second;
}

// The first field of a and b, in for_each_field's order, whose bits differ or that holds the GPU
// tools' poison (first_poisoned: an element neither run wrote); fields that `skip` names are left out.
template <class Result, class Skip>
Verdict first_differing_field(const LayerConfig& c, const Result& a, const Result& b, Skip skip) {
  Verdict verdict;
  for_each_field(a, b, [&](const char* name, const auto& field_a, const auto& field_b) {
    if (verdict || skip(std::string_view(name))) return;
    verdict = compare_bits(name, field_a, field_b, width_of(name, c));
    if (const std::string at = first_poisoned(name, field_a); !verdict && !at.empty())
      verdict = at + " holds the poison (every byte 0xff): no run wrote it";
  });
  return verdict;
}

// A run's y and dx: every run has them, N x H. Two empty tensors would compare equal.
Verdict lacks_tokens(const LayerConfig& c, const char* name, size_t elements) {
  const size_t want = size_t(c.tokens()) * size_t(c.hidden);
  if (elements == want) return std::nullopt;
  return std::string(name) + ": " + std::to_string(elements) + " elements, expected " + std::to_string(want);
}

}  // namespace

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
  // h, and the shared expert's h and a, are saved activations: a run that recomputes them has none to compare.
  if (auto v = lacks_tokens(c, "y", a.y.size())) return v;
  if (auto v = lacks_tokens(c, "y (second run)", b.y.size())) return v;
  return first_differing_field(c, a, b, [activations](std::string_view name) {
    return !activations && (name == "h" || name == "shared_h" || name == "shared_a");
  });
}

Verdict compare_gradients(const LayerConfig& c, const ref::Gradients& a, const ref::Gradients& b) {
  if (auto v = lacks_tokens(c, "dx", a.dx.size())) return v;
  if (auto v = lacks_tokens(c, "dx (second run)", b.dx.size())) return v;
  return first_differing_field(c, a, b, [](std::string_view) { return false; });
}

}  // namespace mok::fuzz
