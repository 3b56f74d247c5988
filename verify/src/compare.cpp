#include "mok/verify/compare.h"

#include <bit>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

#include "mok/core/fields.h"
#include "mok/golden/locate.h"

namespace mok::verify {
namespace {

using golden::DType;
using golden::Tensor;

double value_of(DType dtype, uint32_t bits) {
  if (dtype == DType::bf16) return to_float(bf16{uint16_t(bits)});
  if (dtype == DType::f32) return float_of(bits);
  return int32_t(bits);
}

// Float bits -> a signed position on the ordered line of values (+0 and -0 both at 0).
int64_t ordered(DType dtype, uint32_t bits) {
  const uint32_t sign = dtype == DType::bf16 ? 0x8000u : 0x80000000u;
  const int64_t magnitude = bits & (sign - 1);
  return bits & sign ? -magnitude : magnitude;
}

bool is_nan(DType dtype, uint32_t bits) {
  return dtype == DType::bf16 ? (bits & 0x7fffu) > 0x7f80u : (bits & 0x7fffffffu) > 0x7f800000u;
}

int bucket_of(uint64_t distance) { return distance == 0 ? 0 : int(std::bit_width(distance)); }

// The candidate's tensor of that name (the last, should it hold several), or nullptr.
const Tensor* find_tensor(const std::vector<Tensor>& candidate, const std::string& name) {
  const Tensor* got = nullptr;
  for (const Tensor& t : candidate)
    if (t.name == name) got = &t;
  return got;
}

using Groups = std::vector<std::pair<golden::Group, const std::vector<Tensor>*>>;

// The golden's tensors of `groups` against the candidate's, each unless `skip` (may be empty) says
// to leave it out; progress counts the tensors compared.
std::vector<TensorReport> compare_groups(const golden::GoldenCase& golden, const Groups& groups,
                                         const std::vector<Tensor>& candidate, const CompareProgress& progress,
                                         const std::function<bool(const Tensor& want, const Tensor* got)>& skip) {
  std::vector<std::tuple<golden::Group, const Tensor*, const Tensor*>> todo;
  for (const auto& [group, tensors] : groups)
    for (const Tensor& want : *tensors) {
      const Tensor* got = find_tensor(candidate, want.name);
      if (!skip || !skip(want, got)) todo.emplace_back(group, &want, got);
    }
  std::vector<TensorReport> reports;
  for (const auto& [group, want, got] : todo) {
    if (progress) progress(*want, reports.size() + 1, todo.size());
    reports.push_back(compare_tensor(golden, group, *want, got));
  }
  return reports;
}

}  // namespace

std::string ulp_bucket_label(int bucket) {
  if (bucket == kNanBucket) return "nan";
  if (bucket <= 1) return std::to_string(bucket);
  return std::to_string(uint64_t(1) << (bucket - 1)) + "-" + std::to_string((uint64_t(1) << bucket) - 1);
}

std::optional<uint64_t> ulp_distance(DType dtype, uint32_t a, uint32_t b) {
  if (is_nan(dtype, a) || is_nan(dtype, b)) return a == b ? std::optional<uint64_t>(0) : std::nullopt;
  const int64_t d = ordered(dtype, a) - ordered(dtype, b);
  return uint64_t(d < 0 ? -d : d);
}

std::optional<bool> TensorReport::within_oracle_bound() const {
  if (!oracle || !absent.empty()) return std::nullopt;
  return oracle->rel_error + norm_rel <= oracle->bound;
}

bool CaseReport::equal() const { return differing_tensors() == 0; }

int CaseReport::differing_tensors() const {
  int n = 0;
  for (const TensorReport& t : tensors) n += !t.bitwise_equal();
  return n;
}

TensorReport compare_tensor(const golden::GoldenCase& golden, golden::Group group, const Tensor& want,
                            const Tensor* got) {
  TensorReport r;
  r.name = want.name;
  r.group = group;
  r.dtype = want.dtype;
  r.shape = want.shape;
  r.elements = want.elements();
  if (const auto o = golden.oracle.find(want.name); o != golden.oracle.end()) r.oracle = o->second;
  if (!got) {
    r.absent = "the candidate has no tensor " + want.name;
    return r;
  }
  if (got->dtype != want.dtype || got->shape != want.shape || got->bytes.size() != want.bytes.size()) {
    r.absent = "the candidate's " + want.name + " is " + golden::to_string(got->dtype) + " of another shape";
    return r;
  }
  const bool is_float = want.dtype != DType::i32;
  double diff_squares = 0.0, golden_squares = 0.0;
  for (int64_t i = 0; i < r.elements; ++i) {
    const uint32_t a = want.bits(i), b = got->bits(i);
    const double va = value_of(want.dtype, a);
    if (is_float) golden_squares += va * va;
    if (a == b) {
      ++r.equal;
      if (is_float) ++r.ulp_histogram[0];
      continue;
    }
    if (!r.first_mismatch)
      r.first_mismatch = Mismatch{i, golden::element_name(want, i), golden::locate(golden, want.name, i), a, b};
    const double vb = value_of(want.dtype, b);
    const double abs_diff =
        std::isnan(va) || std::isnan(vb) ? std::numeric_limits<double>::infinity() : std::fabs(vb - va);
    r.max_abs = std::max(r.max_abs, abs_diff);
    if (!is_float) continue;
    diff_squares += abs_diff * abs_diff;
    if (va != 0.0) r.max_rel = std::max(r.max_rel, abs_diff / std::fabs(va));
    const std::optional<uint64_t> ulp = ulp_distance(want.dtype, a, b);
    ++r.ulp_histogram[ulp ? bucket_of(*ulp) : kNanBucket];
    if (ulp) r.max_ulp = std::max(r.max_ulp, *ulp);
  }
  if (diff_squares > 0.0)
    r.norm_rel =
        golden_squares > 0.0 ? std::sqrt(diff_squares / golden_squares) : std::numeric_limits<double>::infinity();
  return r;
}

std::vector<TensorReport> compare_tensors(const golden::GoldenCase& golden, const std::vector<Tensor>& candidate,
                                          bool include_inputs, const CompareProgress& progress) {
  Groups groups;
  if (include_inputs) groups.emplace_back(golden::Group::inputs, &golden.inputs);
  groups.emplace_back(golden::Group::routing, &golden.results.routing);
  groups.emplace_back(golden::Group::outputs, &golden.results.outputs);
  return compare_groups(golden, groups, candidate, progress, {});
}

bool is_gradient(const std::string& name) {
  static const Gradients fields;
  bool found = false;
  for_each_field(fields, [&](const char* field, const auto&) { found = found || name == field; });
  return found;
}

CaseReport compare_run(const golden::GoldenCase& golden, const golden::LayerResults& run,
                       const std::optional<std::string>& gradients_skipped, const CompareProgress& progress) {
  std::vector<Tensor> candidate = run.routing;
  candidate.insert(candidate.end(), run.outputs.begin(), run.outputs.end());
  CaseReport r;
  const auto skip = [&](const Tensor& want, const Tensor* got) {
    if (got || !gradients_skipped || !is_gradient(want.name)) return false;
    r.skipped_tensors.push_back(want.name);
    return true;
  };
  r.tensors = compare_groups(
      golden, {{golden::Group::routing, &golden.results.routing}, {golden::Group::outputs, &golden.results.outputs}},
      candidate, progress, skip);
  if (!r.skipped_tensors.empty())
    r.backward_skipped = gradients_skipped->empty() ? "the backend gave no reason" : *gradients_skipped;
  return r;
}

}  // namespace mok::verify
