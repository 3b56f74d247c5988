#include "mok/golden/locate.h"

#include <algorithm>
#include <cstdio>

namespace mok::golden {
namespace {

std::vector<int64_t> coordinates(const std::vector<int64_t>& shape, int64_t index) {
  std::vector<int64_t> c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = index % shape[d];
    index /= shape[d];
  }
  return c;
}

std::string token_terms(const LayerConfig& c, int64_t g) {
  return "rank " + std::to_string(g / c.tokens_per_rank) + ", token " + std::to_string(g % c.tokens_per_rank) +
         " (global " + std::to_string(g) + ")";
}

std::string expert_terms(const LayerConfig& c, int64_t e) {
  return "expert " + std::to_string(e) + " (rank " + std::to_string(e / c.experts_per_rank()) + ")";
}

// Row n of a [2I', H] first-layer weight: gate rows then up rows.
std::string gate_up_row(int64_t n, int64_t inter) {
  return n < inter ? "gate row " + std::to_string(n) : "up row " + std::to_string(n - inter);
}

std::string slot_terms(const GoldenCase& g, int64_t flat) {
  const LayerConfig& c = g.config;
  std::string s = token_terms(c, flat / c.top_k) + ", slot " + std::to_string(flat % c.top_k);
  if (const Tensor* idx = g.find("topk_idx")) s += ", " + expert_terms(c, int32_t(idx->bits(flat)));
  return s;
}

bool is_one_of(const std::string& name, std::initializer_list<const char*> names) {
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return name == n; });
}

}  // namespace

std::optional<int64_t> first_difference(const Tensor& want, const Tensor& got) {
  const size_t size = element_size(want.dtype);
  const auto mismatch = std::mismatch(want.bytes.begin(), want.bytes.end(), got.bytes.begin(), got.bytes.end());
  if (mismatch.first == want.bytes.end() && mismatch.second == got.bytes.end()) return std::nullopt;
  return int64_t(mismatch.first - want.bytes.begin()) / int64_t(size);
}

std::string element_name(const Tensor& t, int64_t index) {
  std::string s = t.name + "[";
  const std::vector<int64_t> c = coordinates(t.shape, index);
  for (size_t d = 0; d < c.size(); ++d) s += (d ? ", " : "") + std::to_string(c[d]);
  return s + "]";
}

std::string locate(const GoldenCase& g, const std::string& name, int64_t index) {
  const LayerConfig& c = g.config;
  const Tensor& t = g.tensor(name);
  const std::vector<int64_t> at = coordinates(t.shape, index);
  if (is_one_of(name, {"x", "dy", "y", "dx"})) return token_terms(c, at[0]) + ", column " + std::to_string(at[1]);
  if (is_one_of(name, {"router", "d_router"})) return expert_terms(c, at[0]) + ", column " + std::to_string(at[1]);
  if (is_one_of(name, {"expert_bias", "counts"})) return expert_terms(c, at[0]);
  if (name == "offsets")
    return at[0] < c.experts ? "first layout row of " + expert_terms(c, at[0]) : "end of the layout (offsets[E])";
  if (is_one_of(name, {"w1", "d_w1"}))
    return expert_terms(c, at[0]) + ", " + gate_up_row(at[1], c.intermediate) + ", column " + std::to_string(at[2]);
  if (is_one_of(name, {"w2", "d_w2"}))
    return expert_terms(c, at[0]) + ", row " + std::to_string(at[1]) + ", column " + std::to_string(at[2]);
  if (is_one_of(name, {"shared_w1", "d_shared_w1"}))
    return "shared expert, " + gate_up_row(at[0], c.shared_intermediate) + ", column " + std::to_string(at[1]);
  if (is_one_of(name, {"shared_w2", "d_shared_w2"}))
    return "shared expert, row " + std::to_string(at[0]) + ", column " + std::to_string(at[1]);
  if (is_one_of(name, {"topk_idx", "topk_w", "d_topk_w", "given_topk_idx", "given_topk_w", "slot_row"}))
    return slot_terms(g, index);
  if (is_one_of(name, {"logits", "d_logits"})) return token_terms(c, at[0]) + ", expert " + std::to_string(at[1]);
  if (name == "row_source") {
    std::string s = "layout row " + std::to_string(index);
    if (const Tensor* offsets = g.find("offsets")) {
      const std::vector<int32_t> o = i32_values(*offsets);
      const int64_t e = std::upper_bound(o.begin(), o.end() - 1, int32_t(index)) - o.begin() - 1;
      if (e >= 0) s += ": " + expert_terms(c, e) + ", its row " + std::to_string(index - o[e]);
    }
    const int32_t serves = int32_t(t.bits(index));
    if (serves >= 0 && serves < c.routed_rows()) s += ", serving " + slot_terms(g, serves);
    return s;
  }
  return element_name(t, index);
}

std::string describe_bits(DType dtype, uint32_t bits) {
  char buf[64];
  if (dtype == DType::bf16)
    std::snprintf(buf, sizeof buf, "0x%04x (%.9g)", bits, double(to_float(bf16{uint16_t(bits)})));
  else if (dtype == DType::f32)
    std::snprintf(buf, sizeof buf, "0x%08x (%.9g)", bits, double(float_of(bits)));
  else
    std::snprintf(buf, sizeof buf, "0x%08x (%d)", bits, int32_t(bits));
  return buf;
}

}  // namespace mok::golden
