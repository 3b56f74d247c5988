// mok-gather-probe: can GEMM1 gather its A rows itself (docs/benchmarks.md, session 43, "Next")? Today
// the forward's pull copies x into xe (per padded row) and GEMM1's producer loads xe in two 64-row
// TMA boxes a K-block; gathered, the producer warpgroup would load each of a tile's 128 rows straight
// from its token's row of x, and the pull (xe, for the backward) could run off the critical path.
// Every SM runs one block shaped as the megakernel's (a producer warpgroup, two consumer warpgroups
// running consume() of tile_gemm.cuh), over every 128 x 256 tile of a GEMM1 of the shape asked for
// (its experts' row tiles, N = 2I, K = H; each expert its own B; random bf16 codes), without an
// epilogue. A's rows come three ways:
//   boxed     from xe (the rows gathered beforehand): produce(), two 64-row boxes a K-block;
//   cp-async  from x: each producer thread copies one row's 128 bytes (cp.async, 16 at a time) to
//             where the 128-byte swizzle puts them, and arrives on the stage once they have landed;
//   tma-rows  from x: each producer thread loads one row as a one-row TMA box (does the TMA swizzle a
//             row by its shared-memory address, as a 64-row box's rows?).
// B comes by the TMA in all three (thread 0). Each consumer thread folds its accumulators' bits into
// one word a tile: a gathered variant's words equal boxed's only if its A landed in the same layout.
// Prints per variant its time, its rate and whether its words equal boxed's (or that it timed out).
// Usage: mok-gather-probe [olmoe | kimi-k2]. Exit status: 0 ran and every variant equal, 1 a variant
// differs or timed out, 2 error (a fault in tma-rows included: then the driver's message), 77 no GPU.
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "device_array.cuh"
#include "mok/core/tool_exit.h"
#include "mok/megakernel/check.h"
#include "mok/megakernel/megakernel.h"
#include "mok/megakernel/ptx/cp_async.cuh"
#include "probe_operands.cuh"
#include "tensor_map.h"
#include "tile_gemm.cuh"

namespace mok::gpu {
namespace {

enum class Variant { boxed, cp_async, tma_rows };
constexpr const char* kVariantNames[] = {"boxed", "cp-async", "tma-rows"};

// A GEMM1 of one shape: its tiles (experts, an expert's row tiles and column tiles), K (H), and the
// tokens of x.
struct ProbeShape {
  const char* name;
  ExpertTiles tiles;
  int hidden, tokens;
};
constexpr ProbeShape kShapes[] = {{"olmoe", {64, 8, 8}, 2048, 8192}, {"kimi-k2", {32, 16, 16}, 7168, 8192}};

struct ProbeOperands {
  CUtensorMap xe, x_rows, w;  // xe and W1 in 64-row boxes, x in one-row boxes
  const bf16* x;              // [tokens, hidden]
  const int32_t* row_token;   // [experts tiles_m 128] each gathered row's token
  uint32_t* words;            // [tiles, kConsumerThreads] the accumulators' bits folded
  ExpertTiles tiles;
  int hidden;
};

// The stage offset of A's row r (of 128) and its 16-byte chunk c under the 128-byte swizzle of the
// operand maps: box r / 64, row r % 64 of 128 bytes, chunk c at c ^ (row % 8) (stages are 1024-byte
// aligned, the swizzle's period).
__device__ __forceinline__ int swizzled(int r, int c) {
  return r / kBox * kBoxBytes + r % kBox * 128 + (c ^ r % 8) * 16;
}

// What the consumers' stage-full barrier waits for beside the TMA's bytes: thread 0's expect, and in
// cp-async every producer thread's rows.
constexpr uint32_t full_arrivals(Variant v) { return v == Variant::cp_async ? 1 + kWarpgroupThreads : 1; }

// The producer warpgroup's K-blocks of tile t in the gathered variants: every thread waits for the
// stage to be free, thread 0 announces the TMA's bytes and loads B; thread r loads A's row r. In
// cp-async a thread's rows of K-block j land before it arrives, kLag K-blocks later (j + kLag's
// issue), so that several are in flight; `pipe.blocks` counts the K-blocks, as in produce(). consume()
// frees a stage only once the next K-block's stage is full (it keeps one wgmma group in flight), so
// the issue of K-block j, waiting for j - kStages's stage, needs j - kStages + 1 full: a lag of
// kStages - 1 waited on itself (every block's watchdog, session 45), kStages - 2 is the most.
constexpr int kLag = kStages - 2;
template <Variant kVariant>
__device__ bool produce_gathered(Pipeline& pipe, const ProbeOperands& op, int t, int k_blocks, const GridBarrier& b) {
  const int r = int(threadIdx.x), b0 = op.tiles.b_row(t);
  const int token = op.row_token[op.tiles.a_row(t) + r];
  const bf16* row = op.x + long(token) * op.hidden;
  for (int kb = 0; kb < k_blocks; ++kb, ++pipe.blocks) {
    if (!pipeline_wait(&pipe.smem->empty[pipe.stage()], pipe.parity() ^ 1u, b, 0)) return false;
    uint64_t* full = &pipe.smem->full[pipe.stage()];
    uint8_t* st = pipe.smem->stage[pipe.stage()];
    const int k = kBox * kb;
    if (r == 0) {
      ptx::mbarrier_arrive_expect_tx(full, kVariant == Variant::tma_rows ? kStageBytes : kBBoxes * kBoxBytes);
      for (int h = 0; h < 2; ++h)
        for (int box = 0; box < 2; ++box)
          ptx::tma_load_2d(st + (kABoxes + 2 * h + box) * kBoxBytes, &op.w, k, b0 + kTileN / 2 * h + kBox * box, full);
    }
    if constexpr (kVariant == Variant::tma_rows) {
      ptx::tma_load_2d(st + r / kBox * kBoxBytes + r % kBox * 128, &op.x_rows, k, token, full);
    } else {
      for (int c = 0; c < 8; ++c) ptx::cp_async_16(st + swizzled(r, c), row + k + 8 * c);
      ptx::cp_async_commit();
      if (pipe.blocks >= uint32_t(kLag)) {
        ptx::cp_async_wait<kLag>();
        ptx::fence_async_shared();  // the landed rows, before the tensor cores read them
        ptx::mbarrier_arrive(&pipe.smem->full[pipe.stage(kStages - kLag)]);  // K-block blocks - kLag
      }
    }
  }
  return true;
}

// cp-async's last kLag K-blocks (or all, if fewer): landed, then arrived.
__device__ void drain_gathered(const Pipeline& pipe) {
  ptx::cp_async_wait<0>();
  ptx::fence_async_shared();
  const uint32_t first = pipe.blocks > uint32_t(kLag) ? pipe.blocks - kLag : 0;
  for (uint32_t j = first; j < pipe.blocks; ++j) ptx::mbarrier_arrive(&pipe.smem->full[j % kStages]);
}

template <Variant kVariant>
__global__ void __launch_bounds__(kThreads, 1) probe_kernel(const __grid_constant__ ProbeOperands op, GridBarrier b) {
  Pipeline pipe = pipeline_init(full_arrivals(kVariant));
  const int tiles = op.tiles.count(), k_blocks = op.hidden / kBox;
  const int warpgroup = __shfl_sync(~0u, int(threadIdx.x) / kWarpgroupThreads, 0);
  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<kProducerRegisters>();
    if constexpr (kVariant == Variant::boxed) {
      if (threadIdx.x == 0)
        for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
          const int b0 = op.tiles.b_row(t);
          if (!produce<kNT, false, false>(
                  pipe, TileLoad{&op.xe, &op.w, op.tiles.a_row(t), {b0, b0 + kTileN / 2}, 0, 0, k_blocks}, b, 0))
            break;
        }
    } else {
      bool healthy = true;
      for (int t = blockIdx.x; t < tiles && healthy; t += gridDim.x)
        healthy = produce_gathered<kVariant>(pipe, op, t, k_blocks, b);
      if constexpr (kVariant == Variant::cp_async) drain_gathered(pipe);
    }
    return;
  }
  ptx::setmaxnreg_inc<kConsumerRegisters>();
  const Warpgroup consumer = warpgroup_role(warpgroup);
  const int thread = consumer_index(consumer) * kWarpgroupThreads + int(threadIdx.x) % kWarpgroupThreads;
  float acc[kAccumulators];
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;  // consume() continues from acc's values
    TileLoad l{};
    l.k_blocks = k_blocks;
    if (!consume<kNT>(pipe, l, consumer, acc, b, 0)) break;
    uint32_t word = 0;
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) word = word * 0x01000193u ^ __float_as_uint(acc[i]);
    op.words[long(t) * kConsumerThreads + thread] = word;
  }
}

// Each gathered row's token: a hash of the row, so a tile's rows come from all over x.
__global__ void pick_tokens(int32_t* row_token, long rows, int tokens) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < rows; i += long(gridDim.x) * blockDim.x) {
    row_token[i] = int32_t(index_hash(uint64_t(i)) % uint32_t(tokens));
  }
}

// xe: x's rows of row_token, a warp per row.
__global__ void gather_rows(bf16* xe, const bf16* x, const int32_t* row_token, long rows, int hidden) {
  const long warps = long(gridDim.x) * blockDim.x / 32;
  for (long i = (blockIdx.x * long(blockDim.x) + threadIdx.x) / 32; i < rows; i += warps)
    for (int h = int(threadIdx.x % 32); h < hidden; h += 32) xe[i * hidden + h] = x[long(row_token[i]) * hidden + h];
}

// One variant over the shape: a warm-up launch, then one timed; its words.
template <Variant kVariant>
std::vector<uint32_t> run(const ProbeShape& s, ProbeOperands& op, DeviceArray<uint32_t>& words, int sms) {
  DeviceArray<KernelError> error(1);
  error.zero();
  const GridBarrier barrier{nullptr, nullptr, error.get(), 2'000'000'000, {}, {}};  // a 2 s watchdog
  const auto kernel = probe_kernel<kVariant>;
  MOK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  cudaEvent_t begin, end;
  MOK_CUDA_CHECK(cudaEventCreate(&begin));
  MOK_CUDA_CHECK(cudaEventCreate(&end));
  float ms = 0;
  for (int launch = 0; launch < 2; ++launch) {
    words.poison();
    MOK_CUDA_CHECK(cudaEventRecord(begin));
    kernel<<<sms, kThreads, kSmemBytes>>>(op, barrier);
    MOK_CUDA_CHECK(cudaGetLastError());
    MOK_CUDA_CHECK(cudaEventRecord(end));
    MOK_CUDA_CHECK(cudaEventSynchronize(end));
    MOK_CUDA_CHECK(cudaEventElapsedTime(&ms, begin, end));
  }
  MOK_CUDA_CHECK(cudaEventDestroy(begin));
  MOK_CUDA_CHECK(cudaEventDestroy(end));
  const KernelError e = error.download()[0];
  if (e.code != kNoError) {  // the blocks left their loops: the context is sound, the next variant runs
    std::printf("%-9s a pipeline wait timed out (block %d)\n", kVariantNames[int(kVariant)], e.detail);
    return {};
  }
  const double tiles = s.tiles.count();
  const double flops = 2.0 * kTileRows * kTileN * double(s.hidden) * tiles;
  std::printf("%-9s %8.3f ms  %6.1f TFLOP/s", kVariantNames[int(kVariant)], ms, flops / ms / 1e9);
  return words.download();
}

int probe(const ProbeShape& s, int sms) {
  const long rows = long(s.tiles.experts) * s.tiles.tiles_m * kTileRows;
  const long w_rows = long(s.tiles.experts) * s.tiles.tiles_n * kTileN, tiles = s.tiles.count();
  const DeviceArray<uint8_t> x = device_bytes(size_t(s.tokens) * s.hidden * 2, true, false, 0, sms);
  const DeviceArray<uint8_t> w = device_bytes(size_t(w_rows) * s.hidden * 2, true, false, 0, sms);
  DeviceArray<int32_t> row_token(rows);
  DeviceArray<bf16> xe(size_t(rows) * s.hidden);
  DeviceArray<uint32_t> words(size_t(tiles) * kConsumerThreads);
  pick_tokens<<<4 * sms, 256>>>(row_token.get(), rows, s.tokens);
  MOK_CUDA_CHECK(cudaGetLastError());
  const auto* x_bf16 = reinterpret_cast<const bf16*>(x.get());
  gather_rows<<<4 * sms, 256>>>(xe.get(), x_bf16, row_token.get(), rows, s.hidden);
  MOK_CUDA_CHECK(cudaGetLastError());
  auto op = std::make_unique<ProbeOperands>();  // on the heap: CUtensorMap's alignment
  encode_tensor_map(op->xe, xe.get(), rows, s.hidden);
  encode_tensor_map(op->x_rows, x.get(), s.tokens, s.hidden, MapElement::bf16, 1);
  encode_tensor_map(op->w, w.get(), w_rows, s.hidden);
  op->x = x_bf16, op->row_token = row_token.get(), op->words = words.get();
  op->tiles = s.tiles, op->hidden = s.hidden;
  std::printf("mok-gather-probe: %s's GEMM1, %ld tiles of 128 x 256, K %d, on %d SMs\n", s.name, tiles, s.hidden, sms);
  const std::vector<uint32_t> boxed = run<Variant::boxed>(s, *op, words, sms);
  if (boxed.empty()) return 2;  // nothing to compare with
  std::printf("\n");
  int status = 0;
  const auto compare = [&](const std::vector<uint32_t>& got) {
    if (got.empty()) {  // timed out
      status = 1;
      return;
    }
    long differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != boxed[i];
    std::printf("  %s\n", differ ? ("DIFFERS from boxed in " + std::to_string(differ) + " of " +
                                    std::to_string(got.size()) + " words")
                                       .c_str()
                                 : "equal to boxed, every word");
    if (differ) status = 1;
  };
  compare(run<Variant::cp_async>(s, *op, words, sms));
  compare(run<Variant::tma_rows>(s, *op, words, sms));  // last: a fault ends the process's context
  return status;
}

}  // namespace
}  // namespace mok::gpu

constexpr const char* kUsage = "usage: mok-gather-probe [olmoe|kimi-k2]\n";

int tool_main(int argc, char** argv) {
  using namespace mok::gpu;
  if (mok::printed_help(argc, argv, kUsage)) return 0;
  if (argc > 2) {  // an extra argument was ignored
    std::fputs(kUsage, stderr);
    return 2;
  }
  const char* name = argc > 1 ? argv[1] : "olmoe";
  const ProbeShape* shape = nullptr;
  for (const ProbeShape& s : kShapes)
    if (std::strcmp(s.name, name) == 0) shape = &s;
  if (!shape) {
    std::fprintf(stderr, "mok-gather-probe: unknown shape '%s' (olmoe or kimi-k2)\n", name);
    return 2;
  }
  if (!device_available()) {
    std::printf("mok-gather-probe: no Hopper GPU, skipped\n");
    return 77;
  }
  try {
    int sms = 0;
    MOK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    return probe(*shape, sms);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nmok-gather-probe: %s\n", e.what());
    return 2;
  }
}

// A report lost to a full disk or a closed pipe is no success.
int main(int argc, char** argv) { return mok::tool_exit_status("mok-gather-probe", tool_main(argc, argv)); }
