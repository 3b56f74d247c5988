// Tensors, the dataset table of format v1, and cases built by running the reference.
#include <algorithm>
#include <bit>
#include <cstring>

#include "mok/core/fields.h"
#include "mok/core/validate.h"
#include "mok/golden/golden.h"
#include "mok/reference/oracle.h"

#ifndef MOK_GENERATOR_REVISION
#error "MOK_GENERATOR_REVISION must be defined by the build"
#endif

namespace mok::golden {
namespace {

static_assert(std::endian::native == std::endian::little, "tensor bytes are the host's little-endian memory");

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

template <class T>
Tensor tensor_of(std::string name, DType dtype, std::vector<int64_t> shape, const std::vector<T>& values) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (int64_t(values.size()) != product(shape))
    throw Error("mok: tensor " + name + " has " + std::to_string(values.size()) + " elements, its shape holds " +
                std::to_string(product(shape)));
  Tensor t{std::move(name), dtype, std::move(shape), std::vector<uint8_t>(values.size() * sizeof(T))};
  if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

template <class T>
std::vector<T> values_of(const Tensor& t, DType want) {
  if (t.dtype != want)
    throw Error("mok: tensor " + t.name + " is " + to_string(t.dtype) + ", expected " + to_string(want));
  std::vector<T> out(t.bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), t.bytes.data(), out.size() * sizeof(T));
  return out;
}

// Builds the tensors of one group in the order and shapes of the dataset table.
class GroupBuilder {
 public:
  GroupBuilder(const LayerConfig& c, bool routing_given, Group group) : specs_(tensor_specs(c, routing_given)) {
    std::erase_if(specs_, [&](const TensorSpec& s) { return s.group != group; });
  }

  bool has(const std::string& name) const {
    return std::any_of(specs_.begin(), specs_.end(), [&](const TensorSpec& s) { return s.name == name; });
  }

  template <class T>
  void add(const std::string& name, const std::vector<T>& values) {
    for (const TensorSpec& s : specs_)
      if (s.name == name) {
        tensors_.push_back(tensor_of(name, s.dtype, s.shape, values));
        return;
      }
    fail_internal("format v1 has no dataset " + name + " for this config");
  }

  // whole: every dataset of the group was added (false: a subset, each still checked by add()).
  std::vector<Tensor> finish(bool whole = true) {
    if (whole && tensors_.size() != specs_.size())
      fail_internal("built " + std::to_string(tensors_.size()) + " tensors, format v1 expects " +
                    std::to_string(specs_.size()));
    return std::move(tensors_);
  }

 private:
  std::vector<TensorSpec> specs_;
  std::vector<Tensor> tensors_;
};

}  // namespace

std::string to_string(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return "bf16";
    case DType::f32:
      return "f32";
    case DType::i32:
      return "i32";
  }
  fail_internal("unknown dtype " + std::to_string(int(dtype)));
}

size_t element_size(DType dtype) { return dtype == DType::bf16 ? 2 : 4; }

std::string to_string(Group group) {
  switch (group) {
    case Group::inputs:
      return "inputs";
    case Group::routing:
      return "routing";
    case Group::outputs:
      return "outputs";
  }
  fail_internal("unknown group " + std::to_string(int(group)));
}

int64_t Tensor::elements() const { return product(shape); }

uint32_t Tensor::bits(int64_t i) const {
  if (dtype == DType::bf16) {
    uint16_t v;
    std::memcpy(&v, bytes.data() + 2 * i, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, bytes.data() + 4 * i, 4);
  return v;
}

Tensor make_tensor(std::string name, std::vector<int64_t> shape, const std::vector<bf16>& values) {
  return tensor_of(std::move(name), DType::bf16, std::move(shape), values);
}

Tensor make_tensor(std::string name, std::vector<int64_t> shape, const std::vector<float>& values) {
  return tensor_of(std::move(name), DType::f32, std::move(shape), values);
}

Tensor make_tensor(std::string name, std::vector<int64_t> shape, const std::vector<int32_t>& values) {
  return tensor_of(std::move(name), DType::i32, std::move(shape), values);
}

std::vector<bf16> bf16_values(const Tensor& t) { return values_of<bf16>(t, DType::bf16); }
std::vector<float> f32_values(const Tensor& t) { return values_of<float>(t, DType::f32); }
std::vector<int32_t> i32_values(const Tensor& t) { return values_of<int32_t>(t, DType::i32); }

std::vector<TensorSpec> tensor_specs(const LayerConfig& c, bool routing_given) {
  const int64_t N = c.tokens(), H = c.hidden, I = c.intermediate, E = c.experts, k = c.top_k;
  const int64_t Is = c.shared_intermediate;
  const bool router = !routing_given, shared = c.has_shared();
  const DType bf = DType::bf16, f32 = DType::f32, i32 = DType::i32;
  std::vector<TensorSpec> specs;
  const auto add = [&](bool present, Group g, const char* name, DType dtype, std::vector<int64_t> shape) {
    if (present) specs.push_back(TensorSpec{g, name, dtype, std::move(shape)});
  };
  const Group in = Group::inputs, rt = Group::routing, out = Group::outputs;
  add(true, in, "x", bf, {N, H});
  add(true, in, "dy", bf, {N, H});
  add(true, in, "router", f32, {E, H});
  add(c.score_mode == ScoreMode::sigmoid, in, "expert_bias", f32, {E});
  add(true, in, "w1", bf, {E, 2 * I, H});
  add(true, in, "w2", bf, {E, H, I});
  add(shared, in, "shared_w1", bf, {2 * Is, H});
  add(shared, in, "shared_w2", bf, {H, Is});
  add(routing_given, in, "given_topk_idx", i32, {N, k});
  add(routing_given, in, "given_topk_w", f32, {N, k});
  add(true, rt, "topk_idx", i32, {N, k});
  add(true, rt, "topk_w", f32, {N, k});
  add(router, rt, "logits", f32, {N, E});
  add(true, rt, "counts", i32, {E});
  add(true, rt, "offsets", i32, {E + 1});
  add(true, rt, "row_source", i32, {N * k});
  add(true, rt, "slot_row", i32, {N * k});
  add(true, out, "y", bf, {N, H});
  add(true, out, "dx", bf, {N, H});
  add(true, out, "d_topk_w", f32, {N, k});
  add(router, out, "d_logits", f32, {N, E});
  add(router, out, "d_router", f32, {E, H});
  add(true, out, "d_w1", f32, {E, 2 * I, H});
  add(true, out, "d_w2", f32, {E, H, I});
  add(shared, out, "d_shared_w1", f32, {2 * Is, H});
  add(shared, out, "d_shared_w2", f32, {H, Is});
  return specs;
}

void validate_case_name(const std::string& name, const std::string& where) {
  // First: the other errors echo the whole name, and a name of any length is echoed only in part.
  if (name.size() > kMaxCaseNameBytes)
    throw Error(where + " " + quote_input(name.substr(0, 32)) + "... of " + std::to_string(name.size()) +
                " bytes is no case name: at most " + std::to_string(kMaxCaseNameBytes) + " bytes");
  const bool printable = std::all_of(name.begin(), name.end(), [](char ch) { return ch > ' ' && ch < 0x7f; });
  if (name.empty() || !printable)
    throw Error(where + " " + quote_input(name) + " is no case name: printable ASCII without spaces");
  if (name.find_first_of("/\\") != std::string::npos || name.find("..") != std::string::npos)
    throw Error(where + " " + quote_input(name) + " is no case name: it names a file, so no '/', '\\' or '..'");
}

bool GoldenCase::routing_given() const { return find("given_topk_idx") != nullptr; }

const Tensor* GoldenCase::find(const std::string& tensor_name) const {
  for (const std::vector<Tensor>* group : {&inputs, &results.routing, &results.outputs})
    for (const Tensor& t : *group)
      if (t.name == tensor_name) return &t;
  return nullptr;
}

const Tensor& GoldenCase::tensor(const std::string& tensor_name) const {
  const Tensor* t = find(tensor_name);
  if (!t) throw Error("mok: golden case " + name + " has no tensor " + tensor_name);
  return *t;
}

std::string generator_revision() { return MOK_GENERATOR_REVISION; }

std::vector<Tensor> input_tensors(const ref::Problem& p) {
  const LayerConfig& c = p.config;
  GroupBuilder b(c, p.routing.has_value(), Group::inputs);
  b.add("x", p.x);
  b.add("dy", p.dy);
  b.add("router", p.weights.router);
  if (c.score_mode == ScoreMode::sigmoid)
    b.add("expert_bias",
          p.weights.expert_bias.empty() ? std::vector<float>(size_t(c.experts), 0.0f) : p.weights.expert_bias);
  b.add("w1", p.weights.w1);
  b.add("w2", p.weights.w2);
  if (c.has_shared()) {
    b.add("shared_w1", p.weights.shared_w1);
    b.add("shared_w2", p.weights.shared_w2);
  }
  if (p.routing) {
    b.add("given_topk_idx", p.routing->topk_idx);
    b.add("given_topk_w", p.routing->topk_w);
  }
  return b.finish();
}

ref::Problem problem_of(const GoldenCase& g) {
  ref::Problem p;
  p.config = g.config;
  p.x = bf16_values(g.tensor("x"));
  p.dy = bf16_values(g.tensor("dy"));
  p.weights.router = f32_values(g.tensor("router"));
  if (const Tensor* bias = g.find("expert_bias")) p.weights.expert_bias = f32_values(*bias);
  p.weights.w1 = bf16_values(g.tensor("w1"));
  p.weights.w2 = bf16_values(g.tensor("w2"));
  if (g.config.has_shared()) {
    p.weights.shared_w1 = bf16_values(g.tensor("shared_w1"));
    p.weights.shared_w2 = bf16_values(g.tensor("shared_w2"));
  }
  if (g.routing_given())
    p.routing = ref::Routing{i32_values(g.tensor("given_topk_idx")), f32_values(g.tensor("given_topk_w"))};
  return p;
}

namespace {

// Every field of the Forward and the Gradients (mok/core/fields.h) that format v1 stores for this
// config, into the group its spec names, in the visitor's order (the order of the datasets). g null:
// the forward's alone (the outputs group then holds only the forward's tensors).
LayerResults results_of_fields(const ref::Problem& p, const ref::Forward& f, const ref::Gradients* g) {
  const bool given = p.routing.has_value();
  GroupBuilder routing(p.config, given, Group::routing), outputs(p.config, given, Group::outputs);
  const auto add = [&](const char* name, const auto& values) {
    if (routing.has(name))
      routing.add(name, values);
    else if (outputs.has(name))
      outputs.add(name, values);
  };
  for_each_field(f, add);
  if (g) for_each_field(*g, add);
  return LayerResults{routing.finish(), outputs.finish(g != nullptr)};
}

}  // namespace

LayerResults results_of(const ref::Problem& p, const ref::Forward& f, const ref::Gradients& g) {
  return results_of_fields(p, f, &g);
}

LayerResults forward_results_of(const ref::Problem& p, const ref::Forward& f) {
  return results_of_fields(p, f, nullptr);
}

struct ReferenceRun {
  ref::Forward forward;
  ref::Gradients gradients;
};

ReferenceRun run_layer(const ref::Problem& p, const ref::Options& options) {
  if (options.fault != ref::Fault::none) throw Error("mok: goldens hold the reference's bits: a planted fault is set");
  const ref::Routing* given = p.routing ? &*p.routing : nullptr;
  ReferenceRun run{ref::forward(p.config, p.x, p.weights, given, options), {}};
  run.gradients = ref::backward(p.config, p.x, p.weights, run.forward, p.dy, options);
  return run;
}

LayerResults run_reference(const ref::Problem& p, const ref::Options& options) {
  const ReferenceRun run = run_layer(p, options);
  return results_of(p, run.forward, run.gradients);
}

GoldenCase make_case(const std::string& name, const ref::Problem& problem, const ref::Options& options) {
  GoldenCase g;
  g.name = name;
  g.config = problem.config;
  g.options = options;
  g.inputs = input_tensors(problem);
  const ReferenceRun run = run_layer(problem, options);
  g.results = results_of(problem, run.forward, run.gradients);
  const ref::OracleResult oracle =
      ref::oracle(ref::oracle_inputs(problem.config, problem.x, problem.weights, problem.dy, run.forward));
  for (const ref::OracleCheck& check : ref::compare_with_oracle(run.forward, run.gradients, oracle))
    g.oracle[ref::to_string(check.tensor)] = OracleAccuracy{check.error.relative, check.bound};
  g.generator = generator_revision();
  return g;
}

GoldenCase make_case(const std::string& name, const LayerConfig& config, const ref::Options& options,
                     const Recipe& recipe) {
  GoldenCase g = make_case(name, ref::make_problem(config, recipe.seed, recipe.routing, recipe.zipf_s), options);
  g.recipe = recipe;
  return g;
}

GoldenCase regenerate(const GoldenCase& golden) {
  // mok-golden check holds up to 3.6 times the tensors at once (the golden's, the problem's, the reference's run
  // and the fresh results), measured.
  require_fits_in_memory(golden.config, 4);
  const ref::Problem problem = golden.recipe ? ref::make_problem(golden.config, golden.recipe->seed,
                                                                 golden.recipe->routing, golden.recipe->zipf_s)
                                             : problem_of(golden);
  GoldenCase fresh = golden;
  fresh.inputs = input_tensors(problem);
  fresh.results = run_reference(problem, golden.options);
  return fresh;
}

std::string to_string(StepModel step) {
  switch (step) {
    case StepModel::fp32_fma:
      return "fp32_fma";
    case StepModel::hopper_tc:
      return "hopper_tc";
  }
  fail_internal("unknown step model " + std::to_string(int(step)));
}

StepModel step_model_from_string(const std::string& name) {
  if (name == "fp32_fma") return StepModel::fp32_fma;
  if (name == "hopper_tc") return StepModel::hopper_tc;
  throw Error("mok: unknown step model " + quote_input(name) + " (fp32_fma or hopper_tc)");
}

std::string to_string(ScoreMode mode) { return mode == ScoreMode::softmax ? "softmax" : "sigmoid"; }

ScoreMode score_mode_from_string(const std::string& name) {
  if (name == "softmax") return ScoreMode::softmax;
  if (name == "sigmoid") return ScoreMode::sigmoid;
  throw Error("mok: unknown score mode " + quote_input(name) + " (softmax or sigmoid)");
}

std::string to_string(Precision precision) { return precision == Precision::bf16 ? "bf16" : "fp8"; }

Precision precision_from_string(const std::string& name) {
  if (name == "bf16") return Precision::bf16;
  if (name == "fp8") return Precision::fp8;
  throw Error("mok: unknown precision " + quote_input(name) + " (bf16 or fp8)");
}

}  // namespace mok::golden
