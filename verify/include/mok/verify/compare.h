// The comparison engine: a candidate's tensors against a golden's, element by element, in bits,
// ULPs and float error, with the first mismatch located in layer terms.
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "mok/golden/golden.h"

namespace mok::verify {

// ULP distance buckets: [0] = 0, [b] = 2^(b-1) .. 2^b - 1 for b = 1..32, [33] = NaN against another value.
inline constexpr int kUlpBuckets = 34;
inline constexpr int kNanBucket = kUlpBuckets - 1;

std::string ulp_bucket_label(int bucket);  // "0", "1", "2-3", "4-7", ..., "nan"

// Distance in units in the last place between two values of one float dtype, counted along the
// ordered line of finite values and infinities (+0 and -0 are 0 apart). nullopt when exactly one is
// NaN or both are NaN with other bits.
std::optional<uint64_t> ulp_distance(golden::DType dtype, uint32_t a, uint32_t b);

struct Mismatch {
  int64_t index = 0;
  std::string element;   // "y[37, 12]"
  std::string location;  // "rank 1, token 5 (global 37), column 12"
  uint32_t golden_bits = 0;
  uint32_t candidate_bits = 0;
};

struct TensorReport {
  std::string name;
  golden::Group group = golden::Group::outputs;
  golden::DType dtype = golden::DType::f32;
  std::vector<int64_t> shape;
  std::string absent;  // non-empty: the candidate lacks the tensor or has another dtype/shape (why)
  int64_t elements = 0;
  int64_t equal = 0;                                 // bitwise equal elements
  uint64_t max_ulp = 0;                              // floats: the largest finite ULP distance
  double max_abs = 0.0;                              // max |candidate - golden| (ints: as integers)
  double max_rel = 0.0;                              // max |candidate - golden| / |golden| over nonzero golden elements
  double norm_rel = 0.0;                             // ||candidate - golden||_2 / ||golden||_2 (0/0 counts as 0)
  std::array<int64_t, kUlpBuckets> ulp_histogram{};  // floats only
  std::optional<Mismatch> first_mismatch;
  std::optional<golden::OracleAccuracy> oracle;  // the golden's, where stored

  bool bitwise_equal() const { return absent.empty() && equal == elements; }
  // ||candidate - fp64|| / ||fp64|| is at most the golden's oracle error plus norm_rel (triangle
  // inequality, to first order): within the documented bound or not. nullopt without oracle data.
  std::optional<bool> within_oracle_bound() const;
};

struct CaseReport {
  std::string golden_file;
  std::string golden_name;
  std::string candidate;    // a file path or a backend's name
  std::string config_note;  // non-empty when the candidate file's config differs (tensors are global)
  double seconds = 0.0;     // the candidate's run time (backends), 0 for files
  std::vector<TensorReport> tensors;
  // Non-empty: a forward-only run (RunResults::gradients_skipped) and why; skipped_tensors then names the
  // golden's gradient tensors it did not compute, which are not compared (nor in `tensors`), and
  // equal() speaks for the forward. Empty (and skipped_tensors too) for every whole run.
  std::string backward_skipped;
  std::vector<std::string> skipped_tensors;

  bool equal() const;
  int differing_tensors() const;
};

// Compares one tensor (the golden's) with the candidate's of the same name (nullptr: absent).
TensorReport compare_tensor(const golden::GoldenCase& golden, golden::Group group, const golden::Tensor& want,
                            const golden::Tensor* got);

// Told of each golden tensor before it is compared: the tensor, its number (from 1) and the count.
using CompareProgress = std::function<void(const golden::Tensor& tensor, size_t number, size_t count)>;

// Every tensor of the golden's routing and outputs groups (and inputs when include_inputs) against
// the candidate's tensors of the same names. progress may be empty.
std::vector<TensorReport> compare_tensors(const golden::GoldenCase& golden,
                                          const std::vector<golden::Tensor>& candidate, bool include_inputs,
                                          const CompareProgress& progress = {});

// Whether a results tensor is a gradient, the backward's (dx, d_topk_w, d_logits, d_router, d_w1, d_w2,
// d_shared_w1, d_shared_w2: mok/core/fields.h); the routing group and y are the forward's.
bool is_gradient(const std::string& name);

// A backend's run against the golden: the golden's routing and outputs against the run's tensors of the
// same names (compare_tensors without inputs), into a report whose tensors, backward_skipped and
// skipped_tensors are set (the caller names the files and the candidate). With gradients_skipped (a
// forward-only run), each gradient tensor the run lacks is listed in skipped_tensors instead of
// compared and the reason kept in backward_skipped; a forward tensor the run lacks is absent, a
// mismatch, as is any tensor it lacks without that reason; a gradient it has is compared.
CaseReport compare_run(const golden::GoldenCase& golden, const golden::LayerResults& run,
                       const std::optional<std::string>& gradients_skipped, const CompareProgress& progress = {});

}  // namespace mok::verify
