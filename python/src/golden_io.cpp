#include "golden_io.h"

#include "mok/golden/golden.h"
#include "op_tensors.h"
#include "reference_options.h"

namespace mok::py {
namespace {

class Named {
 public:
  explicit Named(const NamedTensors& t) : tensors_(t) {}

  template <class T>
  std::vector<T> get(const std::string& name) const {
    const auto it = tensors_.find(name);
    require(it != tensors_.end(), "capture: tensor " + name + " is missing");
    require(it->second.scalar_type() == scalar_type_of<T>() && it->second.is_cpu() && it->second.is_contiguous(),
            "capture: tensor " + name + " must be a contiguous CPU " + c10::toString(scalar_type_of<T>()) + " tensor");
    return values<T>(it->second);
  }
  template <class T>
  std::vector<T> get_if(const std::string& name) const {
    return tensors_.count(name) ? get<T>(name) : std::vector<T>();
  }

 private:
  const NamedTensors& tensors_;
};

at::ScalarType dtype_of(golden::DType d) {
  switch (d) {
    case golden::DType::bf16:
      return at::kBFloat16;
    case golden::DType::f32:
      return at::kFloat;
    case golden::DType::i32:
      return at::kInt;
  }
  throw Error("mok: unknown golden dtype");
}

}  // namespace

void write_golden(const std::string& path, const std::string& name, const std::string& description, const Call& call,
                  const NamedTensors& tensors) {
  require(call.mode != RoutingMode::replay_ids,
          "capture: golden format v1 holds a routing by the router or a given one, not replayed ids");
  const Named t(tensors);
  const LayerConfig& c = call.config;
  const bool given = call.mode == RoutingMode::given;

  ref::Problem p;
  p.config = c;
  p.x = t.get<bf16>("x");
  p.dy = t.get<bf16>("dy");
  p.weights = LayerWeights{t.get<float>("router"), t.get_if<float>("expert_bias"), t.get<bf16>("w1"),
                           t.get<bf16>("w2"),      t.get_if<bf16>("shared_w1"),    t.get_if<bf16>("shared_w2")};
  if (given) p.routing = Routing{t.get<int32_t>("given_topk_idx"), t.get<float>("given_topk_w")};

  const std::vector<uint8_t> saved = t.get<uint8_t>("saved");
  require(saved.size() == saved_of(call).bytes, "capture: saved does not match the config");
  Forward f = unpack_saved(c, saved, call.recompute);
  f.routing = Routing{t.get<int32_t>("topk_idx"), t.get<float>("topk_w")};
  if (!given) f.logits = t.get<float>("logits");
  f.y = t.get<bf16>("y");

  Gradients g;
  g.dx = t.get<bf16>("dx");
  g.d_topk_w = t.get<float>("d_topk_w");
  g.d_logits = t.get_if<float>("d_logits");
  g.d_router = t.get_if<float>("d_router");
  g.d_w1 = t.get<float>("d_w1");
  g.d_w2 = t.get<float>("d_w2");
  g.d_shared_w1 = t.get_if<float>("d_shared_w1");
  g.d_shared_w2 = t.get_if<float>("d_shared_w2");

  golden::GoldenCase gc;
  gc.name = name;
  gc.description = description;
  gc.config = c;
  gc.options = reference_options(call);
  gc.inputs = golden::input_tensors(p);
  gc.results = golden::results_of(p, f, g);
  gc.generator = golden::generator_revision() + " via mok.capture";
  golden::write_golden(path, gc);
}

GoldenRead read_golden(const std::string& path) {
  const golden::GoldenCase gc = golden::read_golden(path);
  GoldenRead r;
  r.name = gc.name;
  r.description = gc.description;
  r.call.config = gc.config;
  r.call.mode = gc.routing_given() ? RoutingMode::given : RoutingMode::router;
  r.call.ring_rows = gc.options.ring_rows;
  r.call.recompute = gc.options.recompute;
  // The reference reads the option in the fp8 mode only (a fuzz repro may carry it in bf16); the op refuses it there.
  r.call.fp8_weight_gradients = gc.options.fp8_weight_gradients && gc.config.precision == Precision::fp8;
  for (const std::vector<golden::Tensor>* group : {&gc.inputs, &gc.results.routing, &gc.results.outputs})
    for (const golden::Tensor& t : *group) {
      at::Tensor out = at::empty(t.shape, at::TensorOptions().dtype(dtype_of(t.dtype)));
      if (!t.bytes.empty()) std::memcpy(out.data_ptr(), t.bytes.data(), t.bytes.size());
      r.tensors.emplace(t.name, out);
    }
  return r;
}

}  // namespace mok::py
