// GPU tests of the device API (mok/megakernel/layer.h) on caller-owned device buffers: every routing
// mode against the reference bit for bit, weights read at each call, gradient accumulation, a CUDA
// graph and a non-default stream, device errors raised by the next call or check(), bad views refused;
// Layers of colocated shares of one GPU on their shares of the tensors (and one share's error ending
// the others' launches at once), and a Layer on a caller's NCCL communicator. Outputs are poisoned
// before every launch. ctest label gpu; they skip without a Hopper GPU.
#include "mok/megakernel/layer.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

#include "core_test_support.h"
#include "hopper_options.h"
#include "mok/core/fields.h"
#include "mok/core/gradient_add.h"
#include "mok/megakernel/layer_tensors.h"
#include "mok/reference/layer.h"
#include "mok/reference/problem.h"
#include "test_configs.h"

namespace mok::gpu {
namespace {

using mok::test::expect_error;

// A failed call ends the test: an ASSERT here returned from this helper alone, and the test went on (with
// a null stream after a failed cudaStreamCreateWithFlags).
void cuda(cudaError_t e) {
  if (e != cudaSuccess) throw Error(std::string("CUDA: ") + cudaGetErrorString(e));
}

// One problem's tensors on the device, in the layer's vocabulary: share `share` of `shares` (its
// tokens, its experts' w1, w2 and their gradients; the rest whole).
// Where a given routing (replay_ids, given) is passed: in place in the outputs, or as inputs of its own.
enum class GivenRouting { in_place, inputs };

struct Bound {
  LayerConfig c;
  int share = 0, shares = 1;
  RoutingMode mode = RoutingMode::router;
  GivenRouting given = GivenRouting::in_place;
  WeightTensors weights;
  ForwardTensors fwd;
  GradTensors grad;
  DeviceTensor workspace;
  DeviceTensor given_idx, given_w;  // GivenRouting::inputs

  Bound(const Layer& layer, const ref::Problem& p, RoutingMode routing, int g = 0, int count = 1,
        GivenRouting where = GivenRouting::in_place)
      : c(p.config),
        share(g),
        shares(count),
        mode(routing),
        given(where),
        weights(c, p.weights, g, count),
        fwd(c, layer.saved_bytes(), count),
        grad(c, count),
        workspace(DType::u8, {int64_t(layer.workspace_bytes(Pass::backward))}) {
    fwd.x.upload(share_of(p.x, share, shares));
    grad.dy.upload(share_of(p.dy, share, shares));
    const bool inputs = given == GivenRouting::inputs;
    if (inputs && mode != RoutingMode::router) given_idx = DeviceTensor(DType::i32, fwd.topk_idx.view().shape);
    if (inputs && mode == RoutingMode::given) given_w = DeviceTensor(DType::f32, fwd.topk_w.view().shape);
    if (mode != RoutingMode::router)
      (inputs ? given_idx : fwd.topk_idx).upload(share_of(p.routing->topk_idx, share, shares));
    if (mode == RoutingMode::given) (inputs ? given_w : fwd.topk_w).upload(share_of(p.routing->topk_w, share, shares));
  }
  void set_weights(const LayerWeights& w) { weights = WeightTensors(c, w, share, shares); }
  ForwardInputs inputs() const { return {fwd.x.view(), weights.views(), mode, given_idx.view(), given_w.view()}; }
  ForwardOutputs outputs() const { return fwd.views(mode); }
  GradOutputs grads(bool accumulate = false) const { return grad.views(mode, accumulate); }
  void poison(bool accumulate = false) {
    fwd.poison(given == GivenRouting::inputs ? RoutingMode::router : mode);  // a routing given as inputs: all
    grad.poison(accumulate);
  }
  void run(Layer& layer, cudaStream_t stream, bool accumulate = false) {
    layer.forward(stream, workspace.view(), inputs(), outputs());
    layer.backward(stream, workspace.view(), inputs(), outputs(), grad.dy.view(), grads(accumulate));
  }
};

// b's forward and backward captured on `stream` into an instantiated graph, destroyed with it.
struct CapturedRun {
  cudaGraph_t graph{};
  cudaGraphExec_t exec{};
  CapturedRun(Bound& b, Layer& layer, cudaStream_t stream) {
    cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    b.run(layer, stream);
    cuda(cudaStreamEndCapture(stream, &graph));
    cuda(cudaGraphInstantiate(&exec, graph, 0));
  }
  ~CapturedRun() {
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  CapturedRun(const CapturedRun&) = delete;
  CapturedRun& operator=(const CapturedRun&) = delete;
};

struct Results {
  std::vector<bf16> y, dx;
  std::vector<int32_t> topk_idx;
  std::vector<float> topk_w, logits, d_topk_w, d_logits, d_router, d_w1, d_w2, d_sw1, d_sw2;
};

Results read(const Bound& b) {
  const bool router = b.mode != RoutingMode::given;
  const ForwardTensors& f = b.fwd;
  const GradTensors& g = b.grad;
  return {f.y.download<bf16>(),
          g.dx.download<bf16>(),
          f.topk_idx.download<int32_t>(),
          f.topk_w.download<float>(),
          router ? f.logits.download<float>() : std::vector<float>{},
          g.d_topk_w.download<float>(),
          router ? g.d_logits.download<float>() : std::vector<float>{},
          router ? g.d_router.download<float>() : std::vector<float>{},
          g.d_w1.download<float>(),
          g.d_w2.download<float>(),
          g.d_shared_w1.download<float>(),
          g.d_shared_w2.download<float>()};
}

// The reference's results in the launch's recompute mode and weight gradients.
Results reference(const ref::Problem& p, RoutingMode mode, const LaunchConfig& launch = {}) {
  ref::Options opt = hopper_options(launch.recompute);
  opt.replay_ids = mode == RoutingMode::replay_ids;
  opt.fp8_weight_gradients = launch.fp8_weight_gradients;
  const Routing* given = mode == RoutingMode::router ? nullptr : &*p.routing;
  const Forward f = ref::forward(p.config, p.x, p.weights, given, opt);
  const Gradients g = ref::backward(p.config, p.x, p.weights, f, p.dy, opt);
  return {f.y,    g.dx,   f.routing.topk_idx, f.routing.topk_w, f.logits, g.d_topk_w, g.d_logits, g.d_router,
          g.d_w1, g.d_w2, g.d_shared_w1,      g.d_shared_w2};
}

// Bit for bit, and neither side holding the poison (an element no launch wrote): where both are GPU runs (a
// graph's replay against the eager calls) such an element would agree.
#define MOK_EXPECT_SAME(field)                                            \
  EXPECT_EQ(first_bit_mismatch(#field, got.field, want.field), "");       \
  EXPECT_EQ(first_poisoned(#field, got.field), "") << "nothing wrote it"; \
  EXPECT_EQ(first_poisoned(#field, want.field), "") << "(want) nothing wrote it"
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
  void bf16_weight_gradients_are_the_fp32_ones_rounded_or_added(const LayerConfig& config, const LaunchConfig& launch);
  // Each (config, ring rows) with h saved and recomputed, skewed routing, the workspace poisoned
  // before the forward and again before the backward: the reference's bits.
  void expect_sections_over_one_another_match(std::span<const std::pair<LayerConfig, int>> runs, uint64_t seed) {
    for (const auto& [c, ring_rows] : runs)
      for (const bool recompute : {false, true})
        for (const bool weights_given : {false, true}) {
          if (weights_given && c.precision != Precision::fp8) continue;
          SCOPED_TRACE("R " + std::to_string(c.ranks) + ", ring " + std::to_string(ring_rows) +
                       (recompute ? ", recompute" : "") + (weights_given ? ", weights given" : ""));
          const ref::Problem p = ref::make_problem(c, seed, ref::RoutingKind::zipf);
          Layer layer(c,
                      LaunchConfig{.ring_rows = ring_rows, .recompute = recompute, .fp8_weights_given = weights_given});
          Bound b(layer, p, RoutingMode::given);
          ForwardInputs in = b.inputs();
          DeviceTensor quantized;  // the caller's quantized weights
          if (weights_given) {
            quantized = DeviceTensor(DType::u8, {int64_t(layer.fp8_weights_bytes())});
            layer.quantize_weights(stream_, b.weights.views(), quantized.view());
            in.fp8_weights = quantized.view();
          }
          b.poison();
          const TensorView ws = b.workspace.view();
          layer.poison_workspace(stream_, ws);
          layer.forward(stream_, ws, in, b.outputs());
          layer.poison_workspace(stream_, ws);
          layer.backward(stream_, ws, in, b.outputs(), b.grad.dy.view(), b.grads());
          layer.check();
          expect_same(read(b), reference(p, RoutingMode::given, {.recompute = recompute}));
        }
  }

  cudaStream_t stream_ = nullptr;
};

LayerConfig shared_sigmoid() { return with_every_branch(make_config(2, 40, 128, 64, 8, 3)); }

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

// A given routing passed as inputs of its own: the kernel writes it into the (poisoned) outputs, with
// the bits of the in-place path, and leaves the inputs as they were.
TEST_F(LayerApi, GivenRoutingAsInputsMatchesTheReference) {
  for (RoutingMode mode : {RoutingMode::replay_ids, RoutingMode::given}) {
    SCOPED_TRACE("mode " + std::to_string(int(mode)));
    ref::Problem p = ref::make_problem(shared_sigmoid(), 32, ref::RoutingKind::zipf);
    Layer layer(p.config, {});
    Bound b(layer, p, mode, 0, 1, GivenRouting::inputs);
    b.poison();
    b.run(layer, stream_);
    layer.check();
    expect_same(read(b), reference(p, mode));
    EXPECT_EQ(first_bit_mismatch("given topk_idx", b.given_idx.download<int32_t>(), p.routing->topk_idx), "");
    if (mode == RoutingMode::given) {
      EXPECT_EQ(first_bit_mismatch("given topk_w", b.given_w.download<float>(), p.routing->topk_w), "");
    }
  }
}

// Recompute mode: the saved buffer holds no xe and h, nor the shared expert's h and a (exactly their
// sections fewer, that many more backward workspace bytes; the forward's holds its GEMMs' operands xe
// and the shared expert's a more, less the (token, slot) rows, which it pushes over xe on one GPU: the
// routed a is the workspace's in either mode), the backward pulls
// xe and recomputes h (and a from it, as from a saved h), and the shared
// expert's, with the forward's code into a workspace poisoned after the forward, and every output and
// gradient is the reference's in recompute mode.
TEST_F(LayerApi, RecomputeModeMatchesTheReference) {
  for (RoutingMode mode : {RoutingMode::router, RoutingMode::replay_ids, RoutingMode::given}) {
    SCOPED_TRACE("mode " + std::to_string(int(mode)));
    ref::Problem p = ref::make_problem(shared_sigmoid(), 37, ref::RoutingKind::uniform);
    const LayerConfig& c = p.config;
    const auto section = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
    const size_t N = c.tokens(), Is = c.shared_intermediate;
    const size_t P = padded_rows(c);
    const size_t moved = P * (2 * c.hidden + 4 * c.intermediate) + section(N * 2 * Is * 2) + section(N * Is * 2);
    const size_t operands = P * 2 * c.hidden + section(N * Is * 2) - section(N * c.top_k * c.hidden * 2);
    const Layer saving(c, {});
    Layer layer(c, LaunchConfig{.recompute = true});
    EXPECT_EQ(saving.saved_bytes() - layer.saved_bytes(), moved);
    EXPECT_EQ(layer.workspace_bytes(Pass::forward) - saving.workspace_bytes(Pass::forward), operands);
    EXPECT_EQ(layer.workspace_bytes(Pass::backward) - saving.workspace_bytes(Pass::backward), moved);
    Bound b(layer, p, mode);
    b.poison();
    const TensorView ws = b.workspace.view();
    layer.poison_workspace(stream_, ws);
    layer.forward(stream_, ws, b.inputs(), b.outputs());
    layer.poison_workspace(stream_, ws);  // the backward's activations are its own, not the forward's left over
    layer.backward(stream_, ws, b.inputs(), b.outputs(), b.grad.dy.view(), b.grads());
    layer.check();
    expect_same(read(b), reference(p, mode, {.recompute = true}));
  }
}

// The backward's sections over one another (workspace_layout; LayerMemory.BackwardSectionsShareBytesByLifetime):
// with one ring cycle whatever the routing (one rank's default ring; two ranks' ring of a rank's most
// tiles) dh over the ring, the dx_j past dh over g and dye over them, all over the forward's slots
// (recomputing, dye and shared_dh over the ring and g); with several cycles (a one-tile ring) dye and
// shared_dh over the ring and g. Skewed routing, a shared expert, h saved or recomputed;
// the workspace poisoned before the forward and again before the backward: the reference's bits.
TEST_F(LayerApi, BackwardSectionsOverOneAnotherMatchTheReference) {
  const LayerConfig one_rank = with_every_branch(make_config(1, 80, 128, 64, 8, 3));
  const std::pair<LayerConfig, int> runs[] = {{one_rank, 0}, {shared_sigmoid(), 640}, {shared_sigmoid(), 128}};
  expect_sections_over_one_another_match(runs, 44);
}

// A backward given BackwardScratch (the PyTorch op's storing backward gives both): its scratch in d_w1, dW2's
// tiles before dW1's, and dh over the saved h, with one ring cycle (a over the ring, the dx_j over the rest)
// and several; skewed routing, a shared expert, bf16 and fp8 (dh over h alone: the scratch stays in the
// workspace). Its workspace exactly workspace_bytes(Pass::backward, scratch) and poisoned, d_w1 poisoned
// (GradTensors::poison): the reference's bits. With accumulate, the scratch in d_w1 is refused.
TEST_F(LayerApi, BackwardScratchInDw1AndOverSavedHMatchesTheReference) {
  LayerConfig bf16 = with_every_branch(make_config(1, 80, 512, 256, 8, 3));  // a scratch that fits in d_w1
  bf16.shared_intermediate = 128;
  LayerConfig fp8 = bf16;
  fp8.precision = Precision::fp8;
  const std::pair<LayerConfig, int> runs[] = {{bf16, 0}, {bf16, 128}, {fp8, 0}};
  for (const auto& [c, ring_rows] : runs)
    for (const BackwardScratch scratch :
         {BackwardScratch{true, false}, BackwardScratch{false, true}, BackwardScratch{true, true}}) {
      SCOPED_TRACE(std::string(c.precision == Precision::fp8 ? "fp8" : "bf16") + ", ring " + std::to_string(ring_rows) +
                   (scratch.in_d_w1 ? ", in d_w1" : "") + (scratch.dh_over_saved_h ? ", dh over h" : ""));
      const ref::Problem p = ref::make_problem(c, 46, ref::RoutingKind::zipf);
      Layer layer(c, LaunchConfig{.ring_rows = ring_rows});
      const size_t bytes = layer.workspace_bytes(Pass::backward, scratch);
      if (scratch.in_d_w1 && c.precision == Precision::bf16) {
        EXPECT_LT(bytes, layer.workspace_bytes(Pass::backward));
      }
      Bound b(layer, p, RoutingMode::given);
      b.poison();
      layer.forward(stream_, b.workspace.view(), b.inputs(), b.outputs());
      DeviceTensor workspace(DType::u8, {int64_t(bytes)});
      workspace.poison();
      GradOutputs grads = b.grads();
      grads.scratch = scratch;
      layer.backward(stream_, workspace.view(), b.inputs(), b.outputs(), b.grad.dy.view(), grads);
      layer.check();
      expect_same(read(b), reference(p, RoutingMode::given));
      if (!scratch.in_d_w1) continue;
      grads.accumulate = true;
      expect_error([&] { layer.backward(stream_, workspace.view(), b.inputs(), b.outputs(), b.grad.dy.view(), grads); },
                   "GradOutputs::scratch.in_d_w1 with accumulate");
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
  b.fwd.x.upload(second.x);
  b.grad.dy.upload(second.dy);
  b.poison(true);
  b.run(layer, stream_, true);
  layer.check();
  Results want = reference(p1, RoutingMode::router);
  const Results two = reference(second, RoutingMode::router);
  for (auto field : {&Results::d_router, &Results::d_w1, &Results::d_w2, &Results::d_sw1, &Results::d_sw2})
    for (size_t i = 0; i < (want.*field).size(); ++i)
      (want.*field)[i] = add_f32_gradient((want.*field)[i], (two.*field)[i]);
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
  const CapturedRun captured(b, layer, stream_);
  for (int replay = 0; replay < 2; ++replay) {
    b.poison();
    cuda(cudaGraphLaunch(captured.exec, stream_));
    layer.check();
    expect_same(read(b), eager);
  }
}

// A graph replays the calls on a stream of its own: check() waits for the GPU, not for the stream the
// calls were captured on (it read the error word before the replay's copy landed, and raised nothing).
TEST_F(LayerApi, CheckWaitsForAGraphReplayedOnAnotherStream) {
  ref::Problem p = ref::make_problem(shared_sigmoid(), 37, ref::RoutingKind::uniform);
  Layer layer(p.config, {});
  Bound b(layer, p, RoutingMode::given);
  const CapturedRun captured(b, layer, stream_);
  std::vector<int32_t> bad = p.routing->topk_idx;
  bad[7] = p.config.experts;
  b.fwd.topk_idx.upload(bad);
  cudaStream_t replay;
  cuda(cudaStreamCreateWithFlags(&replay, cudaStreamNonBlocking));
  cuda(cudaGraphLaunch(captured.exec, replay));
  expect_error([&] { layer.check(); }, "given routing of token " + std::to_string(7 / p.config.top_k));
  layer.check();  // raised once, then cleared
  cuda(cudaStreamDestroy(replay));
}

// An expert id out of range in a given routing is found on the device; the call returns at once, the
// error is raised by check() (or the next call), and the layer works again afterwards.
TEST_F(LayerApi, DeviceErrorsAreRaisedByCheckThenCleared) {
  ref::Problem p = ref::make_problem(shared_sigmoid(), 37, ref::RoutingKind::uniform);
  Layer layer(p.config, {});
  Bound b(layer, p, RoutingMode::given);
  std::vector<int32_t> bad = p.routing->topk_idx;
  bad[7] = p.config.experts;
  b.fwd.topk_idx.upload(bad);
  b.poison();
  EXPECT_NO_THROW(layer.forward(stream_, b.workspace.view(), b.inputs(), b.outputs()));
  try {
    layer.check();
    FAIL() << "the bad expert id was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("given routing of token " + std::to_string(7 / p.config.top_k)),
              std::string::npos)
        << e.what();
  }
  b.fwd.topk_idx.upload(p.routing->topk_idx);
  b.poison();
  b.run(layer, stream_);
  layer.check();
  expect_same(read(b), reference(p, RoutingMode::given));
}

// Holds `stream` at a host function until release() (or the destructor, which also waits for the stream,
// so that a test failing between the two leaves no stream blocked and no function reading a freed flag).
// Under compute-sanitizer's initcheck a launch queued behind it does not return: h200_session.sh leaves
// LayerApi.CallsBehindAnErrorFillTheirOutputsWithNan out of initcheck.
class StreamHold {
 public:
  explicit StreamHold(cudaStream_t stream) : stream_(stream) {
    cuda(cudaLaunchHostFunc(
        stream,
        [](void* go) {
          while (!static_cast<std::atomic<bool>*>(go)->load()) std::this_thread::yield();
        },
        &go_));
  }
  ~StreamHold() {
    release();
    (void)cudaStreamSynchronize(stream_);  // a destructor cannot throw; the test checks the stream after
  }
  StreamHold(const StreamHold&) = delete;
  StreamHold& operator=(const StreamHold&) = delete;
  void release() { go_ = true; }

 private:
  cudaStream_t stream_;
  std::atomic<bool> go_{false};
};

// Every element of `t` is the canonical NaN of its dtype (Word: uint16_t for bf16, uint32_t for fp32).
template <class Word>
void expect_all_nan(const DeviceTensor& t, Word nan, const char* name) {
  const std::vector<Word> words = t.download<Word>();
  const auto other = std::find_if(words.begin(), words.end(), [&](Word w) { return w != nan; });
  EXPECT_EQ(other, words.end()) << name << " element " << (other - words.begin()) << " of " << words.size()
                                << " is not NaN";
}

// A call queued behind a launch that stops on an error (here a given expert id out of range) fills its
// outputs with NaN: the forward's y (not the routing it reads in place), the backward's dx, d_topk_w and weight
// gradients, but not the accumulators it would add into. The stream is held by a host function until both calls are
// queued, so that the backward is enqueued before the forward's error can be raised at its call.
TEST_F(LayerApi, CallsBehindAnErrorFillTheirOutputsWithNan) {
  ref::Problem p = ref::make_problem(shared_sigmoid(), 44, ref::RoutingKind::uniform);
  Layer layer(p.config, {});
  for (const bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulate" : "write");
    Bound b(layer, p, RoutingMode::given);
    std::vector<int32_t> bad = p.routing->topk_idx;
    bad[5] = p.config.experts;
    b.fwd.topk_idx.upload(bad);
    b.poison(accumulate);  // 0xff bytes: a NaN, but not the canonical one
    const std::vector<float> held(b.grad.d_w1.download<float>().size(), 0.5f);
    if (accumulate) b.grad.d_w1.upload(held);
    StreamHold hold(stream_);
    b.run(layer, stream_, accumulate);
    hold.release();
    cuda(cudaStreamSynchronize(stream_));
    expect_all_nan(b.fwd.y, kCanonicalNanBf16, "y");
    EXPECT_EQ(b.fwd.topk_w.download<float>(), p.routing->topk_w) << "the routing read in place was written";
    expect_all_nan(b.grad.dx, kCanonicalNanBf16, "dx");
    expect_all_nan(b.grad.d_topk_w, kCanonicalNanF32, "d_topk_w");
    if (accumulate)
      EXPECT_EQ(b.grad.d_w1.download<float>(), held) << "an accumulator was written";
    else
      for (const DeviceTensor* t : {&b.grad.d_w1, &b.grad.d_w2, &b.grad.d_shared_w1, &b.grad.d_shared_w2})
        expect_all_nan(*t, kCanonicalNanF32, "a weight gradient");
    expect_error([&] { layer.check(); }, "given routing of token " + std::to_string(5 / p.config.top_k));
  }
  Bound b(layer, p, RoutingMode::given);
  b.poison();
  b.run(layer, stream_);
  layer.check();
  expect_same(read(b), reference(p, RoutingMode::given));
}

// A non-finite expert_bias (which the reference refuses) is found on the device before any token is
// selected, naming the smallest such expert; the layer works again afterwards.
TEST_F(LayerApi, NonFiniteExpertBiasIsRaisedNamingTheExpert) {
  const ref::Problem p = ref::make_problem(shared_sigmoid(), 45);
  ASSERT_EQ(p.weights.expert_bias.size(), size_t(p.config.experts));
  LayerWeights bad = p.weights;
  bad.expert_bias[5] = std::numeric_limits<float>::infinity();
  bad.expert_bias[3] = std::numeric_limits<float>::quiet_NaN();
  Layer layer(p.config, {});
  Bound b(layer, p, RoutingMode::router);
  b.set_weights(bad);
  b.poison();
  layer.forward(stream_, b.workspace.view(), b.inputs(), b.outputs());
  expect_error([&] { layer.check(); }, "expert_bias of expert 3 is NaN or Inf");
  expect_all_nan(b.fwd.logits, kCanonicalNanF32, "logits");  // the router's outputs, filled behind the error
  expect_all_nan(b.fwd.topk_w, kCanonicalNanF32, "topk_w");
  b.set_weights(p.weights);
  b.poison();
  b.run(layer, stream_);
  layer.check();
  expect_same(read(b), reference(p, RoutingMode::router));
}

// Bad tokens found by threads of many blocks at once: the error names the smallest, launch after launch,
// as the reference does. Finite inputs whose logits overflow (the largest bf16 in a token's row, router
// weights 1), and a given routing with an expert id out of range.
TEST_F(LayerApi, DeviceErrorsNameTheSmallestBadToken) {
  ref::Problem p = ref::make_problem(make_config(1, 4096, 128, 64, 8, 2), 50, ref::RoutingKind::uniform);
  const int H = p.config.hidden, k = p.config.top_k;
  const int bad[] = {3001, 270, 4095, 271, 1234};
  ref::Problem overflowing = p, misrouted = p;
  std::fill(overflowing.weights.router.begin(), overflowing.weights.router.end(), 1.0f);
  for (int t : bad) {
    std::fill_n(overflowing.x.begin() + long(t) * H, H, bf16{0x7f7f});
    misrouted.routing->topk_idx[size_t(t) * k + 1] = p.config.experts;
  }
  const auto reference_error = [](const ref::Problem& q, const Routing* given) -> std::string {
    try {
      ref::forward(q.config, q.x, q.weights, given, hopper_options());
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(reference_error(overflowing, nullptr).find("router logit of token 270 overflows"), std::string::npos);
  EXPECT_NE(reference_error(misrouted, &*misrouted.routing).find("topk_idx[270, 1]"), std::string::npos);
  for (const auto& [q, mode, want] :
       {std::tuple{&overflowing, RoutingMode::router, "router logit of token 270 overflows"},
        std::tuple{&misrouted, RoutingMode::given, "given routing of token 270 "}}) {
    Layer layer(q->config, {});
    Bound b(layer, *q, mode);
    for (int run = 0; run < 8; ++run) {
      b.poison();
      layer.forward(stream_, b.workspace.view(), b.inputs(), b.outputs());
      try {
        layer.check();
        ADD_FAILURE() << "the bad tokens were not reported";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << "run " << run << ": " << e.what();
      }
    }
  }
  // A launch queued behind the failed one before its error is raised checks its own inputs (token 5
  // bad) before its first barrier: the error stays the first launch's.
  ref::Problem later = p;
  later.routing->topk_idx[5 * size_t(k)] = p.config.experts;
  Layer layer(p.config, {});
  Bound first(layer, misrouted, RoutingMode::given), second(layer, later, RoutingMode::given);
  std::string raised = "nothing raised";
  try {
    layer.forward(stream_, first.workspace.view(), first.inputs(), first.outputs());
    layer.forward(stream_, second.workspace.view(), second.inputs(), second.outputs());
    layer.check();
  } catch (const Error& e) {
    raised = e.what();
  }
  EXPECT_NE(raised.find("given routing of token 270 "), std::string::npos) << raised;
}

// p with token g's slot j routed to the first expert the token does not route to: a routing that
// differs from p's at token g alone.
ref::Problem rerouted(const ref::Problem& p, int g, int j) {
  ref::Problem q = p;
  const int k = p.config.top_k;
  int32_t* token = q.routing->topk_idx.data() + size_t(g) * k;
  for (int e = 0; e < p.config.experts; ++e)
    if (std::find(token, token + k, e) == token + k) {
      token[j] = e;
      return q;
    }
  ADD_FAILURE() << "token " << g << " routes to every expert";
  return q;
}

// The backward refuses the saved buffer of a forward of another routing (it would give gradients of
// neither), naming the first token the routings differ at, and one that holds no layout (zeros), with
// or without recompute, before anything is read by the layout; then the layer works again.
TEST_F(LayerApi, BackwardRefusesTheSavedBufferOfAnotherRouting) {
  const ref::Problem p = ref::make_problem(shared_sigmoid(), 52, ref::RoutingKind::uniform);
  const ref::Problem q = rerouted(p, 57, 1);
  for (const bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recompute" : "saved h");
    Layer layer(p.config, LaunchConfig{.recompute = recompute});
    Bound b(layer, p, RoutingMode::given), other(layer, q, RoutingMode::given);
    b.poison();
    other.poison();
    const TensorView ws = b.workspace.view();
    layer.forward(stream_, ws, b.inputs(), b.outputs());
    layer.forward(stream_, other.workspace.view(), other.inputs(), other.outputs());
    layer.check();
    DeviceTensor zeros(DType::u8, {int64_t(layer.saved_bytes())});
    cuda(cudaMemset(zeros.view().data, 0, layer.saved_bytes()));
    for (const auto& [saved, what] :
         {std::pair{other.fwd.saved.view(), "its dispatch layout routes token 57 otherwise"},
          std::pair{zeros.view(), "saved holds no dispatch layout of this config"}}) {
      ForwardOutputs mixed = b.outputs();
      mixed.saved = saved;
      expect_error(
          [&] {
            layer.backward(stream_, ws, b.inputs(), mixed, b.grad.dy.view(), b.grads());
            layer.check();
          },
          what);
    }
    b.poison();
    b.run(layer, stream_);
    layer.check();
    expect_same(read(b), reference(p, RoutingMode::given, {.recompute = recompute}));
  }
}

// Blocks in pairs (LaunchConfig::paired_blocks: an expert GEMM's two blocks of a cluster load a B their
// tiles share once for both, and a block without a tile runs its peer's as a stand-in): the reference's
// bits, bf16 and fp8 (its weight gradients bf16 and fp8), h saved and recomputed, on a skewed routing
// whose experts hold odd and even tile counts (empty ring slots: stand-ins), with a few blocks (many tiles
// each, pairs that share B and pairs across experts that do not) and with all.
TEST_F(LayerApi, PairedBlocksMatchTheReference) {
  LayerConfig bf16 = with_every_branch(make_config(2, 320, 256, 256, 8, 3)), fp8 = bf16;
  fp8.shared_intermediate = 128;
  fp8.precision = Precision::fp8;
  for (const LayerConfig& c : {bf16, fp8})
    for (const int blocks : {4, 0})
      for (const bool recompute : {false, true})
        for (const bool fp8_weight_gradients : {false, true}) {
          if (fp8_weight_gradients && c.precision != Precision::fp8) continue;
          SCOPED_TRACE(std::string(c.precision == Precision::fp8 ? "fp8" : "bf16") + ", blocks " +
                       std::to_string(blocks) + (recompute ? ", recompute" : "") +
                       (fp8_weight_gradients ? ", fp8 weight gradients" : ""));
          const ref::Problem p = ref::make_problem(c, 61, ref::RoutingKind::zipf);
          const LaunchConfig launch{.blocks = blocks,
                                    .recompute = recompute,
                                    .fp8_weight_gradients = fp8_weight_gradients,
                                    .paired_blocks = true};
          Layer layer(c, launch);
          Bound b(layer, p, RoutingMode::given);
          b.poison();
          b.run(layer, stream_);
          layer.check();
          expect_same(read(b), reference(p, RoutingMode::given, launch));
        }
}

TEST_F(LayerApi, SynchronousModeRaisesAtTheCall) {
  ref::Problem p = ref::make_problem(shared_sigmoid(), 38, ref::RoutingKind::uniform);
  Layer layer(p.config, LaunchConfig{.synchronous = true});
  Bound b(layer, p, RoutingMode::replay_ids);
  std::vector<int32_t> bad = p.routing->topk_idx;
  bad[1] = bad[0];  // an expert twice in token 0
  b.fwd.topk_idx.upload(bad);
  expect_error([&] { layer.forward(stream_, b.workspace.view(), b.inputs(), b.outputs()); },
               "the given routing of token 0 has an expert id outside");
}

// The forward needs only its prefix of the workspace: given the prefix of a poisoned allocation of the
// backward's size, it leaves the bytes past it as they were (in recompute mode h and the shared expert's
// h lie there, in the fp8 mode also xe and a: only the backward writes them), and what it reads there
// would be poison; the backward, on a workspace of its own, with a one-tile ring runs many cycles. Both
// give the reference's bits, bf16 and fp8, saved and recomputed.
TEST_F(LayerApi, ForwardWorkspacePrefixAndSmallRing) {
  for (const LayerConfig& config : {shared_sigmoid(), fp8_every_branch()})
    for (const bool recompute : {false, true}) {
      SCOPED_TRACE(std::string(config.precision == Precision::fp8 ? "fp8" : "bf16") + (recompute ? ", recompute" : ""));
      const ref::Problem p = ref::make_problem(config, 40);
      const LaunchConfig launch{.ring_rows = 128, .recompute = recompute};
      Layer layer(p.config, launch);
      EXPECT_EQ(layer.ring_rows(), 128);
      const size_t forward_bytes = layer.workspace_bytes(Pass::forward);
      const size_t backward_bytes = layer.workspace_bytes(Pass::backward);
      ASSERT_LT(forward_bytes, backward_bytes);
      Bound b(layer, p, RoutingMode::router);
      DeviceTensor forward_ws(DType::u8, {int64_t(backward_bytes)});
      forward_ws.poison();
      TensorView prefix = forward_ws.view();
      prefix.shape = {int64_t(forward_bytes)};
      b.poison();
      layer.poison_workspace(stream_, b.workspace.view());
      layer.forward(stream_, prefix, b.inputs(), b.outputs());
      layer.backward(stream_, b.workspace.view(), b.inputs(), b.outputs(), b.grad.dy.view(), b.grads());
      layer.check();
      const std::vector<uint8_t> past = forward_ws.download<uint8_t>(forward_bytes, backward_bytes - forward_bytes);
      EXPECT_EQ(std::count(past.begin(), past.end(), uint8_t(0xff)), long(past.size()));
      expect_same(read(b), reference(p, RoutingMode::router, launch));
    }
}

// The default ring holds an average rank's rows in whole tiles: N k / R, plus a part-empty tile per
// expert of the rank.
TEST_F(LayerApi, DefaultRingHoldsAnAverageRank) {
  const LayerConfig c = shared_sigmoid();  // R 2, T 40, E 8, k 3
  const Layer layer(c, {});
  EXPECT_EQ(layer.ring_rows(), (2 * 40 * 3 / 2 / 128 + 8 / 2) * 128);
}

// bf16 weight gradients are the fp32 gradients rounded once; accumulated into bf16 tensors, each
// element is add_bf16_gradient of what the tensor held (autograd's add of the rounded gradient). The
// second config's gradients have tiles of 64 valid rows and of 64 and 192 columns (store_rows_by_tma's
// consumer past the gradient's rows, and partial chunk counts). The third runs the fp8 weight gradients' chain (E4M3
// operands), whose epilogue is the same.
TEST_F(LayerApi, Bf16WeightGradientsAreTheFp32OnesRoundedOrAddedAsAutogradAdds) {
  const std::pair<LayerConfig, LaunchConfig> runs[] = {{shared_sigmoid(), {}},
                                                       {with_every_branch(make_config(2, 40, 192, 128, 8, 3)), {}},
                                                       {fp8_every_branch(), {.fp8_weight_gradients = true}}};
  for (const auto& [config, launch] : runs) {
    SCOPED_TRACE("H " + std::to_string(config.hidden) + (launch.fp8_weight_gradients ? ", fp8 weight gradients" : ""));
    bf16_weight_gradients_are_the_fp32_ones_rounded_or_added(config, launch);
  }
}

void LayerApi::bf16_weight_gradients_are_the_fp32_ones_rounded_or_added(const LayerConfig& config,
                                                                        const LaunchConfig& launch) {
  const ref::Problem p = ref::make_problem(config, 41);
  const LayerConfig& c = p.config;
  const int64_t H = c.hidden, I = c.intermediate, E = c.experts, Is = c.shared_intermediate;
  Layer layer(c, launch);
  Bound b(layer, p, RoutingMode::router);
  DeviceTensor w1(DType::bf16, {E, 2 * I, H}), w2(DType::bf16, {E, H, I}), sw1(DType::bf16, {2 * Is, H}),
      sw2(DType::bf16, {H, Is});
  for (DeviceTensor* g : {&w1, &w2, &sw1, &sw2}) g->poison();
  GradOutputs grads = b.grads();
  grads.d_w1 = w1.view(), grads.d_w2 = w2.view(), grads.d_shared_w1 = sw1.view(), grads.d_shared_w2 = sw2.view();
  b.poison();
  layer.forward(stream_, b.workspace.view(), b.inputs(), b.outputs());
  layer.backward(stream_, b.workspace.view(), b.inputs(), b.outputs(), b.grad.dy.view(), grads);
  layer.check();
  const Results want = reference(p, RoutingMode::router, launch);
  const auto rounded = [](const std::vector<float>& v) {
    std::vector<bf16> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = to_bf16(v[i]);
    return r;
  };
  EXPECT_EQ(first_bit_mismatch("d_w1", w1.download<bf16>(), rounded(want.d_w1)), "");
  EXPECT_EQ(first_bit_mismatch("d_w2", w2.download<bf16>(), rounded(want.d_w2)), "");
  EXPECT_EQ(first_bit_mismatch("d_shared_w1", sw1.download<bf16>(), rounded(want.d_sw1)), "");
  EXPECT_EQ(first_bit_mismatch("d_shared_w2", sw2.download<bf16>(), rounded(want.d_sw2)), "");
  EXPECT_EQ(first_bit_mismatch("dx", b.grad.dx.download<bf16>(), want.dx), "");
  // Held values unlike the gradients (each element's neighbour's gradient, negated), so a sum that
  // rounds once, or adds the wrong element, shows.
  const auto held = [](const std::vector<float>& g) {
    std::vector<bf16> h(g.size());
    for (size_t i = 0; i < g.size(); ++i) h[i] = to_bf16(-g[(i + 1) % g.size()] * 0.75f);
    return h;
  };
  const auto added = [](std::vector<bf16> h, const std::vector<float>& g) {
    for (size_t i = 0; i < g.size(); ++i) h[i] = add_bf16_gradient(h[i], g[i]);
    return h;
  };
  w1.upload(held(want.d_w1)), w2.upload(held(want.d_w2));
  sw1.upload(held(want.d_sw1)), sw2.upload(held(want.d_sw2));
  grads.accumulate = true;
  layer.backward(stream_, b.workspace.view(), b.inputs(), b.outputs(), b.grad.dy.view(), grads);
  layer.check();
  EXPECT_EQ(first_bit_mismatch("d_w1 added", w1.download<bf16>(), added(held(want.d_w1), want.d_w1)), "");
  EXPECT_EQ(first_bit_mismatch("d_w2 added", w2.download<bf16>(), added(held(want.d_w2), want.d_w2)), "");
  EXPECT_EQ(first_bit_mismatch("d_shared_w1 added", sw1.download<bf16>(), added(held(want.d_sw1), want.d_sw1)), "");
  EXPECT_EQ(first_bit_mismatch("d_shared_w2 added", sw2.download<bf16>(), added(held(want.d_sw2), want.d_sw2)), "");
  grads = b.grads();
  grads.d_w2 = w2.view();  // fp32 d_w1 with a bf16 d_w2
  expect_error([&] { layer.backward(stream_, b.workspace.view(), b.inputs(), b.outputs(), b.grad.dy.view(), grads); },
               "d_w2 [E, H, I] has dtype bfloat16");
}

// The forward writes every byte of the saved buffer (its gaps are zeroed): forwards into a buffer of
// 0xff bytes and into one of zeros leave the same bytes (D1 for all of saved, which the op returns).
TEST_F(LayerApi, SavedBytesDoNotDependOnWhatTheDeviceTensorHeld) {
  const ref::Problem p = ref::make_problem(shared_sigmoid(), 42);
  Layer layer(p.config, {});
  Bound b(layer, p, RoutingMode::router);
  b.poison();
  layer.forward(stream_, b.workspace.view(), b.inputs(), b.outputs());
  layer.check();
  const std::vector<uint8_t> over_ff = b.fwd.saved.download<uint8_t>();
  cuda(cudaMemset(b.fwd.saved.view().data, 0, over_ff.size()));
  cuda(cudaDeviceSynchronize());
  layer.forward(stream_, b.workspace.view(), b.inputs(), b.outputs());
  layer.check();
  const std::vector<uint8_t> over_zero = b.fwd.saved.download<uint8_t>();
  ASSERT_EQ(over_ff.size(), over_zero.size());
  const auto [ff, zero] = std::mismatch(over_ff.begin(), over_ff.end(), over_zero.begin());
  EXPECT_EQ(ff, over_ff.end()) << "saved byte " << (ff - over_ff.begin()) << " of " << over_ff.size() << " differs";
}

// A tensor a call writes over another of its tensors, or over its workspace, is refused at the call, naming
// both (dx over dy gave wrong weight gradients without a word: the backward reads dy again after writing
// dx). A given routing that is its own output is the routing read in place: run, with the reference's bits.
TEST_F(LayerApi, RefusesTensorsOverlappingWhatTheCallWrites) {
  const ref::Problem p = ref::make_problem(shared_sigmoid(), 41, ref::RoutingKind::uniform);
  Layer layer(p.config, {});
  Bound b(layer, p, RoutingMode::given);
  const TensorView ws = b.workspace.view();
  ForwardOutputs out = b.outputs();
  out.y = b.inputs().x;
  expect_error([&] { layer.forward(stream_, ws, b.inputs(), out); }, "x and y share memory, and the call writes y");
  out = b.outputs();
  out.saved.data = ws.data;  // inside the workspace
  expect_error([&] { layer.forward(stream_, ws, b.inputs(), out); },
               "saved and workspace share memory, and the call writes saved");
  GradOutputs g = b.grads();
  g.dx = b.grad.dy.view();
  expect_error([&] { layer.backward(stream_, ws, b.inputs(), b.outputs(), b.grad.dy.view(), g); },
               "dy and dx share memory, and the call writes dx");
  g = b.grads(true);
  g.d_w2.data = static_cast<uint8_t*>(g.d_w1.data) + 16;  // inside d_w1
  expect_error([&] { layer.backward(stream_, ws, b.inputs(), b.outputs(), b.grad.dy.view(), g); },
               "d_w1 and d_w2 share memory");
  layer.check();  // nothing was enqueued, nothing recorded
  ForwardInputs in = b.inputs();
  in.topk_idx = b.outputs().topk_idx;
  in.topk_w = b.outputs().topk_w;
  b.poison();
  layer.forward(stream_, ws, in, b.outputs());
  layer.backward(stream_, ws, in, b.outputs(), b.grad.dy.view(), b.grads());
  layer.check();
  expect_same(read(b), reference(p, RoutingMode::given));
}

// A tensor in host memory, pageable or pinned, is refused at the call, naming it (the kernels' first read of
// it was an illegal address, which ends the context). The same Layer then runs with the reference's bits.
TEST_F(LayerApi, RefusesTensorsOffTheLayersGpu) {
  const ref::Problem p = ref::make_problem(shared_sigmoid(), 43, ref::RoutingKind::uniform);
  Layer layer(p.config, {});
  Bound b(layer, p, RoutingMode::router);
  const TensorView ws = b.workspace.view();
  const size_t y_bytes = tensor_bytes(b.outputs().y.dtype, b.outputs().y.shape);
  std::vector<uint4> pageable(y_bytes / sizeof(uint4) + 1);  // 16-byte aligned, as the Layer requires
  void* pinned = nullptr;
  cuda(cudaMallocHost(&pinned, y_bytes));
  ForwardInputs in = b.inputs();
  in.x.data = pageable.data();
  expect_error([&] { layer.forward(stream_, ws, in, b.outputs()); }, "x is host memory, not memory of the Layer's GPU");
  ForwardOutputs out = b.outputs();
  out.y.data = pinned;
  expect_error([&] { layer.forward(stream_, ws, b.inputs(), out); },
               "y is pinned host memory, not memory of the Layer's GPU");
  GradOutputs g = b.grads();
  g.dx.data = pinned;
  expect_error([&] { layer.backward(stream_, ws, b.inputs(), b.outputs(), b.grad.dy.view(), g); },
               "dx is pinned host memory");
  cuda(cudaFreeHost(pinned));
  layer.check();  // nothing was enqueued, nothing recorded
  b.poison();
  layer.forward(stream_, ws, b.inputs(), b.outputs());
  layer.backward(stream_, ws, b.inputs(), b.outputs(), b.grad.dy.view(), b.grads());
  layer.check();
  expect_same(read(b), reference(p, RoutingMode::router));
}

// Bad views and workspaces are refused at the call, naming the tensor, before anything is enqueued.
TEST_F(LayerApi, RefusesBadViewsNamingThem) {
  const ref::Problem p = ref::make_problem(shared_sigmoid(), 39);
  Layer layer(p.config, {});
  Bound b(layer, p, RoutingMode::router);
  const auto refused = [&](ForwardInputs in, ForwardOutputs out, const char* name) {
    expect_error([&] { layer.forward(stream_, b.workspace.view(), in, out); }, name);
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
  in = b.inputs();
  in.topk_idx = b.outputs().topk_idx;  // a routing given in mode router
  refused(in, b.outputs(), "a given topk_idx needs routing mode replay_ids or given");
  in.routing = RoutingMode::replay_ids;
  in.topk_idx.shape = {1, 3};
  refused(in, b.outputs(), "given topk_idx [N, k]");
  in = b.inputs();
  in.routing = RoutingMode::replay_ids;
  in.topk_w = b.outputs().topk_w;
  refused(in, b.outputs(), "a given topk_w needs routing mode given");
  const TensorView whole = b.workspace.view();
  const int64_t bytes = whole.shape[0], forward_bytes = int64_t(layer.workspace_bytes(Pass::forward));
  const TensorView misaligned{static_cast<uint8_t*>(whole.data) + 8, DType::u8, {bytes}};
  for (const auto& [ws, what] :
       {std::pair<TensorView, std::string>{TensorView{nullptr, DType::u8, {bytes}}, "workspace is missing"},
        {misaligned, "workspace is not 16-byte aligned"},
        {TensorView{whole.data, DType::f32, {bytes / 4}},
         "workspace has dtype float32 and shape [" + std::to_string(bytes / 4) + "], expected uint8 [n]"},
        // Smaller than either pass needs: written past its end before.
        {TensorView{whole.data, DType::u8, {forward_bytes - 16}},
         "workspace has " + std::to_string(forward_bytes - 16) + " bytes, the "}}) {
    expect_error([&] { layer.forward(stream_, ws, b.inputs(), b.outputs()); }, what);
    expect_error([&] { layer.backward(stream_, ws, b.inputs(), b.outputs(), b.grad.dy.view(), b.grads()); }, what);
  }
  const TensorView forward_sized{whole.data, DType::u8, {forward_bytes}};
  expect_error([&] { layer.backward(stream_, forward_sized, b.inputs(), b.outputs(), b.grad.dy.view(), b.grads()); },
               "workspace has " + std::to_string(forward_bytes) + " bytes, the backward needs " +
                   std::to_string(bytes) + " (workspace_bytes(Pass::backward, GradOutputs::scratch))");
  layer.check();  // nothing was enqueued, nothing recorded
  // Mode given has no router: its logits and router gradients would stay unwritten, so they are refused.
  Bound gb(layer, ref::make_problem(shared_sigmoid(), 39, ref::RoutingKind::zipf), RoutingMode::given);
  ForwardOutputs with_logits = gb.outputs();
  with_logits.logits = b.outputs().logits;
  refused(gb.inputs(), with_logits, "logits is given, but routing mode given has no router");
  for (const bool logits : {true, false}) {
    GradOutputs g = gb.grads();
    (logits ? g.d_logits : g.d_router) = logits ? b.grads().d_logits : b.grads().d_router;
    expect_error([&] { layer.backward(stream_, gb.workspace.view(), gb.inputs(), gb.outputs(), gb.grad.dy.view(), g); },
                 "d_logits or d_router is given, but routing mode given has no router");
  }
  layer.check();
  // A bias in softmax mode, whose selection key it would not move: refused, not ignored.
  const ref::Problem softmax = ref::make_problem(make_config(2, 40, 128, 64, 8, 3), 39);
  Layer softmax_layer(softmax.config, {});
  Bound sb(softmax_layer, softmax, RoutingMode::router);
  in = sb.inputs();
  in.weights.expert_bias = {in.weights.router.data, DType::f32, {softmax.config.experts}};
  expect_error([&] { softmax_layer.forward(stream_, sb.workspace.view(), in, sb.outputs()); },
               "expert_bias is given, but the config's score_mode is softmax");
  softmax_layer.check();
}

// ---- the fp8 mode's weights quantized once (Layer::quantize_weights, ForwardInputs::fp8_weights) ----

// What a forward in mode router writes.
struct ForwardResults {
  std::vector<bf16> y;
  std::vector<int32_t> topk_idx;
  std::vector<float> topk_w, logits;
  std::vector<uint8_t> saved;
};

ForwardResults read_forward(const Bound& b) {
  const ForwardTensors& f = b.fwd;
  return {f.y.download<bf16>(), f.topk_idx.download<int32_t>(), f.topk_w.download<float>(), f.logits.download<float>(),
          f.saved.download<uint8_t>()};
}

void expect_same_forward(const ForwardResults& got, const ForwardResults& want) {
  MOK_EXPECT_SAME(y);
  MOK_EXPECT_SAME(topk_idx);
  MOK_EXPECT_SAME(topk_w);
  MOK_EXPECT_SAME(logits);
  MOK_EXPECT_SAME(saved);
}

// The reference's forward (the fp8 mode's rule, docs/numerics.md), bit for bit.
void expect_reference_forward(const ForwardResults& got, const ref::Problem& p) {
  const Forward f = ref::forward(p.config, p.x, p.weights, nullptr, hopper_options());
  EXPECT_EQ(first_bit_mismatch("y", got.y, f.y), "");
  EXPECT_EQ(first_bit_mismatch("topk_idx", got.topk_idx, f.routing.topk_idx), "");
  EXPECT_EQ(first_bit_mismatch("topk_w", got.topk_w, f.routing.topk_w), "");
  EXPECT_EQ(first_bit_mismatch("logits", got.logits, f.logits), "");
}

// The weights quantized once into a caller's buffer (poisoned first) and read by two forwards of a
// Layer whose workspace holds no quantized weights (LaunchConfig::fp8_weights_given): the bits of the
// forward that quantizes them itself, saved bytes included, and the reference's, for both
// micro-batches; a Layer without fp8_weights_given given the buffer reads it too. Outputs and
// workspaces poisoned before every forward.
TEST_F(LayerApi, Fp8WeightsQuantizedOnceGiveTheBitsOfTheForwardThatQuantizes) {
  const ref::Problem p = ref::make_problem(fp8_every_branch(), 51);
  ref::Problem second = p;  // the next micro-batch: other tokens, the same weights
  second.x = ref::make_problem(fp8_every_branch(), 52).x;
  Layer quantizing(p.config, {});
  Layer given(p.config, LaunchConfig{.fp8_weights_given = true});
  const size_t bytes = given.fp8_weights_bytes();
  ASSERT_GT(bytes, 0u);
  EXPECT_EQ(quantizing.fp8_weights_bytes(), bytes);
  // The forward's workspace holds the forward's copies (W), the backward's W and W^T.
  const size_t forward_part = quantizing.workspace_bytes(Pass::forward) - given.workspace_bytes(Pass::forward);
  EXPECT_GT(forward_part, 0u);
  EXPECT_LT(forward_part, bytes);
  // The backward's both, and without recompute the given backward's own sections lie over the forward's
  // E4M3 activations too.
  EXPECT_EQ(quantizing.workspace_bytes(Pass::backward) - given.workspace_bytes(Pass::backward),
            bytes + fp8_activation_bytes(p.config, own_padded_rows(p.config, 1, 0), p.config.tokens()));

  Bound self(quantizing, p, RoutingMode::router);
  const auto forward = [&](Layer& layer, Bound& b, const TensorView& fp8_weights) {
    ForwardInputs in = b.inputs();
    in.fp8_weights = fp8_weights;
    b.poison();
    layer.poison_workspace(stream_, b.workspace.view());
    layer.forward(stream_, b.workspace.view(), in, b.outputs());
    layer.check();
    return read_forward(b);
  };
  const ForwardResults want = forward(quantizing, self, {});
  expect_reference_forward(want, p);

  DeviceTensor q(DType::u8, {int64_t(bytes)});
  q.poison();
  Bound b(given, p, RoutingMode::router);
  given.quantize_weights(stream_, b.weights.views(), q.view());
  {
    SCOPED_TRACE("the first micro-batch");
    expect_same_forward(forward(given, b, q.view()), want);
  }
  {
    SCOPED_TRACE("the second micro-batch, the same buffer");
    b.fwd.x.upload(second.x);
    expect_reference_forward(forward(given, b, q.view()), second);
  }
  {
    SCOPED_TRACE("a Layer without fp8_weights_given reads a given buffer, not its own quantization");
    q.poison();
    EXPECT_NE(first_bit_mismatch("y", forward(quantizing, self, q.view()).y, want.y), "");
    given.quantize_weights(stream_, b.weights.views(), q.view());
    expect_same_forward(forward(quantizing, self, q.view()), want);
  }
}

// The quantization writes every byte of the buffer: into 0xff bytes and into zeros it leaves the same
// bytes, whichever Layer of the config quantizes; on the stream in a CUDA graph, replayed with the
// forward that reads it, it gives the eager run's bits.
TEST_F(LayerApi, Fp8QuantizedWeightsDoNotDependOnTheBufferAndReplayInAGraph) {
  const ref::Problem p = ref::make_problem(fp8_every_branch(), 53);
  const Layer quantizing(p.config, {});
  Layer given(p.config, LaunchConfig{.fp8_weights_given = true});
  Bound b(given, p, RoutingMode::router);
  DeviceTensor q(DType::u8, {int64_t(given.fp8_weights_bytes())});
  q.poison();
  given.quantize_weights(stream_, b.weights.views(), q.view());
  cuda(cudaStreamSynchronize(stream_));
  const std::vector<uint8_t> over_ff = q.download<uint8_t>();
  cuda(cudaMemset(q.view().data, 0, over_ff.size()));
  cuda(cudaDeviceSynchronize());
  quantizing.quantize_weights(stream_, b.weights.views(), q.view());
  cuda(cudaStreamSynchronize(stream_));
  EXPECT_EQ(first_bit_mismatch("fp8_weights", q.download<uint8_t>(), over_ff), "") << "(over zeros vs over 0xff)";

  ForwardInputs in = b.inputs();
  in.fp8_weights = q.view();
  b.poison();
  given.forward(stream_, b.workspace.view(), in, b.outputs());
  given.check();
  const ForwardResults eager = read_forward(b);
  expect_reference_forward(eager, p);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cuda(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
  given.quantize_weights(stream_, b.weights.views(), q.view());
  given.forward(stream_, b.workspace.view(), in, b.outputs());
  cuda(cudaStreamEndCapture(stream_, &graph));
  cuda(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    q.poison();
    b.poison();
    cuda(cudaGraphLaunch(exec, stream_));
    given.check();
    expect_same_forward(read_forward(b), eager);
  }
  cuda(cudaGraphExecDestroy(exec));
  cuda(cudaGraphDestroy(graph));
}

// The quantized weights' arguments are refused at the call, naming the problem, before anything is
// enqueued: a buffer in the bf16 mode (and fp8_weights_given there), a missing buffer where the Layer
// needs one, a wrong dtype, size or alignment, the weights' own views.
TEST_F(LayerApi, Fp8WeightsAreRefusedNamingTheProblem) {
  const ref::Problem p = ref::make_problem(fp8_every_branch(), 54);
  Layer layer(p.config, LaunchConfig{.fp8_weights_given = true});
  Bound b(layer, p, RoutingMode::router);
  const int64_t bytes = int64_t(layer.fp8_weights_bytes());
  DeviceTensor q(DType::u8, {bytes + 16});
  const TensorView good{q.view().data, DType::u8, {bytes}};
  const TensorView ws = b.workspace.view();
  const auto forward_with = [&](const TensorView& fp8_weights) {
    return [&, fp8_weights] {
      ForwardInputs in = b.inputs();
      in.fp8_weights = fp8_weights;
      layer.forward(stream_, ws, in, b.outputs());
    };
  };
  const auto quantize_into = [&](const TensorView& fp8_weights) {
    return [&, fp8_weights] { layer.quantize_weights(stream_, b.weights.views(), fp8_weights); };
  };
  const std::string name = "fp8_weights [fp8_weights_bytes()]";
  expect_error(forward_with({}), "fp8_weights is missing: with LaunchConfig::fp8_weights_given");
  expect_error([&] { layer.backward(stream_, ws, b.inputs(), b.outputs(), b.grad.dy.view(), b.grads()); },
               "fp8_weights is missing: with LaunchConfig::fp8_weights_given");
  const auto bad_buffers = [&](const auto& call) {
    expect_error(call({good.data, DType::bf16, {bytes / 2}}), name + " has dtype bfloat16, expected uint8");
    expect_error(call({good.data, DType::u8, {bytes - 1}}), name + " has shape");
    expect_error(call({static_cast<uint8_t*>(good.data) + 8, DType::u8, {bytes}}), name + " is not 16-byte aligned");
  };
  bad_buffers(forward_with);
  bad_buffers(quantize_into);
  expect_error(quantize_into({}), name + " is missing");
  WeightViews w = b.weights.views();
  w.w2.shape = {1, 2, 3};
  expect_error([&] { layer.quantize_weights(stream_, w, good); }, "w2 [E, H, I]");

  LayerConfig bf16_config = p.config;
  bf16_config.precision = Precision::bf16;
  expect_error([&] { const Layer refusing(bf16_config, LaunchConfig{.fp8_weights_given = true}); },
               "fp8_weights_given needs precision = fp8");
  Layer bf16_layer(bf16_config, {});
  Bound bf(bf16_layer, ref::make_problem(bf16_config, 54), RoutingMode::router);
  ForwardInputs in = bf.inputs();
  in.fp8_weights = good;
  expect_error([&] { bf16_layer.forward(stream_, bf.workspace.view(), in, bf.outputs()); },
               "fp8_weights is given, but precision is bf16");
  expect_error([&] { bf16_layer.quantize_weights(stream_, bf.weights.views(), good); },
               "quantize_weights: precision is bf16");
  EXPECT_EQ(bf16_layer.fp8_weights_bytes(), 0u);
  layer.check();  // nothing was enqueued, nothing recorded
  bf16_layer.check();
}

// The fp8 backward's sections over one another (LayerMemory.Fp8BackwardSectionsShareBytesByLifetime):
// one cycle (one rank's default ring; two ranks' ring of a rank's most tiles: dh and its quantized copy
// over the ring) and several (a one-tile ring), h saved or recomputed (xe pulled and quantized again), a
// shared expert over N = 80 tokens, skewed routing; the workspace poisoned before the forward and again
// before the backward, so the backward reads only what it writes (its quantized weights, dy, dh and
// their scales, the padding rows' zero blocks): the reference's bits. Also with the weights given
// (quantized once into the caller's buffer): without recompute the backward's sections then lie over the
// forward's E4M3 activations.
TEST_F(LayerApi, Fp8BackwardSectionsOverOneAnotherMatchTheReference) {
  LayerConfig one_rank = with_every_branch(make_config(1, 80, 256, 128, 8, 3));
  one_rank.shared_intermediate = 128;
  one_rank.precision = Precision::fp8;
  const std::pair<LayerConfig, int> runs[] = {{one_rank, 0}, {fp8_every_branch(), 640}, {fp8_every_branch(), 128}};
  expect_sections_over_one_another_match(runs, 45);
}

// The shares' results as one layer's: the per-token and per-expert tensors in share order; the router's
// and the shared expert's gradients, whole on every share, from share 0, every share's bits the same.
Results assemble(const std::vector<Results>& parts) {
  Results all = parts[0];
  const auto cat = [&](auto field) {
    for (size_t g = 1; g < parts.size(); ++g)
      (all.*field).insert((all.*field).end(), (parts[g].*field).begin(), (parts[g].*field).end());
  };
  const auto same = [&](auto field, const char* name) {
    for (size_t g = 1; g < parts.size(); ++g)
      EXPECT_EQ(first_bit_mismatch(name, parts[g].*field, parts[0].*field), "") << "share " << g << " vs share 0";
  };
  cat(&Results::y), cat(&Results::dx), cat(&Results::topk_idx), cat(&Results::topk_w), cat(&Results::logits);
  cat(&Results::d_topk_w), cat(&Results::d_logits), cat(&Results::d_w1), cat(&Results::d_w2);
  same(&Results::d_router, "d_router"), same(&Results::d_sw1, "d_sw1"), same(&Results::d_sw2, "d_sw2");
  return all;
}

// `gpus` Layers of colocated shares of this GPU, each with its share of a problem's tensors and its own
// stream (on one stream their kernels would run one after another and never meet). A short watchdog
// by default: a missed barrier fails instead of hanging.
struct Colocated {
  std::shared_ptr<const PeerGroup> group;  // outlives the Layers
  std::vector<std::unique_ptr<Layer>> layers;
  std::vector<std::unique_ptr<Bound>> bound;
  std::vector<cudaStream_t> streams;

  Colocated(const ref::Problem& p, RoutingMode mode, int gpus, double watchdog_seconds = 5.0,
            GivenRouting given = GivenRouting::in_place, int ring_rows = 0, bool recompute = false,
            long capacity_rows = 0, std::shared_ptr<const PeerGroup> on_group = nullptr) {
    const LaunchConfig launch{.ring_rows = ring_rows,
                              .watchdog_seconds = watchdog_seconds,
                              .gpus = gpus,
                              .transport = Transport::colocated,
                              .recompute = recompute,
                              .capacity_rows = capacity_rows};
    group = on_group ? std::move(on_group) : make_peer_group(p.config, launch);
    for (int g = 0; g < gpus; ++g) {
      layers.push_back(std::make_unique<Layer>(p.config, launch, g, group.get()));
      bound.push_back(std::make_unique<Bound>(*layers[g], p, mode, g, gpus, given));
      bound[g]->poison();
      streams.push_back(nullptr);
      cuda(cudaStreamCreateWithFlags(&streams.back(), cudaStreamNonBlocking));
    }
  }
  ~Colocated() {
    for (cudaStream_t s : streams) cudaStreamDestroy(s);
  }
  // Every share's launch is enqueued before any is waited for: they meet at the barriers across shares.
  void forward() {
    for (size_t g = 0; g < layers.size(); ++g)
      layers[g]->forward(streams[g], bound[g]->workspace.view(), bound[g]->inputs(), bound[g]->outputs());
  }
  void backward() {
    for (size_t g = 0; g < layers.size(); ++g) {
      const Bound& b = *bound[g];
      layers[g]->backward(streams[g], b.workspace.view(), b.inputs(), b.outputs(), b.grad.dy.view(), b.grads());
    }
  }
  // What each share's check() raises ("nothing raised" where it raises nothing).
  std::vector<std::string> raised() {
    std::vector<std::string> out;
    for (const auto& layer : layers) {
      try {
        layer->check();
        out.emplace_back("nothing raised");
      } catch (const Error& e) {
        out.emplace_back(e.what());
      }
    }
    return out;
  }
  // Every share's outputs poisoned, then a forward and a backward, checked and read: after an error,
  // both work again.
  Results poisoned_step() {
    for (const auto& b : bound) b->poison();
    forward();
    backward();
    return check_and_read();
  }
  Results check_and_read() {
    std::vector<Results> parts;
    for (size_t g = 0; g < layers.size(); ++g) {
      layers[g]->check();
      parts.push_back(read(*bound[g]));
    }
    return assemble(parts);
  }
};

LayerConfig shared_sigmoid_on_4_ranks() {
  LayerConfig c = shared_sigmoid();
  c.ranks = 4;
  c.tokens_per_rank = 20;
  return c;
}

// Issue 17 on one GPU: 2 and 4 colocated Layers, each on its share of the tensors (its tokens, its
// experts), give the reference's bits in every routing mode (a given routing in place, or as inputs:
// each share's copied into its window), and each holds the whole d_router (relayed share after share).
TEST_F(LayerApi, ColocatedLayersOnTheirSharesMatchTheReference) {
  const ref::Problem p = ref::make_problem(shared_sigmoid_on_4_ranks(), 45, ref::RoutingKind::uniform);
  for (RoutingMode mode : {RoutingMode::router, RoutingMode::replay_ids, RoutingMode::given}) {
    const Results want = reference(p, mode);
    for (int gpus : {2, 4}) {
      const GivenRouting given = gpus == 2 ? GivenRouting::in_place : GivenRouting::inputs;
      SCOPED_TRACE("mode " + std::to_string(int(mode)) + " on " + std::to_string(gpus) + " colocated shares");
      Colocated shares(p, mode, gpus, 5.0, given);
      shares.forward();
      shares.backward();
      expect_same(shares.check_and_read(), want);
    }
  }
}

// Layers made again on one peer group (the group outlives its Layers) number their launches on from the
// first Layers' (PeerGroup::take_launches): the window's flags hold the first Layers' numbers, which a count
// started again from 0 would pass at once, and the barriers across GPUs would not wait.
TEST_F(LayerApi, ColocatedLayersMadeAgainOnOneGroupMatchTheReference) {
  const ref::Problem p = ref::make_problem(shared_sigmoid_on_4_ranks(), 45, ref::RoutingKind::uniform);
  const Results want = reference(p, RoutingMode::router);
  std::shared_ptr<const PeerGroup> group;
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    Colocated shares(p, RoutingMode::router, 2, 5.0, GivenRouting::in_place, 0, false, 0, group);
    group = shares.group;
    for (int step = 0; step < 2; ++step) expect_same(shares.poisoned_step(), want);
  }
}

// A peer group's Layer refuses CUDA-graph capture (its barriers across GPUs are numbered per launch on the
// host: a replay would reuse the numbers, which the peers' flags have passed), before enqueuing anything;
// the same call outside capture still runs.
TEST_F(LayerApi, ColocatedLayerRefusesGraphCapture) {
  const ref::Problem p = ref::make_problem(shared_sigmoid_on_4_ranks(), 45, ref::RoutingKind::uniform);
  Colocated shares(p, RoutingMode::router, 2);
  for (int g = 0; g < 2; ++g) {  // every share makes the refused call: each uses its launch number
    Bound& b = *shares.bound[g];
    cuda(cudaStreamBeginCapture(shares.streams[g], cudaStreamCaptureModeThreadLocal));
    expect_error([&] { shares.layers[g]->forward(shares.streams[g], b.workspace.view(), b.inputs(), b.outputs()); },
                 "cannot be captured in a CUDA graph");
    cudaGraph_t graph = nullptr;
    cuda(cudaStreamEndCapture(shares.streams[g], &graph));
    size_t nodes = 1;
    cuda(cudaGraphGetNodes(graph, nullptr, &nodes));
    EXPECT_EQ(nodes, 0u) << "the refused call enqueued work";
    cuda(cudaGraphDestroy(graph));
  }
  shares.forward();
  shares.backward();
  expect_same(shares.check_and_read(), reference(p, RoutingMode::router));
}

// Micro-batches on 2 colocated shares: forward(A), forward(B), backward(A), backward(B). When A's
// backward runs, each share's window holds B's gathered routing for the other share's tokens, so the
// backward's pulls must take A's rows from A's saved layout: each batch gets the reference's bits.
TEST_F(LayerApi, ColocatedInterleavedMicroBatchesMatchTheReference) {
  const ref::Problem a = ref::make_problem(shared_sigmoid_on_4_ranks(), 48, ref::RoutingKind::uniform);
  const ref::Problem b = ref::make_problem(shared_sigmoid_on_4_ranks(), 49, ref::RoutingKind::zipf);
  const int gpus = 2;
  Colocated shares(a, RoutingMode::given, gpus);
  std::vector<std::unique_ptr<Bound>> second;
  for (int g = 0; g < gpus; ++g) {
    second.push_back(
        std::make_unique<Bound>(*shares.layers[g], b, RoutingMode::given, g, gpus, GivenRouting::in_place));
    second[g]->poison();
  }
  shares.forward();
  for (int g = 0; g < gpus; ++g)
    shares.layers[g]->forward(shares.streams[g], second[g]->workspace.view(), second[g]->inputs(),
                              second[g]->outputs());
  shares.backward();
  expect_same(shares.check_and_read(), reference(a, RoutingMode::given));
  std::vector<Results> parts;
  for (int g = 0; g < gpus; ++g) {
    const Bound& s = *second[g];
    shares.layers[g]->backward(shares.streams[g], s.workspace.view(), s.inputs(), s.outputs(), s.grad.dy.view(),
                               s.grads());
  }
  for (int g = 0; g < gpus; ++g) {
    shares.layers[g]->check();
    parts.push_back(read(*second[g]));
  }
  expect_same(assemble(parts), reference(b, RoutingMode::given));
}

// One ring cycle on each of 2 colocated shares (a ring of a rank's most tiles: each share's dh lies over
// its ring, workspace_layout), skewed routing, every workspace poisoned before each launch: the
// reference's bits. Also in recompute mode, where each share's backward pulls its rows' x again, some
// of them from the other share's window, into its poisoned workspace.
TEST_F(LayerApi, ColocatedSharesWithOneRingCycleMatchTheReference) {
  const ref::Problem p = ref::make_problem(shared_sigmoid(), 47, ref::RoutingKind::zipf);
  for (const bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recompute" : "h saved");
    Colocated shares(p, RoutingMode::given, 2, 5.0, GivenRouting::in_place, 640, recompute);
    const auto poison = [&] {
      for (size_t g = 0; g < shares.layers.size(); ++g)
        shares.layers[g]->poison_workspace(shares.streams[g], shares.bound[g]->workspace.view());
    };
    poison();
    shares.forward();
    poison();
    shares.backward();
    expect_same(shares.check_and_read(), reference(p, RoutingMode::given, LaunchConfig{.recompute = recompute}));
  }
}

// A bad given routing in the last share's tokens: every share gathers every token's routing and checks
// it, so every share reports the token (none waits for another); then the shares work again.
TEST_F(LayerApi, ColocatedBadGivenRoutingIsReportedByEveryShare) {
  const ref::Problem p = ref::make_problem(shared_sigmoid(), 46, ref::RoutingKind::uniform);
  Colocated shares(p, RoutingMode::given, 2);
  std::vector<int32_t> bad = share_of(p.routing->topk_idx, 1, 2);
  bad.back() = bad[bad.size() - 2];  // the last token's last expert repeats the one before
  shares.bound[1]->fwd.topk_idx.upload(bad);
  shares.forward();
  const std::string token = "given routing of token " + std::to_string(p.config.tokens() - 1);
  for (const auto& layer : shares.layers) expect_error([&] { layer->check(); }, token);
  shares.bound[1]->fwd.topk_idx.upload(share_of(p.routing->topk_idx, 1, 2));
  expect_same(shares.poisoned_step(), reference(p, RoutingMode::given));
}

// Issue 17, faults: a NaN in one of share 0's x rows makes its router logits overflow, which only
// share 0 sees (each share computes its own tokens' logits). Share 0 stops on the error and marks
// share 1's abort word, so share 1's launch ends at the barrier across shares after the top-k instead
// of waiting for its watchdog (30 s): both shares raise within seconds, share 1 naming GPU 0. Then
// both shares work again, with the reference's bits.
TEST_F(LayerApi, ColocatedErrorOnOneShareEndsTheOthersLaunchAtOnce) {
  const ref::Problem p = ref::make_problem(shared_sigmoid(), 49);
  Colocated shares(p, RoutingMode::router, 2, 30.0);
  std::vector<bf16> x = share_of(p.x, 0, 2);
  const int token = 3;
  x[size_t(token) * p.config.hidden] = bf16{0x7fc0};  // NaN
  shares.bound[0]->fwd.x.upload(x);
  const auto start = std::chrono::steady_clock::now();
  shares.forward();
  const std::vector<std::string> raised = shares.raised();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0) << "share 1 waited for its watchdog instead of seeing share 0's abort mark";
  EXPECT_NE(raised[0].find("router logit of token " + std::to_string(token) + " overflows"), std::string::npos)
      << "share 0 raised: '" << raised[0] << "'";
  EXPECT_NE(raised[1].find("GPU 0 stopped on an error"), std::string::npos) << "share 1 raised: '" << raised[1] << "'";
  EXPECT_NE(raised[1].find("after phase 'router top-k'"), std::string::npos) << raised[1];
  shares.bound[0]->fwd.x.upload(share_of(p.x, 0, 2));
  expect_same(shares.poisoned_step(), reference(p, RoutingMode::router));
}

// A call refused on the host on one share (an x of another shape) still takes its launch number: the other
// share's launch of it ends on its watchdog (1 s), and every share's next calls have the same numbers, so both
// work again with the reference's bits. (Numbered after the checks, the refused share's calls stayed one launch
// behind for good, and its barriers passed on its peer's older flags.)
TEST_F(LayerApi, ColocatedCallRefusedOnOneShareKeepsTheSharesLaunchNumbersAlike) {
  const ref::Problem p = ref::make_problem(shared_sigmoid(), 50);
  Colocated shares(p, RoutingMode::router, 2, 1.0);
  const Bound& refused = *shares.bound[0];
  ForwardInputs in = refused.inputs();
  in.x.shape[0] -= 1;
  expect_error([&] { shares.layers[0]->forward(shares.streams[0], refused.workspace.view(), in, refused.outputs()); },
               "x [N/G, H]");
  const Bound& other = *shares.bound[1];
  shares.layers[1]->forward(shares.streams[1], other.workspace.view(), other.inputs(), other.outputs());
  const std::vector<std::string> raised = shares.raised();
  EXPECT_EQ(raised[0], "nothing raised");
  EXPECT_NE(raised[1].find("s for GPU 0 at the barrier across GPUs after phase 'start"), std::string::npos)
      << raised[1];
  expect_same(shares.poisoned_step(), reference(p, RoutingMode::router));
}

// A share whose launch failed stops its queued launches too, each marking its peer's abort word with its own
// epoch: a peer that reaches a barrier of an earlier launch only after them ends its launch at once, naming
// the share (a later launch's mark was taken for an old one before, and the peer waited for its watchdog, 30 s).
// Here share 1's forward, backward and next forward are queued when share 0's forward fails on a NaN; share 0
// raises its error, then its backward finds share 1's marks of the later launches.
TEST_F(LayerApi, ColocatedPeerEndsItsWaitOnAMarkOfALaterLaunch) {
  const ref::Problem p = ref::make_problem(shared_sigmoid(), 49);
  Colocated shares(p, RoutingMode::router, 2, 30.0);
  std::vector<bf16> x = share_of(p.x, 0, 2);
  x[0] = bf16{0x7fc0};  // NaN: token 0's router logits overflow
  shares.bound[0]->fwd.x.upload(x);
  const auto call = [&](int g, bool backward) {
    const Bound& b = *shares.bound[g];
    if (backward)
      shares.layers[g]->backward(shares.streams[g], b.workspace.view(), b.inputs(), b.outputs(), b.grad.dy.view(),
                                 b.grads());
    else
      shares.layers[g]->forward(shares.streams[g], b.workspace.view(), b.inputs(), b.outputs());
  };
  call(1, false), call(1, true), call(1, false);
  call(0, false);
  expect_error([&] { shares.layers[0]->check(); }, "router logit of token 0 overflows");
  const auto start = std::chrono::steady_clock::now();
  call(0, true);
  std::string raised_by_call;  // the backward's error, where its copy lands before the next call looks
  try {
    call(0, false);
  } catch (const Error& e) {
    raised_by_call = e.what();
  }
  std::vector<std::string> raised = shares.raised();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!raised_by_call.empty()) raised[0] = raised_by_call;
  EXPECT_LT(seconds, 5.0) << "share 0 waited for its watchdog instead of seeing share 1's later abort marks";
  EXPECT_NE(raised[0].find("GPU 1 stopped on an error"), std::string::npos) << raised[0];
  EXPECT_NE(raised[1].find("GPU 0 stopped on an error"), std::string::npos) << raised[1];
  shares.bound[0]->fwd.x.upload(share_of(p.x, 0, 2));
  expect_same(shares.poisoned_step(), reference(p, RoutingMode::router));
}

// Given routing, no shared expert: no relay follows the backward's last barrier across shares, and a share's
// next forward copies its tokens' topk_w anew into its window, where the other share's dye pull reads them; a
// closing barrier orders the two. A step's calls enqueued back to back, the next forward (another routing)
// right behind the backward, give the bits of the same calls waited for one by one. Zipf routing: one share's
// experts take most rows, so its dye pull runs long after the other share's backward could end.
TEST_F(LayerApi, ColocatedGivenRoutingCallsBackToBackGiveTheBitsOfCallsWaitedFor) {
  const LayerConfig c = make_config(2, 2048, 4096, 128, 8, 4);
  const ref::Problem first = ref::make_problem(c, 55, ref::RoutingKind::zipf);
  const ref::Problem next = ref::make_problem(c, 56, ref::RoutingKind::uniform);
  Colocated shares(first, RoutingMode::given, 2);
  std::vector<std::unique_ptr<Bound>> after;
  for (int g = 0; g < 2; ++g)
    after.push_back(std::make_unique<Bound>(*shares.layers[g], next, RoutingMode::given, g, 2));
  const auto step = [&](bool waited) {
    const auto wait = [&] {
      if (waited)
        for (const auto& layer : shares.layers) layer->check();
    };
    for (const auto& b : shares.bound) b->poison();
    shares.forward();
    wait();
    shares.backward();
    wait();
    for (int g = 0; g < 2; ++g)
      shares.layers[g]->forward(shares.streams[g], after[g]->workspace.view(), after[g]->inputs(), after[g]->outputs());
    return shares.check_and_read();
  };
  const Results waited = step(true);
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE("back to back, run " + std::to_string(run));
    expect_same(step(false), waited);
  }
}

// Across GPUs each share checks every token's slots (a peer's topk_idx read from its window): a share
// given the saved buffer of a forward whose routing differs at token 61, one of share 1's, stops on the
// error naming the token, whether the token is its own (share 1) or its peer's (share 0, whose own
// tokens' slots agree), and the other share's launch ends at its next barrier across shares, naming the
// first. Then both work again.
TEST_F(LayerApi, ColocatedSavedOfAnotherRoutingIsRefusedByEitherShare) {
  const ref::Problem p = ref::make_problem(shared_sigmoid(), 53, ref::RoutingKind::uniform);
  Colocated shares(p, RoutingMode::given, 2, 30.0), others(rerouted(p, 61, 0), RoutingMode::given, 2, 30.0);
  others.forward();
  for (const auto& layer : others.layers) layer->check();
  for (int given = 0; given < 2; ++given) {
    SCOPED_TRACE("the other routing's saved given to share " + std::to_string(given));
    shares.forward();
    for (const auto& layer : shares.layers) layer->check();
    shares.bound[given]->fwd.saved.upload(others.bound[given]->fwd.saved.download<uint8_t>());
    shares.backward();
    const std::vector<std::string> raised = shares.raised();
    const std::string gpu = "GPU " + std::to_string(given);
    EXPECT_NE(raised[given].find("saved on " + gpu +
                                 " is not this topk_idx's: its dispatch layout routes token 61 otherwise"),
              std::string::npos)
        << raised[given];
    EXPECT_NE(raised[1 - given].find(gpu + " stopped on an error"), std::string::npos) << raised[1 - given];
  }
  expect_same(shares.poisoned_step(), reference(p, RoutingMode::given));
}

// A peer's tokens' expert ids are read from the peer's window, which it fills with its backward's
// topk_idx, not from this share's view of them (its last forward's gather): after a forward of another
// routing (differing at token 61, share 1's), share 0 keeps that forward's saved buffer while both
// shares' topk_idx are the first routing's again, and share 1 has the first forward's saved buffer back.
// Share 0's view of token 61 agrees with its saved buffer; its peer's topk_idx does not, and share 0
// names the token.
TEST_F(LayerApi, ColocatedSavedIsCheckedAgainstThePeersTopkIdx) {
  const ref::Problem p = ref::make_problem(shared_sigmoid(), 53, ref::RoutingKind::uniform);
  const ref::Problem other = rerouted(p, 61, 0);
  Colocated shares(p, RoutingMode::given, 2, 30.0);
  const auto route = [&](const ref::Problem& q) {
    for (int g = 0; g < 2; ++g) shares.bound[g]->fwd.topk_idx.upload(share_of(q.routing->topk_idx, g, 2));
  };
  shares.forward();
  for (const auto& layer : shares.layers) layer->check();
  const std::vector<uint8_t> first_saved = shares.bound[1]->fwd.saved.download<uint8_t>();
  route(other);
  shares.forward();
  for (const auto& layer : shares.layers) layer->check();
  route(p);
  shares.bound[1]->fwd.saved.upload(first_saved);
  shares.backward();
  const std::vector<std::string> raised = shares.raised();
  EXPECT_NE(raised[0].find("saved on GPU 0 is not this topk_idx's: its dispatch layout routes token 61 otherwise"),
            std::string::npos)
      << raised[0];
  EXPECT_NE(raised[1].find("GPU 0 stopped on an error"), std::string::npos) << raised[1];
  expect_same(shares.poisoned_step(), reference(p, RoutingMode::given));
}

// Recompute mode's saved holds the layout alone, of one size whatever the capacity, so Layers of a
// smaller capacity_rows take the saved buffers of Layers of a larger one: their backward's check refuses
// the tiles their per-row buffers cannot hold (they would be written past them), with the forward's
// capacity error, on every share (each checks every GPU's tiles), before anything is written.
TEST_F(LayerApi, ColocatedSavedOfALargerCapacityIsRefused) {
  const ref::Problem p =
      ref::make_problem(with_every_branch(make_config(2, 200, 128, 64, 8, 4)), 54, ref::RoutingKind::zipf);
  const int E = p.config.experts, per_gpu = E / 2;
  const DispatchLayout layout = ref::build_dispatch_layout(p.config, p.routing->topk_idx);
  std::vector<int32_t> tiles(size_t(E) + 1);
  prefix_tile_offsets(E, layout.offsets.data(), tiles.data());
  const long small_capacity = kTileRows;  // own_padded_rows: 1 + E/G tiles
  const int held = int(own_padded_rows(p.config, 2, small_capacity) / kTileRows);
  int over = -1, over_tiles = 0;
  for (int g = 0; g < 2 && over < 0; ++g)
    if (tiles[(g + 1) * per_gpu] - tiles[g * per_gpu] > held)
      over = g, over_tiles = tiles[(g + 1) * per_gpu] - tiles[g * per_gpu];
  ASSERT_GE(over, 0) << "the routing fits the small capacity: the test needs another seed";
  Colocated large(p, RoutingMode::given, 2, 30.0, GivenRouting::in_place, 0, true),
      small(p, RoutingMode::given, 2, 30.0, GivenRouting::in_place, 0, true, small_capacity);
  large.forward();
  for (int g = 0; g < 2; ++g) {
    large.layers[g]->check();
    small.bound[g]->fwd.saved.upload(large.bound[g]->fwd.saved.download<uint8_t>());
  }
  small.backward();
  const std::string want = "the routing gives GPU " + std::to_string(over) + "'s experts " +
                           std::to_string(over_tiles) + " tiles of 128 rows, more than its buffers hold";
  for (const auto& layer : small.layers) expect_error([&] { layer->check(); }, want);
  large.backward();
  expect_same(large.check_and_read(), reference(p, RoutingMode::given, {.recompute = true}));
}

// A sharded Layer (GPU 1 of 2 colocated) refuses whole-size tensors, naming the share's shape, and a
// Layer without its peer group, or with another launch's, is refused. Nothing is enqueued.
TEST_F(LayerApi, ShardedLayerRefusesWholeTensorsNamingTheShare) {
  const ref::Problem p = ref::make_problem(shared_sigmoid(), 48);
  const LayerConfig& c = p.config;
  const LaunchConfig launch{.watchdog_seconds = 5.0, .gpus = 2, .transport = Transport::colocated};
  const auto group = make_peer_group(c, launch);
  expect_error([&] { Layer(c, launch, 1, nullptr); }, "the nccl and colocated transports need a peer group");
  expect_error([&] { Layer(c, LaunchConfig{.gpus = 2, .transport = Transport::nccl}, 1, group.get()); },
               "the peer group was made for another launch or config");
  expect_error([&] { Layer(c, launch, 2, group.get()); }, "gpu 2 is outside the launch's GPUs");
  Layer layer(c, launch, 1, group.get());
  Bound b(layer, p, RoutingMode::router, 1, 2);
  const int64_t N = c.tokens(), H = c.hidden, I = c.intermediate, E = c.experts;
  const TensorView ws = b.workspace.view();
  ForwardInputs in = b.inputs();
  in.weights.w1.shape = {E, 2 * I, H};
  expect_error([&] { layer.forward(stream_, ws, in, b.outputs()); }, "w1 [E/G, 2I, H]");
  in = b.inputs();
  in.x.shape = {N, H};
  expect_error([&] { layer.forward(stream_, ws, in, b.outputs()); }, "x [N/G, H]");
  ForwardOutputs out = b.outputs();
  out.logits.shape = {N, E};
  expect_error([&] { layer.forward(stream_, ws, b.inputs(), out); }, "logits [N/G, E]");
  TensorView dy = b.grad.dy.view();
  dy.shape = {N, H};
  expect_error([&] { layer.backward(stream_, ws, b.inputs(), b.outputs(), dy, b.grads()); }, "dy [N/G, H]");
  GradOutputs grads = b.grads();
  grads.d_w2.shape = {E, H, I};
  expect_error([&] { layer.backward(stream_, ws, b.inputs(), b.outputs(), b.grad.dy.view(), grads); },
               "d_w2 [E/G, H, I]");
  layer.check();  // nothing was enqueued, nothing recorded
}

// A Layer on a caller's communicator of one rank (one process, one GPU): the reference's bits in every
// routing mode, three Layers' windows registered on the communicator at once. The communicator stays
// the caller's, destroyed after the Layers.
TEST_F(LayerApi, OnAOneRankCommunicatorMatchesTheReference) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t raw = nullptr;
  ASSERT_EQ(ncclCommInitRank(&raw, 1, id, 0), ncclSuccess);
  const std::unique_ptr<ncclComm, decltype(&ncclCommDestroy)> comm(raw, ncclCommDestroy);
  const ref::Problem p = ref::make_problem(shared_sigmoid(), 47, ref::RoutingKind::uniform);
  const LaunchConfig launch{.watchdog_seconds = 5.0};
  expect_error([&] { Layer(p.config, LaunchConfig{.gpus = 2}, comm.get()); },
               "gpus = 2, but the communicator has 1 ranks");
  expect_error([&] { Layer(p.config, LaunchConfig{.transport = Transport::colocated}, comm.get()); },
               "a Layer on a communicator cannot use the colocated transport");
  const RoutingMode modes[] = {RoutingMode::router, RoutingMode::replay_ids, RoutingMode::given};
  std::vector<std::unique_ptr<Layer>> layers;
  for (int i = 0; i < 3; ++i) layers.push_back(std::make_unique<Layer>(p.config, launch, comm.get()));
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE("mode " + std::to_string(int(modes[i])));
    Bound b(*layers[i], p, modes[i]);
    b.poison();
    b.run(*layers[i], stream_);
    layers[i]->check();
    expect_same(read(b), reference(p, modes[i]));
  }
}

}  // namespace
}  // namespace mok::gpu
