// The FP8 mode's weight quantization (quantize_fp8.h): one CTA per 128 x 128 block, each of its 256
// threads an 8 x 8 square of it. A thread reads its square's 8 rows as 16-byte vectors (16 threads read
// a block row's 256 bytes), the CTA takes the largest magnitude as quantize_block does (the largest
// bits & 0x7fff of the bf16 values: finite magnitudes order as their bits, and Inf and NaN give what
// they give there), e4m3_scale_exponent and to_e4m3x2_scaled (the core's functions: the CPU's code, the
// codes by the hardware conversion proven equal to it) give the scale and the codes, and the thread
// writes its 8 rows of codes as 8-byte vectors (16 threads: a 128-byte row of the block). For W^T the
// thread transposes its square in registers (byte permutes) and stores its 8 columns into a shared
// 128 x 128 tile as 8-byte rows; after one barrier the CTA writes the tile out as 16-byte vectors, 8
// threads to a 128-byte row of W^T. The tile is XOR-swizzled in 8-byte chunks so that both the writes
// and the reads are free of bank conflicts.
#include <limits>
#include <string>
#include <string_view>

#include "alignment.h"
#include "mok/core/config.h"
#include "mok/core/fp8_gemm.h"
#include "mok/megakernel/check.h"
#include "quantize_fp8.h"

namespace mok::gpu {
namespace {

constexpr int kBlock = kFp8Block;              // 128: a block's rows and columns
constexpr int kSquare = 8;                     // a thread's square: 8 x 8 values
constexpr int kSquares = kBlock / kSquare;     // 16 squares along a block's side
constexpr int kThreads = kSquares * kSquares;  // 256
constexpr int kWarps = kThreads / 32;
static_assert(kSquare * sizeof(bf16) == sizeof(uint4), "a square's row of bf16 values is one 16-byte vector");

// The E4M3 codes of the four bf16 values in words a (values 0, 1) and b (values 2, 3), value 0 in the
// low byte: quantize_block's conversion of each, two at a time (to_e4m3x2_scaled).
__device__ __forceinline__ uint32_t codes4(uint32_t a, uint32_t b, int e) {
  const auto codes = [e](uint32_t v) -> uint32_t {
    return to_e4m3x2_scaled(to_float(bf16{uint16_t(v & 0xffffu)}), to_float(bf16{uint16_t(v >> 16)}), e);
  };
  return codes(a) | codes(b) << 16;
}

// Byte j of each of a, b, c and d, a's in the low byte.
__device__ __forceinline__ uint32_t bytes_at(uint32_t a, uint32_t b, uint32_t c, uint32_t d, int j) {
  const uint32_t select = uint32_t(j) | uint32_t(j + 4) << 4;
  return __byte_perm(__byte_perm(a, b, select), __byte_perm(c, d, select), 0x5410);
}

// Grid: one CTA per block, in the order of exps ([matrices, rows/128, cols/128]).
__global__ void __launch_bounds__(kThreads)
    quantize_blocks(const bf16* __restrict__ w, int rows, int cols, fp8_e4m3* __restrict__ q,
                    fp8_e4m3* __restrict__ q_t, int32_t* __restrict__ exps, int32_t* __restrict__ exps_t) {
  __shared__ uint4 tile[kBlock * kBlock / sizeof(uint4)];  // W^T's block: 128 rows of 128 codes, swizzled
  __shared__ uint32_t warp_amax[kWarps];

  const int across = cols / kBlock, down = rows / kBlock;
  const int64_t block = blockIdx.x, rest = block / across;
  const int block_col = int(block % across), block_row = int(rest % down);
  const int64_t matrix = rest / down * rows * cols;  // the matrix's first element
  const int square_col = threadIdx.x % kSquares, square_row = threadIdx.x / kSquares;
  const int row = block_row * kBlock + square_row * kSquare, col = block_col * kBlock + square_col * kSquare;

  uint4 in[kSquare];  // the square's rows, 8 bf16 values each
  const bf16* src = w + matrix + int64_t(row) * cols + col;
#pragma unroll
  for (int i = 0; i < kSquare; ++i) in[i] = __ldg(reinterpret_cast<const uint4*>(src + int64_t(i) * cols));

  // The largest magnitude's bits, two bf16 values to a word.
  uint32_t pair = 0;
#pragma unroll
  for (int i = 0; i < kSquare; ++i) {
    constexpr uint32_t kMagnitudes = 0x7fff7fffu;
    pair = __vmaxu2(pair, __vmaxu2(__vmaxu2(in[i].x & kMagnitudes, in[i].y & kMagnitudes),
                                   __vmaxu2(in[i].z & kMagnitudes, in[i].w & kMagnitudes)));
  }
  uint32_t amax = __reduce_max_sync(0xffffffffu, max(pair & 0xffffu, pair >> 16));
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kWarps; ++k) amax = max(amax, warp_amax[k]);
  const int e = block_scale_exponent(amax);
  if (threadIdx.x == 0) {
    exps[block] = e;
    // W^T's table: matrix, then the block's column (W^T's block row), then its row.
    if (exps_t) exps_t[(rest / down * across + block_col) * down + block_row] = e;
  }

  // The square's codes: row i's values 0-3 in lo[i], 4-7 in hi[i].
  uint32_t lo[kSquare], hi[kSquare];
  fp8_e4m3* dst = q + matrix + int64_t(row) * cols + col;
#pragma unroll
  for (int i = 0; i < kSquare; ++i) {
    lo[i] = codes4(in[i].x, in[i].y, e);
    hi[i] = codes4(in[i].z, in[i].w, e);
    *reinterpret_cast<uint2*>(dst + int64_t(i) * cols) = make_uint2(lo[i], hi[i]);
  }
  if (q_t == nullptr) return;  // the same for the whole grid

  // The square's column j is the tile's row square_col * 8 + j, its 8-byte chunk square_row: stored at
  // chunk square_row ^ square_col. A half warp (one square_row, square_col 0..15) so writes 16 chunks of
  // distinct bank pairs.
  constexpr int kChunksPerRow = kBlock / int(sizeof(uint2));  // 16
  uint2* tile_chunks = reinterpret_cast<uint2*>(tile);
#pragma unroll
  for (int j = 0; j < kSquare; ++j) {
    const uint2 column =
        j < 4 ? make_uint2(bytes_at(lo[0], lo[1], lo[2], lo[3], j), bytes_at(lo[4], lo[5], lo[6], lo[7], j))
              : make_uint2(bytes_at(hi[0], hi[1], hi[2], hi[3], j - 4), bytes_at(hi[4], hi[5], hi[6], hi[7], j - 4));
    tile_chunks[(square_col * kSquare + j) * kChunksPerRow + (square_row ^ square_col)] = column;
  }
  __syncthreads();

  // 16-byte pair s of tile row t holds chunks 2s, 2s + 1 of the row at s ^ (f >> 1), f = t / 8, in that
  // order for an even f and swapped for an odd one. 8 threads read a row: all 32 banks.
  constexpr int kVectorsPerRow = kBlock / int(sizeof(uint4));  // 8
  fp8_e4m3* dst_t = q_t + matrix + int64_t(block_col) * kBlock * rows + block_row * kBlock;
#pragma unroll
  for (int k = 0; k < kBlock * kVectorsPerRow / kThreads; ++k) {
    const int v = threadIdx.x + k * kThreads, t = v / kVectorsPerRow, s = v % kVectorsPerRow, f = t / kSquare;
    uint4 codes = tile[t * kVectorsPerRow + (s ^ (f >> 1))];
    if (f & 1) codes = make_uint4(codes.z, codes.w, codes.x, codes.y);
    *reinterpret_cast<uint4*>(dst_t + int64_t(t) * rows + s * int(sizeof(uint4))) = codes;
  }
}

}  // namespace

void quantize_weights_fp8(cudaStream_t stream, const bf16* w, int matrices, int rows, int cols, fp8_e4m3* q,
                          fp8_e4m3* q_t, int32_t* exps, int32_t* exps_t) {
  const std::string_view where = "quantize_weights_fp8: ";  // the messages are built only on failure
  const auto side = [&](const char* name, int v) {
    require(v > 0 && v % kBlock == 0, [&] {
      return std::string(where) + name + " = " + std::to_string(v) +
             " is not a positive multiple of 128, the fp8 mode's block size";
    });
  };
  require(matrices >= 1,
          [&] { return std::string(where) + "matrices = " + std::to_string(matrices) + " (need >= 1)"; });
  side("rows", rows);
  side("cols", cols);
  const auto pointer = [&](const char* name, const void* p, bool optional) {
    require(p != nullptr || optional, [&] { return std::string(where) + name + " is missing"; });
    require_aligned16(p, name, where);
  };
  pointer("w", w, false);
  pointer("q", q, false);
  pointer("q_t", q_t, true);
  require(exps != nullptr, [&] { return std::string(where) + "exps is missing"; });
  const int64_t blocks = int64_t(matrices) * (rows / kBlock) * (cols / kBlock);
  require(blocks <= std::numeric_limits<int>::max(),
          [&] { return std::string(where) + std::to_string(blocks) + " blocks of 128 x 128 are more than 2^31 - 1"; });
  quantize_blocks<<<unsigned(blocks), kThreads, 0, stream>>>(w, rows, cols, q, q_t, exps, exps_t);
  MOK_CUDA_CHECK(cudaGetLastError());
}

const void* quantize_kernel() { return reinterpret_cast<const void*>(quantize_blocks); }

}  // namespace mok::gpu
