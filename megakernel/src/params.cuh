// Device-side parameters of the persistent kernels: one struct, passed by value.
#pragma once

#include <cuda.h>

#include "mok/core/bf16.h"
#include "mok/core/config.h"
#include "mok/core/fp8.h"
#include "mok/core/layer_io.h"
#include "mok/core/saved_layout.h"

namespace mok::gpu {

inline constexpr int kMaxRanks = 64;
inline constexpr int kMaxGpus = 8;

// What one rank exposes to its peers. With simulated ranks these are slices of one allocation;
// across GPUs (NCCL symmetric windows) the same table holds peer pointers (docs/multi-gpu.md).
struct RankBuffers {
  const bf16* x;            // [T, H]  pulled by expert ranks (dispatch), a few rows by the previous GPU
  const bf16* dy;           // [T, H]  pulled by expert ranks (reverse combine), the same few rows
  const int32_t* topk_idx;  // [T, k]  gathered by every GPU's forward (the dispatch layout is global)
  const float* topk_w;      // [T, k]
  bf16* slots;              // [T, k, H] expert ranks push y_j (forward) or dx_j (backward) here
  float* d_topk_w;          // [T, k]    expert ranks push d topk_w here
};

// The barrier across GPUs: GPU i's window holds flag word j = the last barrier GPU j reached. A
// barrier's number is epoch + the barriers before it in this launch (the same on every GPU; 32 bits,
// compared by difference), so flags only grow and are never reset.
// The abort word: a GPU whose launch stops on an error writes its mark, epoch + its index + 1, into
// every peer's abort word, and a peer waiting at a barrier across GPUs ends its launch on seeing a mark
// of this launch or a later one (grid_sync.cuh, stopped_peer). The epoch is 64 bits and a multiple of kEpochStride, so
// a mark of an earlier launch never reads as one of this launch and the words need no reset (a reset would race with a
// faster peer's mark for the next launch).
inline constexpr int kEpochStride = 16;  // above the barriers across GPUs a launch passes
static_assert(kMaxGpus < kEpochStride, "a launch's abort marks stay below the next launch's epoch");
struct PeerSync {
  int gpus, me;                         // gpus = 1: no peers (simulated ranks)
  unsigned int* flags[kMaxGpus];        // each GPU's flag words, as this GPU reaches them
  unsigned long long* abort[kMaxGpus];  // each GPU's abort word, as this GPU reaches it
  unsigned long long epoch;  // kEpochStride x the Layer's earlier launches (relayed_chains_kernel: its backward's)
  unsigned int* count;       // barriers passed in this launch (block 0's counter)
};

// Across GPUs, the chains that run over every token in token order (the shared expert's weight
// gradients, the router's): GPU g continues GPU g-1's partial sums over its own tokens and hands them to
// GPU g+1; the last GPU's sums are the gradients, which it hands to every GPU (docs/multi-gpu.md, "The
// shared expert and the router across GPUs"). A unit of work (a shared-gradient tile's consumer half,
// a chain tile of the router gradient) is handed over with a flag: this launch's `partial` or
// `result` value (epoch-based, so flags only grow and are never reset).
struct ChainRelay {
  float* in;               // this GPU's window: the partials it continues, then the results
  const float* zeros;      // a half tile of zeros (the first GPU's chains start from it)
  unsigned int* in_flags;  // one per unit
  float* out[kMaxGpus];    // every GPU's `in`, as this GPU reaches it
  unsigned int* out_flags[kMaxGpus];
  unsigned int partial, result;  // this launch's flag values
};
// Where the watchdog or an input check stopped a kernel.
struct KernelError {
  int code;  // 0: none; see ErrorCode
  int phase;
  int cycle;
  int detail;  // the block that waited (timeout), the GPU (peer errors), the tiles (capacity)
  // kLogitOverflow, kBadRouting, kSavedLayout: the earliest launch's smallest bad token, as (~launch << 32 | ~token),
  // an atomicMax from the zeroed word (record_bad_token); the low 32 bits are ~token.
  unsigned long long bad_token_key;
  unsigned int bad_token() const { return ~unsigned(bad_token_key); }
};

enum ErrorCode : int {
  kNoError = 0,
  kBarrierTimeout = 1,
  kLogitOverflow = 2,
  kPipelineTimeout = 3,
  kPeerTimeout = 4,   // detail: the GPU that did not arrive
  kBadRouting = 5,    // the token whose given routing is out of range, repeated or not finite
  kPeerAborted = 6,   // detail: the GPU whose launch stopped on an error (its abort mark)
  kCapacity = 7,      // cycle: the first GPU whose experts got more tiles than its buffers hold; detail: those tiles
  kRingCycles = 8,    // detail: the ring cycles the backward needs where its workspace allows one
  kRelayTimeout = 9,  // detail: the GPU whose partial sums did not come (ChainRelay)
  kSavedLayout = 10,  // the saved dispatch layout is not the routing's: at a token, or (no token) no layout
  kExpertBias = 11,   // detail: the smallest expert whose expert_bias is not finite
};

// The grid barriers of the persistent kernels, each named after the phase it closes (watchdog reports);
// the last two name block 0's stamps where no barrier follows.
enum Phase : int {
  kStart,
  kRoutingCheck,
  kRouterLogits,
  kRouterSelect,
  kLayoutCount,
  kLayoutScan,
  kLayoutPlace,
  kPull,
  kExpertUp,
  kExpertDown,
  kDownGrad,
  kRowGrad,
  kDxPush,
  kRouterGrad,
  kWeightGrad,
  kTileTable,
  kGradOperands,
  kSharedDx,
  kCombineDx,
  kDyePull,
  kDownWeightGrad,
  kRouterWeightChains,
  kEnd,
  kPhaseCount
};
inline constexpr const char* kPhaseNames[kPhaseCount] = {"start (GPUs meet)",
                                                         "given routing check",
                                                         "router logits",
                                                         "router top-k",
                                                         "layout count",
                                                         "layout scan",
                                                         "layout place (+ shared expert GEMM1)",
                                                         "pull (+ shared expert GEMM2)",
                                                         "expert GEMM1",
                                                         "expert GEMM2",
                                                         "expert dy W2",
                                                         "router-weight grad and SwiGLU backward",
                                                         "dx push",
                                                         "router backward (+ shared expert dy W2)",
                                                         "weight gradients",
                                                         "tile table",
                                                         "fp8 weight gradients' operands",
                                                         "shared expert dx",
                                                         "dx combine (+ other blocks' router-weight tiles)",
                                                         "dye pull",
                                                         "dW2 weight gradients (first: the scratch in d_w1)",
                                                         "router-weight gradient (block 0's tiles)",
                                                         "after the last barrier (block 0's share)"};
static_assert(kPhaseNames[kPhaseCount - 1] != nullptr, "a phase without a name (kPhaseNames is short)");

// Where the time goes: block 0 stamps the global timer at the kernel's start (phase -1), as it leaves
// each grid barrier (the phase the barrier closes) and at kRouterWeightChains and kEnd, up to
// kClockEntries stamps. The backward's first kernel (backward_prologue) starts the clock and stamps its
// last phase as block 0 ends it; the backward kernel's stamps follow, its first phase holding the
// other blocks' ends of the prologue and the gap between the launches.
inline constexpr int kClockEntries = 1024;
struct PhaseClock {
  long long* ns;  // [kClockEntries]
  int* phase;     // [kClockEntries]
  int* count;     // stamps taken
};

struct GridBarrier {
  unsigned int* arrived;
  unsigned int* generation;
  KernelError* error;
  long long timeout_ns;
  PhaseClock clock;
  PeerSync peers;  // here, not beside: an error recorded anywhere is announced to the peers
};

// TMA descriptors of every matrix the GEMM phases read (row-major, 64 x 64 boxes, 128-byte swizzle),
// and of the weight gradients they store or add into (64 rows x 64 bytes, 64-byte swizzle:
// store_rows_by_tma).
// The weights are read as the caller stores them: K-major in the forward, MN-major in the backward.
// The fp8 mode's GEMMs read E4M3 operands instead (64 rows x 128 boxes): the *q maps, K-major both, so
// its input gradients read the weights' transposed copies (w1tq, w2tq, ...).
struct TensorMaps {
  CUtensorMap ring, w1, w2, a, dh, dye, xe, x, dy;
  CUtensorMap shared_w1, shared_w2, shared_a, shared_dh;
  CUtensorMap xq, w1q, aq, w2q, shared_xq, shared_w1q, shared_aq, shared_w2q;
  CUtensorMap ringq, w2tq, dhq, w1tq, shared_dyq, shared_w2tq, shared_dhq, shared_w1tq;
  CUtensorMap dhtq, xetq, dyetq, atq;                // the fp8 weight gradients' (Fp8Columns)
  CUtensorMap d_w1, d_w2, d_shared_w1, d_shared_w2;  // weight gradients copied by TMA (store_weight_grad)
};

// An E4M3 matrix of the fp8 mode and its scale exponents (mok/core/fp8_gemm.h): per 1 x 128 block of
// each row along K (activations: [rows / 128, K / 128, 128], so a GEMM stage copies a tile's 128 rows of
// one K-block whole) or per 128 x 128 block (weights: [rows / 128, K / 128]).
struct Fp8Matrix {
  fp8_e4m3* values;
  int32_t* exps;

  // Row r of an activation of `cols` columns: its exponent of block b is block_exp(b).
  __host__ __device__ Fp8Matrix row(long r, int cols) const {
    return {values + r * cols, exps + (r / kFp8Block * (cols / kFp8Block)) * kFp8Block + r % kFp8Block};
  }
  __host__ __device__ int32_t& block_exp(int b) const { return exps[long(b) * kFp8Block]; }
};

// An operand of the fp8 weight gradients (LaunchConfig::fp8_weight_gradients): a [P, cols] per-row
// buffer (dh, xe, dye or a) transposed and quantized per column in 1 x 128 blocks along its rows, so
// K-major with K the padded rows; a block is one expert tile's rows of one column. A's (dh, dye):
// exps[b, c] = e of column c's block b; B's (xe, a): scales[b, c] = 2^e and exp_range[b], the smallest
// and largest e of block row b (x, y; promote_columns' window); the other role's are null. Rows of
// column_scale_stride(cols): a tile copies whole rows.
struct Fp8Columns {
  fp8_e4m3* values;  // [cols, P]
  int8_t* exps;      // [P / 128, column_scale_stride(cols)]  A's
  float* scales;     // [P / 128, column_scale_stride(cols)]  B's
  int4* exp_range;   // [P / 128]                             B's
};

// The saved buffer's bytes that no phase writes (mok/core/saved_layout.h): the layout region
// [0, head), whose alignment gaps lie between the arrays the layout writes, and [tail, end).
struct SavedGaps {
  uint8_t* base;
  long head, tail, end;
};

struct Params {
  LayerConfig c;
  int ring_rows;
  RoutingMode routing;        // replay_ids, given: the routing read from given_topk_idx (and given_topk_w)
  bool accumulate;            // the backward adds its weight gradients into d_router, d_w1, ... (GradOutputs)
  bool grads_bf16;            // d_w1, d_w2, d_shared_* are bf16 (GradOutputs), else fp32
  bool recompute;             // xe, h, shared h and a are the workspace's: the backward makes them again first
  bool one_ring_cycle;        // dh or a lies over the ring (workspace_layout): a second cycle would overwrite it
  bool fp8_weight_gradients;  // the fp8 backward's routed weight gradients on E4M3 operands (dhtq, xetq, dyetq, atq)
  bool dw2_first;             // the scratch lies in d_w1 (BackwardScratch::in_d_w1): dW2's tiles, a barrier, dW1's
  int rank_begin, rank_end;   // the ranks this GPU executes: its tokens, rings and experts
  int gpus;                   // GPUs of the launch (1: simulated ranks)
  long padded_rows;           // rows of the per-row buffers: this GPU's experts' tiles (own_padded_rows)
  RankBuffers rank[kMaxRanks];
  GridBarrier barrier;
  unsigned int* claimed_tiles;  // combine_dx's tiles taken (ClaimedTiles), zeroed before each launch
  // The weight gradients' tiles taken (ClaimedWalk), a word per walk: the first (the fp8 phase's, or dW2's
  // with dw2_first), then the second (the bf16 one's, or dW1's); zeroed so too.
  unsigned int* claimed_weight_grads;
  TensorMaps maps;

  // Weights. The router's are every expert's; w1 and w2 (read through the maps) this GPU's experts'
  // (own_expert).
  const float* router_w;     // [E, H]
  const float* expert_bias;  // [E] or null

  // x and dy of this GPU's shared_tokens (row 0: its first token): the caller's tensors with simulated
  // ranks (one GPU: every token), else this GPU's window, its own tokens' rows copied in and the few
  // that follow them gathered (a shared expert's last K-step).
  bf16* x;                  // [S, H]
  bf16* dy;                 // [S, H]
  TokenRows shared_tokens;  // the shared expert's tokens on this GPU (mok/core/saved_layout.h)
  long shared_capacity;     // rows of its sections, S (shared_rows_capacity)
  ChainRelay relay;         // across GPUs

  // Routing and dispatch layout. logits is the caller's: this GPU's tokens only (own_token_row).
  float* logits;      // [N/G, E]
  int32_t* topk_idx;  // [N, k] global view (across GPUs the backward's holds only its own tokens current: slot_expert)
  float* topk_w;      // [N, k] global view
  // The mode's given routing, checked and copied into topk_idx, topk_w: the caller's tensors (one GPU),
  // or topk_idx, topk_w themselves (across GPUs, where each GPU's share was copied into its window).
  const int32_t* given_topk_idx;  // [N, k]
  const float* given_topk_w;      // [N, k]
  int32_t* chunk_counts;          // [chunks, E]
  int32_t* chunk_base;            // [chunks, E]
  int32_t* offsets;               // [E + 1]
  int32_t* tile_offsets;          // [E + 1] 128-row tiles before expert e
  int32_t* tile_expert;           // [padded_rows(c) / 128] each expert tile's expert (index_tiles, every launch)
  int32_t* row_source;            // [N k]
  int32_t* slot_row;              // [N k]

  bf16* ring;  // [R/G ring_rows, H] the executed ranks' dy receive rings (ring_base)

  // Per padded layout row (P rows: mok/core/saved_layout.h, schedule.cuh).
  bf16* h;               // [P, 2I]  saved, or the workspace's (recompute)
  bf16* a;               // [P, I]   the workspace's (never saved; the backward's from h); null in the fp8 forward
  float* g;              // [R/G ring_rows, I]  dy W2 (backward): per ring row, not padded row
  bf16* dh;              // [P, 2I]  (backward)
  bf16* dye;             // [P, H]   bf16(w dy) (backward, after the ring cycles)
  bf16* xe;              // [P, H]   the row's token x, pulled by the bf16 forward (GEMM1's A, dW1's operand);
                         //          in recompute mode and in fp8 (saves_xe) a workspace section the backward pulls
  SavedGaps saved_gaps;  // zeroed by the forward

  // The fp8 mode (c.precision, forward_fp8_kernel): the forward's GEMMs read these E4M3 copies (maps xq, w1q, ...). The
  // weights are quantized on the stream before the launch, the activations by the phase that makes them.
  // A weight's exponent table has one block row more than the weight (a tile's half past the weight's
  // last row reads it; those columns are never stored); an activation's has whole 128-row tiles.
  Fp8Matrix xq;         // [P, H]  xe, quantized by the pull
  Fp8Matrix aq;         // [P, I]  a, quantized by GEMM1's epilogue
  Fp8Matrix shared_xq;  // [S, H]  x of shared_tokens (the shared expert's GEMM1)
  Fp8Matrix shared_aq;  // [S, Is]
  const int32_t *w1_exp, *w2_exp, *shared_w1_exp, *shared_w2_exp;
  // The fp8 backward's (backward_fp8_kernel): dy and dh quantized where they are made, and the tables of
  // the weights' transposed copies (W^T's 128 x 128 blocks by W^T's block rows).
  Fp8Matrix ringq;       // [R/G ring_rows, H]   dy of the ring rows, quantized by the pull (the bf16 ring's place)
  Fp8Matrix dhq;         // [R/G ring_rows, 2I]  dh per ring row, quantized by the per-row phase
  Fp8Matrix shared_dyq;  // [S, H]   dy of shared_tokens
  Fp8Matrix shared_dhq;  // [S, 2Is]
  const int32_t *w1t_exp, *w2t_exp, *shared_w1t_exp, *shared_w2t_exp;
  // The fp8 weight gradients' operands (fp8_weight_gradients; quantize_grad_operands): dW1_e = dh^T xe,
  // dW2_e = dye^T a.
  Fp8Columns dhtq, xetq, dyetq, atq;

  // Shared expert, per token of shared_tokens (row 0: its first).
  bf16* shared_h;   // [S, 2Is]
  bf16* shared_a;   // [S, Is]
  bf16* shared_y;   // [S, H]  (forward) / shared dx (backward)
  bf16* shared_dh;  // [S, 2Is]

  // Outputs: the caller's tensors, this GPU's tokens and experts (own_token_row, own_expert), but
  // d_router and the shared expert's (whole, the same bits on every GPU).
  bf16* y;          // [N/G, H]
  bf16* dx;         // [N/G, H]
  float* d_logits;  // [N/G, E]
  float* d_router;  // [E, H]
  // The weight gradients (fp32 or bf16: grads_bf16) only through their maps, TensorMaps::d_w1, ...
};

// Ranks over several GPUs (or colocated shares of one): the phases gather what peers own.
__host__ __device__ inline bool across_gpus(const Params& p) { return p.barrier.peers.gpus > 1; }

// The router ran (its logits exist, its gradient flows): every mode but a given routing.
__host__ __device__ inline bool has_router(const Params& p) { return p.routing != RoutingMode::given; }

}  // namespace mok::gpu
