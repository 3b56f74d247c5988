// Golden format v1: one MoE layer problem, its inputs and the reference's bits, in one HDF5 file
// (docs/golden-format.md). This header is the whole read/write API: build a GoldenCase by running
// the reference (make_case), write it atomically (write_golden), read it back validated (read_golden).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mok/core/bf16.h"
#include "mok/core/config.h"
#include "mok/reference/layer.h"
#include "mok/reference/problem.h"

namespace mok::golden {

inline constexpr int32_t kFormatVersion = 1;
// The numerics model the bits belong to. Bump it whenever any output bit of the reference may change
// (a rounding in core/, the data flow of reference/, or make_problem's values): goldens of another
// numerics version are refused on reading and must be regenerated.
inline constexpr int32_t kNumericsModelVersion = 1;

enum class DType : uint8_t { bf16 = 0, f32 = 1, i32 = 2 };

std::string to_string(DType dtype);
size_t element_size(DType dtype);  // bytes: 2, 4, 4

struct Tensor {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // the elements in C order, each little-endian

  int64_t elements() const;
  uint32_t bits(int64_t i) const;  // element i's raw bits (a bf16 in the low 16 bits)
};

Tensor make_tensor(std::string name, std::vector<int64_t> shape, const std::vector<bf16>& values);
Tensor make_tensor(std::string name, std::vector<int64_t> shape, const std::vector<float>& values);
Tensor make_tensor(std::string name, std::vector<int64_t> shape, const std::vector<int32_t>& values);

// The values, for a tensor of that dtype (mok::Error otherwise).
std::vector<bf16> bf16_values(const Tensor& t);
std::vector<float> f32_values(const Tensor& t);
std::vector<int32_t> i32_values(const Tensor& t);

// Every dataset of a golden of this config, in file order: group, name, dtype and shape.
// routing_given: the inputs hold a routing to replay (no router: no logits, d_logits, d_router).
enum class Group : uint8_t { inputs = 0, routing = 1, outputs = 2 };

struct TensorSpec {
  Group group;
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

std::string to_string(Group group);
std::vector<TensorSpec> tensor_specs(const LayerConfig& config, bool routing_given);

// How make_problem made the inputs, so that a golden can be regenerated from scratch.
struct Recipe {
  uint64_t seed = 1;
  ref::RoutingKind routing = ref::RoutingKind::router;
  double zipf_s = 1.2;
};

// What a run of the layer produces: the routing group and the outputs group of a golden.
//   routing: topk_idx, topk_w, [logits], counts, offsets, row_source, slot_row
//   outputs: y, dx, d_topk_w, [d_logits, d_router], d_w1, d_w2, [d_shared_w1, d_shared_w2]
// Bracketed tensors exist only with the router (not a given routing) or with a shared expert.
struct LayerResults {
  std::vector<Tensor> routing;
  std::vector<Tensor> outputs;
};

// The golden's accuracy against the fp64 oracle (reference/oracle.h) for one result tensor:
// rel_error = ||golden - fp64|| / ||fp64|| as measured, bound = the documented bound it must meet.
struct OracleAccuracy {
  double rel_error = 0.0;
  double bound = 0.0;
};

// A case's name is printed in every report and names its file, NAME.h5 in a golden directory:
// printable ASCII without spaces, no '/', '\' or "..", at most kMaxCaseNameBytes (mok::Error naming
// `where` otherwise: a name read from a file could otherwise write escape codes or fake report lines
// to a terminal, and `check --name ../x` read a file outside DIR). The one rule of every name: case
// files, goldens written and read, and the tool's --name.
inline constexpr size_t kMaxCaseNameBytes = 128;  // NAME.h5 and its temporary well within NAME_MAX (255)
void validate_case_name(const std::string& name, const std::string& where);

struct GoldenCase {
  std::string name;
  std::string description;  // free text: what the case covers, or why a fuzz repro was written
  LayerConfig config;
  ref::Options options;
  std::optional<Recipe> recipe;  // absent when the inputs were given as they are (a fuzz repro)
  // x, dy, router, [expert_bias: sigmoid mode], w1, w2, [shared_w1, shared_w2], [given_topk_idx, given_topk_w]
  std::vector<Tensor> inputs;
  LayerResults results;
  // Per result tensor the oracle covers (logits, topk_w and the float outputs); empty where no oracle ran.
  std::map<std::string, OracleAccuracy> oracle;
  int32_t format_version = kFormatVersion;
  int32_t numerics_version = kNumericsModelVersion;
  std::string generator;  // the revision of the program that made the bits

  bool routing_given() const;                           // the inputs hold a routing to replay
  const Tensor* find(const std::string& name) const;    // any group; nullptr if absent
  const Tensor& tensor(const std::string& name) const;  // any group; mok::Error if absent
};

// The revision of this build (project version and git describe at configure time).
std::string generator_revision();

// The input tensors of a problem. In sigmoid mode an empty expert_bias is stored as zeros (the same
// selection); in softmax mode the bias is unused and not stored.
std::vector<Tensor> input_tensors(const ref::Problem& problem);

// The problem that a case's inputs describe.
ref::Problem problem_of(const GoldenCase& golden);

// The results group of a forward and backward on the problem (any implementation's).
LayerResults results_of(const ref::Problem& problem, const Forward& forward, const Gradients& gradients);
// The results of a forward alone (an implementation that runs no backward for this config): the
// routing group whole, and of the outputs group the forward's tensor (y) only; no gradient.
LayerResults forward_results_of(const ref::Problem& problem, const Forward& forward);

// Runs the reference forward and backward on the problem (options.fault must be Fault::none).
LayerResults run_reference(const ref::Problem& problem, const ref::Options& options);

// A case from explicit inputs (recipe unset), and one from make_problem's recipe: both run the
// reference and the fp64 oracle (filling GoldenCase::oracle).
GoldenCase make_case(const std::string& name, const ref::Problem& problem, const ref::Options& options);
GoldenCase make_case(const std::string& name, const LayerConfig& config, const ref::Options& options,
                     const Recipe& recipe);

// The golden recomputed by this build: inputs from its recipe (or as stored when it has none), then
// the reference's routing and outputs. Metadata is copied; the oracle is not rerun.
GoldenCase regenerate(const GoldenCase& golden);

// Writes to a temporary file in the same directory, then renames it over path: a reader sees the old
// file or the whole new one, never a part. Throws mok::Error naming the file and dataset.
void write_golden(const std::filesystem::path& path, const GoldenCase& golden);

// Reads and validates: the seal, the HDF5 metadata of every object it opens (before libhdf5 decodes it:
// a file edited and sealed again crashed the library), format and numerics versions, config, every
// expected dataset's presence, dtype, shape, storage and SHA-256. Throws mok::Error naming the file,
// the dataset and the problem.
GoldenCase read_golden(const std::filesystem::path& path);

std::string to_string(StepModel step);
StepModel step_model_from_string(const std::string& name);  // throws mok::Error
std::string to_string(ScoreMode mode);
ScoreMode score_mode_from_string(const std::string& name);  // throws mok::Error
std::string to_string(Precision precision);
Precision precision_from_string(const std::string& name);  // throws mok::Error

}  // namespace mok::golden
