// The production device API: one MoE layer on device tensors the caller owns, stream-ordered and
// asynchronous. The layer object holds the config, the launch settings and a few words of its own
// (the device error word, the phase clock); weights, activations, gradients and the workspace are
// the caller's, read and written through the pointers of each call, so an optimizer step between
// calls costs nothing and the calls can be captured in a CUDA graph (on one GPU: a peer group's Layer
// refuses capture, see refuse_capture in layer.cu).
//
//   mok::gpu::Layer layer(config, {});                        // validates; no weights, no big memory
//   TensorView ws{p, DType::u8, {n}};  n >= layer.workspace_bytes(Pass::backward)  // e.g. the framework's allocator's
//   layer.forward(stream, ws, inputs, outputs);                // y, routing, logits, saved
//   layer.backward(stream, ws, inputs, outputs, dy, grads);    // dx, d topk_w, d logits, dWr, dW1, dW2...
//   layer.check();                                             // waits for the GPU, raises device errors
//   fp8 mode, once per optimizer step:  layer.quantize_weights(stream, weights, q)  (q: fp8_weights_bytes()),
//   then every forward and backward reads it: ForwardInputs::fp8_weights = q (required with
//   LaunchConfig::fp8_weights_given)
//
// Shapes (N = R T tokens): x, y, dy, dx [N, H] bf16; router, d_router [E, H] fp32; expert_bias [E]
// fp32; w1 [E, 2I, H] and w2 [E, H, I] bf16 (gradients fp32, or bf16: GradOutputs); shared_w1 [2Is, H],
// shared_w2 [H, Is] bf16; topk_idx [N, k] int32, topk_w and d_topk_w [N, k] fp32; logits, d_logits [N, E] fp32; saved
// [saved_bytes()] bytes (mok/core/saved_layout.h). Every tensor contiguous, row-major, 16-byte aligned.
// A tensor a call writes shares no byte with another tensor of the call or with its workspace (the
// tensors it only reads may share memory).
// Over G > 1 GPUs each GPU's Layer takes its share (see Layer): the per-token tensors [N/G, ...] and
// w1, w2, d_w1, d_w2 [E/G, ...].
//
// Errors: bad arguments (a stream on another GPU than the Layer's included) throw mok::Error at the
// call, before anything is enqueued. Errors found by
// the kernels (a watchdog, a router-logit overflow, a bad given routing, a saved buffer not of this
// routing, the capacity, a peer's abort: docs/architecture.md) are recorded on the device, copied to
// the host behind each launch, and thrown by the next call that sees them or by check(); until then
// the layer's launches stop at their first barrier. Over G > 1 GPUs a GPU that stops on
// an error ends its peers' launches at their next barrier across GPUs, within microseconds instead of
// after their watchdog: its own Layer raises the cause, each peer's Layer "mok: GPU j stopped on an
// error (raised by GPU j's Layer); GPU g's launch ended waiting for it after phase '...'"; the next
// calls on every GPU work again once each has raised its error: every GPU's check() before any GPU's
// next call. The launches across GPUs are numbered call by call, and a call refused on one GPU (an error
// raised, a bad argument) still uses its numbers, so the GPUs stay numbered alike, but launches nothing:
// its peers' launches of those numbers end on their watchdog; the refused GPU must not call again before
// they have (docs/multi-gpu.md). LaunchConfig::synchronous makes each call wait and check (debugging).
//
// Threads: a Layer is not thread-safe. Calls on one Layer from several threads must be serialized by the
// caller (the PyTorch op holds a lock per Layer); distinct Layers may be called concurrently.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mok/core/config.h"
#include "mok/core/saved_layout.h"

// NCCL's communicator handle (nccl.h), declared here so that this header does not need NCCL's.
typedef struct ncclComm* ncclComm_t;

namespace mok::gpu {

class PeerGroup;

// True when a CUDA device of compute capability 9.0 is usable. Throws mok::Error where CUDA fails for
// another reason than having no device or no driver (cuda_device_count), or cannot give the properties
// of a device it counts.
bool device_available();

// How many of the devices 0, 1, ... are usable Hopper GPUs (compute capability 9.0), in a row (throws as
// device_available does).
int hopper_gpus();

enum class DType : uint8_t { bf16, f32, i32, u8 };
const char* dtype_name(DType t);
size_t dtype_bytes(DType t);
// The bytes of a contiguous tensor of `dtype` and `shape`.
size_t tensor_bytes(DType dtype, const std::vector<int64_t>& shape);

// A caller's device tensor: contiguous row-major `shape`. An absent optional tensor has data nullptr.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::bf16;
  std::vector<int64_t> shape;
};

using mok::RoutingMode;  // mok/core/layer_io.h

enum class Pass { forward, backward };

// How the ranks' buffers reach each other:
//   simulated  one GPU executes every rank, their buffers one allocation;
//   nccl       each GPU exposes its ranks' buffers in an NCCL symmetric window (docs/multi-gpu.md);
//   colocated  `gpus` Layers share the current device, each on its share of the SMs with a window in
//              plain device memory: the multi-GPU code tested on one GPU (no NCCL).
enum class Transport { simulated, nccl, colocated };

// The longest watchdog a launch takes (11.6 days): its nanoseconds stay far inside the device's 64 bits.
inline constexpr double kMaxWatchdogSeconds = 1e6;

struct LaunchConfig {
  int blocks = 0;     // persistent blocks per GPU; 0: as many as are co-resident (colocated: that / gpus)
  int ring_rows = 0;  // rows of each rank's dy ring per backward cycle, a multiple of 128; 0: an average rank's rows
                      // (a ring of a rank's most tiles, one cycle whatever the routing, as the default is with
                      // R = 1: the backward's dh shares the ring's bytes, docs/architecture.md); at most the
                      // rows a rank can receive, N min(k, E/R) plus a tile per expert: a larger ring is that
                      // one (Layer::ring_rows), as it would never be filled
  double watchdog_seconds = 10.0;              // a barrier or pipeline wait longer than this reports an error, no hang;
                                               // finite, in (0, kMaxWatchdogSeconds]
  int gpus = 1;                                // GPUs 0 .. gpus-1, each executing R / gpus consecutive ranks
  Transport transport = Transport::simulated;  // gpus > 1 needs nccl or colocated
  bool synchronous = false;                    // every call waits for its kernel and raises its errors
                                               // (refused by the Megakernel wrapper with gpus > 1)
  // The backward pulls x into xe again and recomputes the routed experts' h from it and W1 (a from h,
  // as in either mode: no saved buffer holds the routed a), and the shared expert's h and a from x and
  // W1s (the forward's pull and GEMM1 + SwiGLU code, the same bits), instead of reading them from
  // `saved`: saved_bytes() is the dispatch layout's alone, P (2 H + 4 I) + S 6 Is bytes smaller (in fp8,
  // whose saved buffer holds no xe either way, P 4 I + S 6 Is: mok/core/saved_layout.h, saves_xe), the
  // backward's workspace that much larger (or less where its sections after the cycles lie over h:
  // docs/architecture.md), the forward's only by its GEMMs' bf16 operands xe and shared a (P 2 H + S 2 Is;
  // none in the fp8 mode: it writes no h, nor in fp8 xe), less on one GPU the (token, slot) rows (N k H 2),
  // which it pushes over xe once GEMM1 has read it, and the backward runs the pull and both GEMM1s
  // again. The forward and
  // the backward of one step must both run on Layers of the same recompute choice.
  bool recompute = false;
  // Routed rows this GPU's experts can hold: the per-row buffers (xe, h, a and the backward's
  // scratch) are sized for it (mok::own_padded_rows). 0: the most any routing can give them,
  // N min(k, E/G), which over G GPUs grows with the global batch N. A smaller capacity makes them
  // fall with G; a forward whose routing gives some GPU's experts more rows than its capacity holds
  // stops on every GPU with an error naming the GPU and the capacity that would hold them (no row is
  // dropped, no bit depends on it). The forward and the backward of one step use the same capacity.
  long capacity_rows = 0;
  // The fp8 mode: the forward and the backward read the weights quantized by the caller
  // (Layer::quantize_weights into ForwardInputs::fp8_weights, e.g. once per optimizer step) and never
  // quantize them themselves, so the workspace holds no E4M3 weights (workspace_bytes(Pass::backward) is
  // fp8_weights_bytes() smaller, and without recompute also the forward's E4M3 activations, which the
  // backward's own sections then lie over, with one ring cycle and simulated ranks from the forward's
  // slots on (and never shorter than the forward's): docs/architecture.md, "The backward's buffers";
  // workspace_bytes(Pass::forward) the forward's copies smaller) and every call needs
  // ForwardInputs::fp8_weights. Without it a call given fp8_weights reads them too, and one given none
  // quantizes the weights into its workspace first (the forward its copies, the backward both: recompute
  // mode's GEMM1 reads the forward's). Needs precision = fp8.
  bool fp8_weights_given = false;
  // The fp8 mode's routed-expert weight gradients on E4M3 operands too (the reference's
  // Options::fp8_weight_gradients; docs/accuracy.md, "FP8 weight gradients"): the backward quantizes dh,
  // xe, bf16(w dy) and a per column in 1 x 128 blocks along each expert's rows into transposed copies
  // (workspace_bytes(Pass::backward) grows by about (3I + 2H) bytes per padded row) and chains E4M3
  // K-steps over them. The shared expert's stay bf16. Needs precision = fp8.
  bool fp8_weight_gradients = false;
  // Experimental (issue 18; off: slower so far, docs/benchmarks.md sessions 57 and 58): kernels of their own, in
  // clusters of two blocks, whose expert GEMM phases run a cluster's two blocks on consecutive tiles in step,
  // loading a B they share once for both (the TMA's multicast): half the weights' reads from L2. The same
  // bits. Needs an even `blocks` (0: the co-resident clusters' blocks) and gpus = 1.
  bool paired_blocks = false;
};

struct WeightViews {
  TensorView router, expert_bias, w1, w2, shared_w1, shared_w2;  // expert_bias optional; shared_* with Is > 0
};

struct ForwardInputs {
  TensorView x;
  WeightViews weights;
  RoutingMode routing = RoutingMode::router;
  // The routing the mode gives, this GPU's tokens [N/G, k]: topk_idx (replay_ids, given) and topk_w
  // (given). The kernel checks it and writes it to ForwardOutputs' topk_idx and topk_w (on one GPU no
  // copy is enqueued besides the launch; across GPUs each GPU's share is copied into its window and
  // the result back, as any per-token input). Absent: it is read in place from ForwardOutputs'
  // topk_idx and topk_w, filled by the caller.
  TensorView topk_idx{}, topk_w{};
  // The fp8 mode only: this GPU's weights quantized by Layer::quantize_weights from the bf16 weights
  // of `weights` (u8 [fp8_weights_bytes()], 16-byte aligned; the caller keeps them in step: a
  // buffer quantized from other weights gives other results, unchecked). Present: the forward and the
  // backward read the E4M3 weights and their block scales from it and enqueue no quantization (the
  // views of the bf16 w1, w2 and shared_w* are still checked). Absent: each call quantizes them into
  // its workspace first; required with LaunchConfig::fp8_weights_given. Refused in bf16.
  TensorView fp8_weights{};
};

// The forward's results. topk_idx and topk_w hold the routing the layer used (the mode's given part
// from ForwardInputs, or in place); logits are absent in mode given.
struct ForwardOutputs {
  TensorView y, topk_idx, topk_w, logits, saved;
};

// Where a backward may keep its scratch besides its workspace, so that the workspace is smaller
// (Layer::workspace_bytes(Pass::backward, scratch); docs/architecture.md, "The backward's buffers").
//   in_d_w1          the dy ring, g, the routed a, dye and the (token, slot) rows lie in GradOutputs::d_w1
//                    until dW1's tiles overwrite them: dW2's tiles run first, a grid barrier before dW1's.
//                    Needs accumulate = false (refused otherwise, in every mode). In bf16 without
//                    recompute, where they fit in d_w1's bytes as bf16; elsewhere (the fp8 mode,
//                    recompute, a layout they do not fit) it changes nothing else.
//   dh_over_saved_h  dh is written over the saved buffer's h (the per-row phase reads each row of h and
//                    writes its dh in place), so the backward consumes ForwardOutputs::saved: a second
//                    backward from that buffer would read dh as h. Not in recompute mode (no h is saved).
struct BackwardScratch {
  bool in_d_w1 = false, dh_over_saved_h = false;
};

// Gradients. d_logits and d_router are absent in mode given. d_w1, d_w2 and d_shared_* are fp32 or bf16
// (all four alike; d_router is fp32). accumulate: the weight gradients are added into what the tensors
// hold (gradient accumulation over micro-batches), as core/gradient_add.h adds: in fp32 one rounding per
// element (held + this call's gradient); in bf16 autograd's two (the gradient rounded to bf16, then
// held + it rounded); a NaN sum is the canonical NaN. Otherwise they are
// overwritten; in bf16 each element is the fp32 gradient rounded once to nearest even, the bits of
// rounding the fp32 result afterwards, without its memory and its pass (bf16 parameters' gradients).
struct GradOutputs {
  TensorView dx{}, d_topk_w{}, d_logits{}, d_router{}, d_w1{}, d_w2{}, d_shared_w1{}, d_shared_w2{};
  bool accumulate = false;
  BackwardScratch scratch{};  // the workspace given holds workspace_bytes(Pass::backward, scratch) at least
};

// Where the last launch spent its time: from the previous grid barrier (or the kernel's start) to the
// barrier that closes the phase, summed over ring cycles, as block 0 saw it; the last entries, where no
// barrier follows, to the end of block 0's router-weight gradient tiles and to block 0's own end.
struct PhaseTime {
  std::string phase;
  double ms;
};

// Why a peer group's Layer (gpus > 1, or the nccl or colocated transport) is never captured in a CUDA
// graph: the reason its calls, and the PyTorch op's calls on a process group, give when refusing.
inline constexpr char peer_group_capture_refusal[] =
    "cannot be captured in a CUDA graph: its barriers across GPUs number each launch on the host, and a "
    "replay would reuse the captured numbers";

// One GPU's share of the layer: ranks [g R / G, (g + 1) R / G) of the config (GPU g of G), on the
// device current at construction. With G > 1 every GPU runs its own Layer, and a Layer's tensors are
// its share: x, y, dy, dx, topk_idx, topk_w, logits, d_topk_w, d_logits hold its ranks' N / G tokens
// (tokens [g N / G, (g + 1) N / G) of the global batch), w1, w2, d_w1, d_w2 its ranks' E / G experts
// (experts [g E / G, (g + 1) E / G)); router, expert_bias and the shared expert are whole and
// replicated, and every GPU receives the whole d_router and shared-expert gradients, whose chains over
// every token run GPU after GPU (docs/multi-gpu.md): the same bits on every GPU, those of one GPU (no
// all-reduce is needed). A given or replayed routing is given per GPU, for its tokens.
class Layer {
 public:
  // Simulated ranks (peers null), or GPU `gpu` of a peer group from make_peer_group (this process's
  // GPUs over NCCL, or colocated shares of one GPU): the group outlives its Layers, and the Layers of
  // all its GPUs are called alike (every forward and backward on every GPU of the group, the launches
  // of one step enqueued before any is waited for: they meet at barriers across GPUs).
  Layer(const LayerConfig& config, const LaunchConfig& launch, int gpu = 0, const PeerGroup* peers = nullptr);
  // GPU ncclCommUserRank of the caller's communicator, G = ncclCommCount (one process per GPU, or one
  // process of one GPU: G = 1). The communicator's device must be the current device; launch.gpus is
  // 1 or G, launch.transport not colocated. Rules for the callers, as for any NCCL collective:
  //   - construction is collective (it registers a symmetric window on the communicator): every rank
  //     constructs its Layers on the same communicator in the same order, and destroys them in the
  //     same order, before the communicator (the Layer never destroys it); ranks whose configs or
  //     launches' sizes differ, or whose window's allocation fails, are refused on every rank;
  //   - every rank makes the same sequence of forward and backward calls on its Layer (each launch
  //     meets the peers' launches of the same number at barriers across GPUs; a missing one is
  //     reported by the watchdog, after watchdog_seconds);
  //   - a Layer is destroyed only after its last call's work on the stream is done.
  Layer(const LayerConfig& config, const LaunchConfig& launch, ncclComm_t comm);
  ~Layer();
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  const LayerConfig& config() const;
  // Device memory a call of `pass` needs besides the caller's tensors (the forward's is a prefix of
  // the backward's: one workspace of workspace_bytes(Pass::backward) serves both). A backward given
  // GradOutputs::scratch needs workspace_bytes(Pass::backward, scratch), which may be smaller than the
  // forward's.
  size_t workspace_bytes(Pass pass, BackwardScratch scratch = {}) const;
  size_t saved_bytes() const;  // ForwardOutputs::saved
  int blocks() const;          // persistent blocks per launch (LaunchConfig::blocks resolved)
  int ring_rows() const;       // rows of each rank's dy ring (LaunchConfig::ring_rows resolved)

  // The fp8 mode's quantized weights, what a training framework computes once per optimizer step and
  // reuses for every micro-batch's forward and backward (ForwardInputs::fp8_weights). fp8_weights_bytes():
  // the size of the buffer (0 in bf16): this GPU's w1 and w2 (E/G experts) and the shared expert's, each
  // in E4M3 with one power-of-two scale per 128 x 128 block (docs/numerics.md), and the block-scale
  // tables; each twice: as stored (the forward's B) and transposed (the input gradients' B, K-major as
  // Hopper's FP8 wgmma takes it), so the buffer is about twice the E4M3 weights' bytes.
  // quantize_weights enqueues on `stream` the quantization of `weights`' w1, w2, shared_w1 and
  // shared_w2 (the shapes of ForwardInputs::weights; the router is not read) into `fp8_weights`
  // (u8 [fp8_weights_bytes()], 16-byte aligned), every byte of it written: the bits of the
  // quantization a call without fp8_weights makes, so either gives the same results. No
  // allocation, no host synchronisation (but LaunchConfig::synchronous), CUDA-graph safe; bad arguments,
  // or the bf16 mode, throw mok::Error before anything is enqueued. A call reading the buffer must be
  // stream-ordered after it, and a weight update after a quantization needs a new one. Its kernels
  // record no device errors (a launch error throws at the call), so check() does not wait for it.
  size_t fp8_weights_bytes() const;
  void quantize_weights(cudaStream_t stream, const WeightViews& weights, const TensorView& fp8_weights) const;

  // Enqueue the call's kernels on `stream` (the forward one; the backward two, its first phases then the rest,
  // and across GPUs with a shared expert a third) (and copies only where the NCCL transport stages its window; in the
  // fp8 mode without ForwardInputs::fp8_weights each call first enqueues the weights' quantization
  // into the workspace). `stream` is on the Layer's GPU. `workspace`: device memory, u8 [n] with n at least
  // workspace_bytes(pass), 16-byte aligned, not used by anything else until the call's work on the stream
  // is done.
  void forward(cudaStream_t stream, const TensorView& workspace, const ForwardInputs& in, const ForwardOutputs& out);
  // backward reads the forward's routing, logits and saved (not y, which may be absent) and dy; given
  // GradOutputs::scratch.dh_over_saved_h it also writes over saved's h (saved then serves no other backward).
  void backward(cudaStream_t stream, const TensorView& workspace, const ForwardInputs& in, const ForwardOutputs& fwd,
                const TensorView& dy, const GradOutputs& grads);

  // A call whose kernels stop on an error (or run while an earlier call's error is not raised yet) fills
  // the outputs it would write with NaN behind them: the forward's y, logits and topk_w (not a given
  // routing read in place from it); the backward's dx, d_topk_w,
  // d_logits and, unless it accumulates into them, d_router and the weight gradients. Accumulators are not
  // filled: an input error stops the call before it adds into them, but after a watchdog's or a peer's
  // error they may hold part of its sums (discard them). Its other outputs hold whatever they held.
  // check() waits for all work on the Layer's GPU (every stream: so also a CUDA graph's replay of its calls,
  // on whatever stream it runs) and throws the first error its kernels recorded, if any.
  void check();
  // The error recorded by this layer's launches that have completed ("" when none), without waiting;
  // a recorded error stays until raised by check() or the next call.
  struct DeviceError {
    int code = 0;  // 0: none
    std::string message;
  };
  DeviceError poll_error() const;

  // Every byte of a workspace (u8 [n], whatever n: one pass's) 0xff (tests: what the kernels read without
  // writing shows up).
  void poison_workspace(cudaStream_t stream, const TensorView& workspace) const;

  // Where the last completed call spent its time, phase by phase (waits for the GPU); a backward's are
  // those of its first kernel and the backward kernel, one clock.
  std::vector<PhaseTime> phase_times() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The windows through which the Layers of `launch.gpus` GPUs of this process reach each other, made
// once for a config and given to each GPU's Layer: Transport::nccl, GPUs 0 .. gpus-1 on one NCCL
// communicator made here; Transport::colocated, `gpus` shares of the current device (tests). Null
// for simulated ranks. Throws mok::Error for a launch no Layer would accept.
std::shared_ptr<const PeerGroup> make_peer_group(const LayerConfig& config, const LaunchConfig& launch);

// The device memory of one GPU's Layer for a config and launch, from the sizes the Layer itself uses
// (no GPU needed: plans for G beyond this machine's GPUs, and beyond the kMaxGpus a launch spans): the
// caller's saved buffer and workspace, and the window that a Layer of a peer group has (the nccl or
// colocated transport, gpus > 1 needing one). Throws mok::Error for what a Layer would refuse but G. The expert weights
// and their gradients (E/G experts per GPU) are the caller's and not counted; fp8_weights: the size of
// a caller's quantized weights (Layer::fp8_weights_bytes; 0 in bf16), which the workspace includes
// unless LaunchConfig::fp8_weights_given.
struct LayerMemory {
  size_t saved, workspace_forward, workspace_backward, window, fp8_weights;
};
// workspace_backward: that of a backward given `scratch` (GradOutputs::scratch).
LayerMemory layer_memory(const LayerConfig& config, const LaunchConfig& launch, BackwardScratch scratch = {});

// Throws mok::Error for a config and launch a Layer would refuse, no device asked: layer_memory's checks
// and the most GPUs a launch spans (a tool's check before it looks for GPUs).
void check_launch(const LayerConfig& config, const LaunchConfig& launch);

// The launch a Layer on a communicator of `ranks` ranks runs (its constructor's): as many GPUs, over the
// nccl transport, so windowed even at one rank; what layer_memory sizes for such a Layer.
inline LaunchConfig on_communicator(LaunchConfig launch, int ranks) {
  launch.gpus = ranks;
  launch.transport = Transport::nccl;
  return launch;
}

}  // namespace mok::gpu
