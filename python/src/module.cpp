// mok._C: the ops' schemas (kernels: cpu_ops.cpp, cuda_ops.cpp) and the plain functions Python needs:
// the config vocabulary, the saved buffer's size, golden files and the GPU's deferred error check.
#include <torch/extension.h>

#include <string>
#include <string_view>

#include "cuda_layers.h"
#include "golden_io.h"
#include "mok/golden/file_kind.h"
#include "mok/golden/golden.h"
#include "op_config.h"
#include "op_tensors.h"

#ifdef MOK_WITH_CUDA
// nccl.h: the NCCL the megakernel was built against, torch's where found (cmake/TorchNccl.cmake).
#include "mok/megakernel/nccl.h"
#endif

TORCH_LIBRARY(mok, m) {
  // The forward's inputs, in this order, open every op. Absent by mode: topk_idx in mode router, topk_w
  // unless given; logits (and d_logits, d_router) have first dimension 0 in mode given.
  m.def(
      "forward(Tensor x, Tensor router, Tensor? expert_bias, Tensor w1, Tensor w2, Tensor? shared_w1, "
      "Tensor? shared_w2, Tensor? topk_idx, Tensor? topk_w, int[] config_ints, float[] config_floats, "
      "int routing_mode, int[] launch, Tensor? fp8_weights=None) -> (Tensor y, Tensor topk_idx, Tensor topk_w, "
      "Tensor logits, Tensor saved)");
  // The fp8 mode's weights quantized once (E4M3 with 128 x 128 block scales), for forwards and backwards
  // until the weights change: mok::forward's and mok::backward's fp8_weights (uint8 [fp8_weights_bytes],
  // CUDA only).
  m.def(
      "quantize_weights(Tensor w1, Tensor w2, Tensor? shared_w1, Tensor? shared_w2, int[] config_ints, "
      "float[] config_floats, int[] launch) -> Tensor");
  // d_w1, d_w2, d_shared_* are bf16 (the weights' dtype): each fp32 gradient rounded once. fp8_weights:
  // the forward's (read instead of quantizing W and W^T again; CUDA only).
  m.def(
      "backward(Tensor x, Tensor router, Tensor? expert_bias, Tensor w1, Tensor w2, Tensor? shared_w1, "
      "Tensor? shared_w2, Tensor topk_idx, Tensor topk_w, Tensor logits, Tensor saved, Tensor dy, "
      "int[] config_ints, float[] config_floats, int routing_mode, int[] launch, Tensor? fp8_weights=None) -> "
      "(Tensor dx, Tensor d_topk_w, Tensor d_logits, Tensor d_router, Tensor d_w1, Tensor d_w2, "
      "Tensor d_shared_w1, Tensor d_shared_w2)");
  // mok::backward that consumes saved: on the GPU dh is written over its h (a smaller workspace, as the layer's
  // BackwardScratch::dh_over_saved_h), so saved serves no second backward; its version moves. The autograd
  // formula's (autograd.cpp), which runs one backward per forward and refuses a second.
  m.def(
      "backward_consuming(Tensor x, Tensor router, Tensor? expert_bias, Tensor w1, Tensor w2, Tensor? shared_w1, "
      "Tensor? shared_w2, Tensor topk_idx, Tensor topk_w, Tensor logits, Tensor(a!) saved, Tensor dy, "
      "int[] config_ints, float[] config_floats, int routing_mode, int[] launch, Tensor? fp8_weights=None) -> "
      "(Tensor dx, Tensor d_topk_w, Tensor d_logits, Tensor d_router, Tensor d_w1, Tensor d_w2, "
      "Tensor d_shared_w1, Tensor d_shared_w2)");
  // The weight gradients added into accumulators (gradient accumulation over micro-batches): d_router
  // fp32, the others all fp32 or all bf16 (added as autograd adds into a bf16 .grad).
  m.def(
      "backward_accumulate(Tensor x, Tensor router, Tensor? expert_bias, Tensor w1, Tensor w2, "
      "Tensor? shared_w1, Tensor? shared_w2, Tensor topk_idx, Tensor topk_w, Tensor logits, Tensor saved, "
      "Tensor dy, Tensor(a!)? d_router, Tensor(b!) d_w1, Tensor(c!) d_w2, Tensor(d!)? d_shared_w1, "
      "Tensor(e!)? d_shared_w2, int[] config_ints, float[] config_floats, int routing_mode, int[] launch, "
      "Tensor? fp8_weights=None) -> (Tensor dx, Tensor d_topk_w, Tensor d_logits)");
}

namespace mok::py {
namespace {

// A flag argument: True or False, or a numpy.bool_ (by its type's name, numpy.bool in numpy 2, as
// pybind11 knows it: no numpy import), as mok.config's _require_bool takes. A bool parameter would take
// 2, 0.5 and None by their truth (pybind11's converting bool caster) without a word.
bool flag(const char* name, pybind11::handle value) {
  if (value.ptr() == Py_True || value.ptr() == Py_False) return value.ptr() == Py_True;
  const std::string_view type = Py_TYPE(value.ptr())->tp_name;
  if (type == "numpy.bool" || type == "numpy.bool_") return PyObject_IsTrue(value.ptr()) == 1;
  throw Error(std::string(name) + " must be a bool, got " + std::string(pybind11::repr(value)));
}

// A flag parameter: any object, read by flag() with its name, and shown as bool in the signature
// (help() said "recompute: object").
struct FlagArg {
  pybind11::handle value;
};

template <class Table, class Name>
pybind11::tuple names(const Table& table, Name name) {
  pybind11::list out;
  for (const auto& entry : table) out.append(name(entry));
  return pybind11::tuple(out);
}

pybind11::dict golden_dict(const GoldenRead& g) {
  const auto [ints, floats] = pack_config(g.call.config);
  pybind11::dict d;
  d["name"] = g.name;
  d["description"] = g.description;
  d["config_ints"] = ints;
  d["config_floats"] = floats;
  d["routing_mode"] = int(g.call.mode);
  d["ring_rows"] = g.call.ring_rows;
  d["recompute"] = g.call.recompute;
  d["fp8_weight_gradients"] = g.call.fp8_weight_gradients;
  d["tensors"] = g.tensors;
  return d;
}

// The fake kernels' checks (mok/_ops.py): those of the kernel the dispatcher would pick for the
// tensors, on their metadata (device, dtype, shape, contiguity: all a fake tensor has): all on the CPU,
// the CPU kernel's; some on CUDA and the rest on the CPU, the CUDA kernel's (CUDA's dispatch key outranks
// the CPU's) where the module has it; otherwise (meta) the checks every kernel makes. Never the data's
// alignment nor where it lies (the accumulators' overlap); with symbolic sizes (torch.compile's dynamic
// shapes) not the shapes and contiguity either: the kernel checks them when it runs.
struct FakeCheck {
  OpKernel kernel;
  Checkable checkable;
};

const at::Tensor* present(const at::Tensor& t) { return &t; }
const at::Tensor* present(const std::optional<at::Tensor>& t) { return t ? &*t : nullptr; }

template <class... Tensors>
FakeCheck fake_check(const Tensors&... tensors) {
  bool all_cpu = true, cpu_or_cuda = true, symbolic = false;
  for (const at::Tensor* t : {present(tensors)...}) {
    if (!t) continue;
    all_cpu = all_cpu && t->is_cpu();
    cpu_or_cuda = cpu_or_cuda && (t->is_cpu() || t->is_cuda());
    symbolic = symbolic || t->unsafeGetTensorImpl()->has_symbolic_sizes_strides();
  }
  const OpKernel kernel = all_cpu ? OpKernel::cpu : cpu_or_cuda && kHaveCudaLayers ? OpKernel::cuda : OpKernel::none;
  return {kernel, Checkable{.aligned = false, .sizes_known = !symbolic, .addresses = false}};
}

using Ints = std::vector<int64_t>;
using Floats = std::vector<double>;
using OptTensor = std::optional<at::Tensor>;

void check_forward(const at::Tensor& x, const at::Tensor& router, const OptTensor& expert_bias, const at::Tensor& w1,
                   const at::Tensor& w2, const OptTensor& shared_w1, const OptTensor& shared_w2,
                   const OptTensor& topk_idx, const OptTensor& topk_w, const Ints& ints, const Floats& floats,
                   int64_t routing_mode, const Ints& launch, const OptTensor& fp8_weights) {
  const FakeCheck f = fake_check(x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w, fp8_weights);
  checked_forward(f.kernel, ints, floats, routing_mode, launch, {x, router, expert_bias, w1, w2, shared_w1, shared_w2},
                  topk_idx, topk_w, fp8_weights, f.checkable);
}

// mok::backward's (accumulators absent) and mok::backward_accumulate's.
void check_backward(const at::Tensor& x, const at::Tensor& router, const OptTensor& expert_bias, const at::Tensor& w1,
                    const at::Tensor& w2, const OptTensor& shared_w1, const OptTensor& shared_w2,
                    const at::Tensor& topk_idx, const at::Tensor& topk_w, const at::Tensor& logits,
                    const at::Tensor& saved, const at::Tensor& dy, const OptTensor& d_router, const OptTensor& d_w1,
                    const OptTensor& d_w2, const OptTensor& d_shared_w1, const OptTensor& d_shared_w2, const Ints& ints,
                    const Floats& floats, int64_t routing_mode, const Ints& launch, const OptTensor& fp8_weights) {
  const FakeCheck f = fake_check(x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w, logits, saved,
                                 dy, d_router, d_w1, d_w2, d_shared_w1, d_shared_w2, fp8_weights);
  if (d_w1.has_value() != d_w2.has_value()) fail_internal("check_backward takes d_w1 and d_w2 together");
  std::optional<Accumulators> acc;
  if (d_w1) acc.emplace(Accumulators{d_router, *d_w1, *d_w2, d_shared_w1, d_shared_w2});
  checked_backward(f.kernel, ints, floats, routing_mode, launch, {x, router, expert_bias, w1, w2, shared_w1, shared_w2},
                   {topk_idx, topk_w, logits, saved}, dy, acc ? &*acc : nullptr, fp8_weights, f.checkable);
}

void check_quantize_weights(const at::Tensor& w1, const at::Tensor& w2, const OptTensor& shared_w1,
                            const OptTensor& shared_w2, const Ints& ints, const Floats& floats, const Ints& launch) {
  const FakeCheck f = fake_check(w1, w2, shared_w1, shared_w2);
  checked_quantize(f.kernel, ints, floats, launch, w1, w2, shared_w1, shared_w2, f.checkable);
}

}  // namespace
}  // namespace mok::py

template <>
struct pybind11::detail::type_caster<mok::py::FlagArg> {
  PYBIND11_TYPE_CASTER(mok::py::FlagArg, const_name("bool"));
  bool load(handle src, bool) {
    value.value = src;
    return true;
  }
};

PYBIND11_MODULE(_C, m) {
  using namespace mok::py;
  namespace py = pybind11;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const mok::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  m.attr("CONFIG_INT_FIELDS") = names(kIntFields, [](const IntField& f) { return f.name; });
  m.attr("CONFIG_FLOAT_FIELDS") = names(kFloatFields, [](const FloatField& f) { return f.name; });
  m.attr("LAUNCH_FIELDS") = names(kLaunchFields, [](const char* f) { return f; });
  m.attr("ROUTING_MODES") = names(kRoutingModes, [](const char* f) { return f; });
  m.attr("SCORE_MODES") = names(kScoreModes, [](const char* f) { return f; });
  m.attr("PRECISIONS") = names(kPrecisions, [](const char* f) { return f; });
  m.attr("HAS_CUDA") = kHaveCudaLayers;
#ifdef MOK_WITH_CUDA
  m.attr("NCCL_VERSION") = int(NCCL_VERSION_CODE);
#else
  m.attr("NCCL_VERSION") = py::none();
#endif

  m.def(
      "default_config", [] { return pack_config(mok::LayerConfig{}); },
      "LayerConfig's defaults as (config_ints, config_floats).");
  m.def(
      "check_config",
      [](const std::vector<int64_t>& ints, const std::vector<double>& floats) { parse_config(ints, floats); },
      pybind11::arg("config_ints"), pybind11::arg("config_floats"),
      "Raises the ValueError a call would raise for this config (mok.MoE checks before it allocates).");
  m.def(
      "saved_bytes",
      [](const std::vector<int64_t>& ints, const std::vector<double>& floats, FlagArg recompute, int64_t gpus,
         int64_t capacity_rows) {
        const bool recomputing = flag("recompute", recompute.value);
        const mok::LayerConfig c = parse_config(ints, floats);
        validate_share(c, gpus, capacity_rows);
        return mok::saved_layout(c, recomputing, mok::RowShare{int(gpus), 0, long(capacity_rows)}).bytes;
      },
      pybind11::arg("config_ints"), pybind11::arg("config_floats"), pybind11::arg("recompute") = false,
      pybind11::arg("gpus") = 1, pybind11::arg("capacity_rows") = 0,
      "Bytes of the forward's saved output for this config, with or without recompute (a bool: the layout alone), on "
      "each of `gpus` GPUs of a communicator whose experts hold `capacity_rows` routed rows (0: the most) "
      "(mok/core/saved_layout.h).");
  m.def(
      "workspace_bytes",
      [](const std::vector<int64_t>& ints, const std::vector<double>& floats, const std::vector<int64_t>& launch) {
        // Parsed here: a bad list is named as a call names it, without the GPU ops too.
        return cuda_workspace_bytes(parse_call(ints, floats, int64_t(mok::RoutingMode::router), launch));
      },
      "(forward, backward, backward_consuming, backward_accumulate) workspace bytes of the GPU layer for this config "
      "and launch list: mok::forward's, mok::backward's (its scratch in its d_w1 where it fits), "
      "mok::backward_consuming's (and dh over saved's h) and mok::backward_accumulate's (the op allocates exactly "
      "these, beside its outputs; computed on the host: no GPU needed, no Layer built).");
  m.def(
      "fp8_weights_bytes",
      [](const std::vector<int64_t>& ints, const std::vector<double>& floats, const std::vector<int64_t>& launch) {
        return cuda_fp8_weights_bytes(parse_call(ints, floats, int64_t(mok::RoutingMode::router), launch));
      },
      "Bytes of mok::quantize_weights' result for this config and launch list (0 in bf16; no GPU needed).");
  m.def("check_forward", &check_forward,
        "Raises the ValueError mok::forward's kernel would raise for these arguments (the fake kernel's check), "
        "from their metadata alone (fake tensors too: all but the data's alignment; see module.cpp, fake_check).");
  m.def("check_backward", &check_backward,
        "Raises the ValueError mok::backward's kernel (accumulators None) or mok::backward_accumulate's would raise "
        "for these arguments, from their metadata alone (the fake kernels' check).");
  m.def("check_disjoint", &check_disjoint, py::arg("named"),
        "Raises the ValueError mok::backward_accumulate raises where two of its accumulators overlap, for "
        "(name, contiguous tensor) pairs: mok.moe's check of accumulate_into at the call.");
  m.def("check_apart", &check_apart, py::arg("accumulators"), py::arg("reads"),
        "Raises the ValueError mok::backward_accumulate raises where one of its accumulators overlaps a tensor the "
        "backward reads, for (name, contiguous tensor) pairs: mok.moe's check of accumulate_into at the call.");
  m.def("check_quantize_weights", &check_quantize_weights,
        "Raises the ValueError mok::quantize_weights' kernel would raise for these arguments, from their "
        "metadata alone (the fake kernel's check): on the CPU always (the CPU op quantizes in its forward).");
  m.def(
      "nccl_version",
      []() -> py::object {
#ifdef MOK_WITH_CUDA
        int version = 0;
        MOK_NCCL_CHECK(ncclGetVersion(&version));
        return py::int_(version);
#else
        return py::none();
#endif
      },
      "ncclGetVersion() of the NCCL library loaded in this process (torch's: mok._C finds libnccl.so.2 by its "
      "soname after torch loaded it), e.g. 22809 for 2.28.9; NCCL_VERSION is the version of the headers mok was "
      "built against. None without the GPU ops.");
  m.def(
      "release", [](int64_t comm) { release_cuda_layers(static_cast<uintptr_t>(comm)); }, py::arg("comm"),
      "Destroys the GPU layers cached on the communicator comm (an ncclComm_t as an integer), after waiting for "
      "their devices. Collective: every rank calls it at the same point, before the communicator is destroyed.");
  m.def(
      "register_communicator", [](int64_t comm) { register_communicator(static_cast<uintptr_t>(comm)); },
      py::arg("comm"),
      "Lets the GPU ops build layers on the communicator comm (an ncclComm_t as an integer; "
      "mok.distributed.communicator registers each it hands out) until release(comm).");
  m.def(
      "mark_failed", [](int64_t comm) { mark_communicator_failed(static_cast<uintptr_t>(comm)); }, py::arg("comm"),
      "Refuses the GPU ops' calls on the communicator comm until release(comm) on this rank: a call on it failed "
      "here (mok.distributed marks the errors it raises before the op; the op marks its own).");
  m.def(
      "_set_poison_outputs", [](FlagArg on) { set_poison_outputs(flag("on", on.value)); }, py::arg("on"),
      "Tests: the GPU ops fill their outputs and workspace with 0xff bytes before their kernels run, so an "
      "element no kernel wrote shows (a no-op without CUDA).");
  m.def("check", &check_cuda_layers,
        "Waits for the GPU layers' streams and raises the first error their kernels recorded (a no-op "
        "without CUDA).");
  m.def(
      "read_golden",
      [](py::handle path) {
        // Checked here: a path of another type (None above all) raised pybind11's TypeError quoting the
        // signature. What passes, its path caster converts (os.fspath's str or bytes).
        if (!py::isinstance<py::str>(path) && !py::isinstance<py::bytes>(path) && !py::hasattr(path, "__fspath__"))
          throw mok::Error("path must be a str or os.PathLike, got " +
                           py::str(py::type::handle_of(path).attr("__name__")).cast<std::string>());
        // The file system's bytes (os.fsencode: a str's surrogate escapes as the bytes they stand for). A NUL
        // failed the path caster with pybind11's RuntimeError ("Unable to cast Python instance of type <class
        // 'str'> to C++ type '?'"), naming no argument.
        const std::string bytes = py::module_::import("os").attr("fsencode")(path).cast<std::string>();
        if (bytes.find('\0') != std::string::npos)
          throw mok::Error("path must not contain a NUL byte, got " + std::string(py::repr(path)));
        return golden_dict(read_golden(bytes));
      },
      py::arg("path"),
      "A golden file's name, config, routing mode, ring_rows, recompute, fp8_weight_gradients and tensors by "
      "dataset name (validated); path a str or os.PathLike.");
  m.def(
      "require_writable_file", [](const std::string& path) { mok::golden::require_writable_file(path); },
      py::arg("path"),
      "Raises ValueError (\"mok: cannot write PATH: WHY\") where write_golden could not write path (its directory "
      "missing; a directory, FIFO or symbolic link at path): for a caller to refuse it before the work.");
  m.def(
      "validate_case_name", [](const std::string& name) { mok::golden::validate_case_name(name, "name"); },
      py::arg("name"),
      "Raises ValueError where write_golden would refuse name as a case name (docs/golden-format.md): for a "
      "caller to refuse it before the work.");
  m.def(
      "write_golden",
      [](const std::string& path, const std::string& name, const std::string& description,
         const std::vector<int64_t>& ints, const std::vector<double>& floats, int64_t routing_mode,
         const std::vector<int64_t>& launch, const NamedTensors& tensors) {
        const Call call = parse_call(ints, floats, routing_mode, launch);
        mok::require(call.comm == 0, "a golden file holds a whole layer's call, not a share on a communicator");
        write_golden(path, name, description, call, tensors);
      },
      "Writes one forward and backward (tensors by golden dataset name, plus saved) as a golden file.");
}
