// GPU tests of the device API (mok/megakernel/layer.h) on caller-owned device buffers: every routing
// mode against the reference bit for bit, weights read at each call, gradient accumulation, a CUDA
// graph and a non-default stream, device errors raised by the next call or check(), bad views refused.
// Outputs are poisoned before every launch. ctest label gpu; they skip without a Hopper GPU.
#include "mok/megakernel/layer.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "mok/core/fields.h"
#include "mok/reference/layer.h"
#include "mok/reference/problem.h"

namespace mok::gpu {
namespace {

void cuda(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

// A device tensor for the tests (absent: no elements).
class Buffer {
 public:
  Buffer() = default;
  Buffer(DType dtype, std::vector<int64_t> shape) : bytes_(dtype_bytes(dtype)) {
    for (int64_t d : shape) bytes_ *= size_t(d);
    if (bytes_) cuda(cudaMalloc(&view_.data, bytes_));
    view_.dtype = dtype;
    view_.shape = std::move(shape);
  }
  template <class T>
  Buffer(DType dtype, std::vector<int64_t> shape, const std::vector<T>& host) : Buffer(dtype, std::move(shape)) {
    upload(host);
  }
  ~Buffer() {
    if (view_.data) cudaFree(view_.data);
  }
  Buffer(Buffer&& o) noexcept : view_(std::exchange(o.view_, {})), bytes_(o.bytes_) {}
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(view_, o.view_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  const TensorView& view() const { return view_; }
  template <class T>
  void upload(const std::vector<T>& host) {
    ASSERT_EQ(host.size() * sizeof(T), bytes_);
    if (bytes_) cuda(cudaMemcpy(view_.data, host.data(), bytes_, cudaMemcpyHostToDevice));
    cuda(cudaDeviceSynchronize());  // landed before work on any stream reads it
  }
  template <class T>
  std::vector<T> download() const {
    std::vector<T> host(bytes_ / sizeof(T));
    if (bytes_) cuda(cudaMemcpy(host.data(), view_.data, bytes_, cudaMemcpyDeviceToHost));
    return host;
  }
  void poison() {
    if (bytes_) cuda(cudaMemset(view_.data, 0xff, bytes_));
    cuda(cudaDeviceSynchronize());
  }

 private:
  TensorView view_;
  size_t bytes_ = 0;
};

// One problem's tensors on the device, in the layer's vocabulary.
struct Bound {
  LayerConfig c;
  Buffer x, dy, router, bias, w1, w2, sw1, sw2;
  Buffer y, topk_idx, topk_w, logits, saved, workspace;
  Buffer dx, d_topk_w, d_logits, d_router, d_w1, d_w2, d_sw1, d_sw2;
  RoutingMode mode = RoutingMode::router;

  Bound(const Layer& layer, const ref::Problem& p, RoutingMode routing) : c(p.config), mode(routing) {
    const int64_t N = c.tokens(), H = c.hidden, I = c.intermediate, E = c.experts, k = c.top_k;
    const int64_t Is = c.shared_intermediate;
    x = Buffer(DType::bf16, {N, H}, p.x);
    dy = Buffer(DType::bf16, {N, H}, p.dy);
    set_weights(p.weights);
    y = Buffer(DType::bf16, {N, H});
    topk_idx = Buffer(DType::i32, {N, k});
    topk_w = Buffer(DType::f32, {N, k});
    logits = Buffer(DType::f32, {N, E});
    saved = Buffer(DType::u8, {int64_t(layer.saved_bytes())});
    workspace = Buffer(DType::u8, {int64_t(layer.workspace_bytes(Pass::backward))});
    if (mode != RoutingMode::router) topk_idx.upload(p.routing->topk_idx);
    if (mode == RoutingMode::given) topk_w.upload(p.routing->topk_w);
    dx = Buffer(DType::bf16, {N, H});
    d_topk_w = Buffer(DType::f32, {N, k});
    d_logits = Buffer(DType::f32, {N, E});
    d_router = Buffer(DType::f32, {E, H});
    d_w1 = Buffer(DType::f32, {E, 2 * I, H});
    d_w2 = Buffer(DType::f32, {E, H, I});
    d_sw1 = Buffer(DType::f32, {2 * Is, H});
    d_sw2 = Buffer(DType::f32, {H, Is});
  }
  void set_weights(const LayerWeights& w) {
    const int64_t H = c.hidden, I = c.intermediate, E = c.experts, Is = c.shared_intermediate;
    router = Buffer(DType::f32, {E, H}, w.router);
    bias = Buffer(DType::f32, {w.expert_bias.empty() ? 0 : E}, w.expert_bias);
    w1 = Buffer(DType::bf16, {E, 2 * I, H}, w.w1);
    w2 = Buffer(DType::bf16, {E, H, I}, w.w2);
    sw1 = Buffer(DType::bf16, {2 * Is, H}, w.shared_w1);
    sw2 = Buffer(DType::bf16, {H, Is}, w.shared_w2);
  }
  ForwardInputs inputs() const {
    return {x.view(), {router.view(), bias.view(), w1.view(), w2.view(), sw1.view(), sw2.view()}, mode};
  }
  ForwardOutputs outputs() const {
    return {y.view(), topk_idx.view(), topk_w.view(), mode == RoutingMode::given ? TensorView{} : logits.view(),
            saved.view()};
  }
  GradOutputs grads(bool accumulate = false) const {
    const bool router_grads = mode != RoutingMode::given;
    return {dx.view(),
            d_topk_w.view(),
            router_grads ? d_logits.view() : TensorView{},
            router_grads ? d_router.view() : TensorView{},
            d_w1.view(),
            d_w2.view(),
            d_sw1.view(),
            d_sw2.view(),
            accumulate};
  }
  void poison(bool accumulate = false) {
    for (Buffer* b : {&y, &logits, &saved, &dx, &d_topk_w, &d_logits}) b->poison();
    if (!accumulate)
      for (Buffer* b : {&d_router, &d_w1, &d_w2, &d_sw1, &d_sw2}) b->poison();
    if (mode == RoutingMode::router) topk_idx.poison();
    if (mode != RoutingMode::given) topk_w.poison();
  }
  void run(Layer& layer, cudaStream_t stream, bool accumulate = false) {
    layer.forward(stream, workspace.view().data, inputs(), outputs());
    layer.backward(stream, workspace.view().data, inputs(), outputs(), dy.view(), grads(accumulate));
  }
};

struct Results {
  std::vector<bf16> y, dx;
  std::vector<int32_t> topk_idx;
  std::vector<float> topk_w, logits, d_topk_w, d_logits, d_router, d_w1, d_w2, d_sw1, d_sw2;
};

Results read(const Bound& b) {
  const bool router = b.mode != RoutingMode::given;
  return {b.y.download<bf16>(),
          b.dx.download<bf16>(),
          b.topk_idx.download<int32_t>(),
          b.topk_w.download<float>(),
          router ? b.logits.download<float>() : std::vector<float>{},
          b.d_topk_w.download<float>(),
          router ? b.d_logits.download<float>() : std::vector<float>{},
          router ? b.d_router.download<float>() : std::vector<float>{},
          b.d_w1.download<float>(),
          b.d_w2.download<float>(),
          b.d_sw1.download<float>(),
          b.d_sw2.download<float>()};
}

Results reference(const ref::Problem& p, RoutingMode mode) {
  ref::Options opt;
  opt.step = StepModel::hopper_tc;
  opt.replay_ids = mode == RoutingMode::replay_ids;
  const Routing* given = mode == RoutingMode::router ? nullptr : &*p.routing;
  const Forward f = ref::forward(p.config, p.x, p.weights, given, opt);
  const Gradients g = ref::backward(p.config, p.x, p.weights, f, p.dy, opt);
  return {f.y,    g.dx,   f.routing.topk_idx, f.routing.topk_w, f.logits, g.d_topk_w, g.d_logits, g.d_router,
          g.d_w1, g.d_w2, g.d_shared_w1,      g.d_shared_w2};
}

#define MOK_EXPECT_SAME(field) EXPECT_EQ(first_bit_mismatch(#field, got.field, want.field), "")
void expect_same(const Results& got, const Results& want) {
  MOK_EXPECT_SAME(y);
  MOK_EXPECT_SAME(dx);
  MOK_EXPECT_SAME(topk_idx);
  MOK_EXPECT_SAME(topk_w);
  MOK_EXPECT_SAME(logits);
  MOK_EXPECT_SAME(d_topk_w);
  MOK_EXPECT_SAME(d_logits);
  MOK_EXPECT_SAME(d_router);
  MOK_EXPECT_SAME(d_w1);
  MOK_EXPECT_SAME(d_w2);
  MOK_EXPECT_SAME(d_sw1);
  MOK_EXPECT_SAME(d_sw2);
}

class LayerApi : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_available()) GTEST_SKIP() << "no Hopper GPU";
    cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

LayerConfig shared_sigmoid() {
  LayerConfig c = make_config(2, 40, 128, 64, 8, 3);
  c.score_mode = ScoreMode::sigmoid;
  c.n_group = 4;
  c.topk_group = 2;
  c.routed_scale = 2.5f;
  c.shared_intermediate = 64;
  c.swiglu_limit = 0.75f;
  return c;
}

// On a non-blocking stream, no host synchronisation until the results are read.
TEST_F(LayerApi, EveryRoutingModeMatchesTheReference) {
  for (RoutingMode mode : {RoutingMode::router, RoutingMode::replay_ids, RoutingMode::given}) {
    SCOPED_TRACE("mode " + std::to_string(int(mode)));
    ref::Problem p = ref::make_problem(shared_sigmoid(), 31, ref::RoutingKind::uniform);
    Layer layer(p.config, {});
    Bound b(layer, p, mode);
    b.poison();
    b.run(layer, stream_);
    layer.check();
    expect_same(read(b), reference(p, mode));
  }
}

// The weights are read through the pointers of each call: new weights, same layer, new results.
TEST_F(LayerApi, ReadsTheWeightsOfEachCall) {
  const ref::Problem p = ref::make_problem(shared_sigmoid(), 32);
  ref::Problem q = p;
  q.weights = ref::make_problem(shared_sigmoid(), 33).weights;
  Layer layer(p.config, {});
  Bound b(layer, p, RoutingMode::router);
  b.poison();
  b.run(layer, stream_);
  layer.check();
  expect_same(read(b), reference(p, RoutingMode::router));
  b.set_weights(q.weights);
  b.poison();
  b.run(layer, stream_);
  layer.check();
  expect_same(read(b), reference(q, RoutingMode::router));
}

// Two micro-batches: the second backward adds its weight gradients into the first's, one rounding per
// element, as the reference adds them.
TEST_F(LayerApi, AccumulatesWeightGradientsAsTheReferenceAdds) {
  const ref::Problem p1 = ref::make_problem(shared_sigmoid(), 34), p2 = ref::make_problem(shared_sigmoid(), 35);
  ref::Problem second = p1;  // the same weights, the second batch's tokens
  second.x = p2.x, second.dy = p2.dy;
  Layer layer(p1.config, {});
  Bound b(layer, p1, RoutingMode::router);
  b.poison();
  b.run(layer, stream_);
  layer.check();  // the uploads below go through another stream
  b.x.upload(second.x);
  b.dy.upload(second.dy);
  b.poison(true);
  b.run(layer, stream_, true);
  layer.check();
  Results want = reference(p1, RoutingMode::router);
  const Results two = reference(second, RoutingMode::router);
  for (auto field : {&Results::d_router, &Results::d_w1, &Results::d_w2, &Results::d_sw1, &Results::d_sw2})
    for (size_t i = 0; i < (want.*field).size(); ++i) (want.*field)[i] = (want.*field)[i] + (two.*field)[i];
  const Results got = read(b);
  MOK_EXPECT_SAME(d_router);
  MOK_EXPECT_SAME(d_w1);
  MOK_EXPECT_SAME(d_w2);
  MOK_EXPECT_SAME(d_sw1);
  MOK_EXPECT_SAME(d_sw2);
  EXPECT_EQ(first_bit_mismatch("dx, the second batch's alone", got.dx, two.dx), "");
  EXPECT_NE(first_bit_mismatch("d_w1", got.d_w1, two.d_w1), "") << "d_w1 is not the second batch's alone";
}

// Forward and backward captured in a CUDA graph and replayed give the eager run's bits.
TEST_F(LayerApi, GraphReplayEqualsEager) {
  const ref::Problem p = ref::make_problem(shared_sigmoid(), 36);
  Layer layer(p.config, {});
  Bound b(layer, p, RoutingMode::router);
  b.poison();
  b.run(layer, stream_);
  layer.check();
  const Results eager = read(b);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cuda(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
  b.run(layer, stream_);
  cuda(cudaStreamEndCapture(stream_, &graph));
  cuda(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    b.poison();
    cuda(cudaGraphLaunch(exec, stream_));
    layer.check();
    expect_same(read(b), eager);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// An expert id out of range in a given routing is found on the device; the call returns at once, the
// error is raised by check() (or the next call), and the layer works again afterwards.
TEST_F(LayerApi, DeviceErrorsAreRaisedByCheckThenCleared) {
  ref::Problem p = ref::make_problem(shared_sigmoid(), 37, ref::RoutingKind::uniform);
  Layer layer(p.config, {});
  Bound b(layer, p, RoutingMode::given);
  std::vector<int32_t> bad = p.routing->topk_idx;
  bad[7] = p.config.experts;
  b.topk_idx.upload(bad);
  b.poison();
  EXPECT_NO_THROW(layer.forward(stream_, b.workspace.view().data, b.inputs(), b.outputs()));
  try {
    layer.check();
    FAIL() << "the bad expert id was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("given routing of token " + std::to_string(7 / p.config.top_k)),
              std::string::npos)
        << e.what();
  }
  b.topk_idx.upload(p.routing->topk_idx);
  b.poison();
  b.run(layer, stream_);
  layer.check();
  expect_same(read(b), reference(p, RoutingMode::given));
}

TEST_F(LayerApi, SynchronousModeRaisesAtTheCall) {
  ref::Problem p = ref::make_problem(shared_sigmoid(), 38, ref::RoutingKind::uniform);
  Layer layer(p.config, LaunchConfig{.synchronous = true});
  Bound b(layer, p, RoutingMode::replay_ids);
  std::vector<int32_t> bad = p.routing->topk_idx;
  bad[1] = bad[0];  // an expert twice in token 0
  b.topk_idx.upload(bad);
  EXPECT_THROW(layer.forward(stream_, b.workspace.view().data, b.inputs(), b.outputs()), Error);
}

// The forward needs only its prefix of the workspace (its own allocation here, poisoned, so a read
// past it would fail under memcheck); the backward with a one-tile ring runs many cycles. Both give
// the reference's bits.
TEST_F(LayerApi, ForwardWorkspacePrefixAndSmallRing) {
  const ref::Problem p = ref::make_problem(shared_sigmoid(), 40);
  Layer layer(p.config, LaunchConfig{.ring_rows = 128});
  EXPECT_EQ(layer.ring_rows(), 128);
  ASSERT_LT(layer.workspace_bytes(Pass::forward), layer.workspace_bytes(Pass::backward));
  Bound b(layer, p, RoutingMode::router);
  Buffer forward_ws(DType::u8, {int64_t(layer.workspace_bytes(Pass::forward))});
  forward_ws.poison();
  b.poison();
  layer.poison_workspace(stream_, b.workspace.view().data);
  layer.forward(stream_, forward_ws.view().data, b.inputs(), b.outputs());
  layer.backward(stream_, b.workspace.view().data, b.inputs(), b.outputs(), b.dy.view(), b.grads());
  layer.check();
  expect_same(read(b), reference(p, RoutingMode::router));
}

// The default ring holds an average rank's rows in whole tiles: N k / R, plus a part-empty tile per
// expert of the rank.
TEST_F(LayerApi, DefaultRingHoldsAnAverageRank) {
  const LayerConfig c = shared_sigmoid();  // R 2, T 40, E 8, k 3
  const Layer layer(c, {});
  EXPECT_EQ(layer.ring_rows(), (2 * 40 * 3 / 2 / 128 + 8 / 2) * 128);
}

// bf16 weight gradients (not accumulated) are the fp32 gradients rounded once; accumulating into
// bf16 is refused.
TEST_F(LayerApi, Bf16WeightGradientsAreTheFp32OnesRounded) {
  const ref::Problem p = ref::make_problem(shared_sigmoid(), 41);
  const LayerConfig& c = p.config;
  const int64_t H = c.hidden, I = c.intermediate, E = c.experts, Is = c.shared_intermediate;
  Layer layer(c, {});
  Bound b(layer, p, RoutingMode::router);
  Buffer w1(DType::bf16, {E, 2 * I, H}), w2(DType::bf16, {E, H, I}), sw1(DType::bf16, {2 * Is, H}),
      sw2(DType::bf16, {H, Is});
  for (Buffer* g : {&w1, &w2, &sw1, &sw2}) g->poison();
  GradOutputs grads = b.grads();
  grads.d_w1 = w1.view(), grads.d_w2 = w2.view(), grads.d_shared_w1 = sw1.view(), grads.d_shared_w2 = sw2.view();
  b.poison();
  layer.forward(stream_, b.workspace.view().data, b.inputs(), b.outputs());
  layer.backward(stream_, b.workspace.view().data, b.inputs(), b.outputs(), b.dy.view(), grads);
  layer.check();
  const Results want = reference(p, RoutingMode::router);
  const auto rounded = [](const std::vector<float>& v) {
    std::vector<bf16> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = to_bf16(v[i]);
    return r;
  };
  EXPECT_EQ(first_bit_mismatch("d_w1", w1.download<bf16>(), rounded(want.d_w1)), "");
  EXPECT_EQ(first_bit_mismatch("d_w2", w2.download<bf16>(), rounded(want.d_w2)), "");
  EXPECT_EQ(first_bit_mismatch("d_shared_w1", sw1.download<bf16>(), rounded(want.d_sw1)), "");
  EXPECT_EQ(first_bit_mismatch("d_shared_w2", sw2.download<bf16>(), rounded(want.d_sw2)), "");
  EXPECT_EQ(first_bit_mismatch("dx", b.dx.download<bf16>(), want.dx), "");
  grads.accumulate = true;
  EXPECT_THROW(layer.backward(stream_, b.workspace.view().data, b.inputs(), b.outputs(), b.dy.view(), grads), Error);
  grads = b.grads();
  grads.d_w2 = w2.view();  // fp32 d_w1 with a bf16 d_w2
  EXPECT_THROW(layer.backward(stream_, b.workspace.view().data, b.inputs(), b.outputs(), b.dy.view(), grads), Error);
}

// Bad views are refused at the call, naming the tensor, before anything is enqueued.
TEST_F(LayerApi, RefusesBadViewsNamingThem) {
  const ref::Problem p = ref::make_problem(shared_sigmoid(), 39);
  Layer layer(p.config, {});
  Bound b(layer, p, RoutingMode::router);
  const auto refused = [&](ForwardInputs in, ForwardOutputs out, const char* name) {
    try {
      layer.forward(stream_, b.workspace.view().data, in, out);
      ADD_FAILURE() << name << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  ForwardInputs in = b.inputs();
  in.x.dtype = DType::f32;
  refused(in, b.outputs(), "x [N, H]");
  in = b.inputs();
  in.weights.w1.shape = {1, 2, 3};
  refused(in, b.outputs(), "w1 [E, 2I, H]");
  in = b.inputs();
  in.weights.w2.data = static_cast<uint8_t*>(in.weights.w2.data) + 2;
  refused(in, b.outputs(), "w2 [E, H, I]");
  ForwardOutputs out = b.outputs();
  out.saved.shape = {int64_t(layer.saved_bytes()) - 1};
  refused(b.inputs(), out, "saved");
  out = b.outputs();
  out.logits = {};
  refused(b.inputs(), out, "logits");
  layer.check();  // nothing was enqueued, nothing recorded
}

}  // namespace
}  // namespace mok::gpu
