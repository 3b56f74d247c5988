// The TMA's reduce-add (ptx::tma_reduce_add_2d), by which the backward adds weight gradients into the
// caller's buffers (store_rows_by_tma with `add`), is the add core/gradient_add.h models, bit for bit:
// under an fp32 map (MapElement::f32) one IEEE fp32 add, round to nearest even, subnormal inputs and
// results kept (add_f32_gradient); under a bf16 map (MapElement::bf16_out) autograd's add of a rounded
// gradient into a bf16 .grad (add_bf16_gradient); a NaN sum is the canonical NaN in both. Each box of
// 64 rows x 64 bytes is written into shared memory in the epilogue's swizzle (out_chunk_col), so each
// element meets its own global element; the sums are compared with the host's, and the data must hold
// sums where a flushing add would differ and NaN sums (the test could not fail otherwise). ctest label
// gpu; skips without a Hopper GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "gemm_geometry.cuh"
#include "mok/core/gradient_add.h"
#include "mok/megakernel/check.h"
#include "mok/megakernel/layer.h"
#include "mok/megakernel/ptx/tma.cuh"
#include "mok/megakernel/ptx/wgmma.cuh"  // fence_async_shared
#include "tensor_map.h"

namespace mok::gpu {
namespace {

template <class Out>
constexpr int kBoxElements = kWgmmaM* kOutChunkCols<Out>;  // one box of 64 rows x 64 bytes

// Block i adds the box of rows [64 i, 64 i + 64) of b into the same rows of the map's matrix.
template <class Out>
__global__ void reduce_add_boxes(const __grid_constant__ CUtensorMap map, const Out* b) {
  constexpr int kCols = kOutChunkCols<Out>;
  __shared__ alignas(kSwizzleAlign) Out rows[kWgmmaM][kCols];
  const long first = long(blockIdx.x) * kBoxElements<Out>;
  for (int i = threadIdx.x; i < kBoxElements<Out>; i += blockDim.x)
    rows[i / kCols][out_chunk_col<Out>(i / kCols, i % kCols)] = b[first + i];
  ptx::fence_async_shared();
  __syncthreads();
  if (threadIdx.x == 0) {
    ptx::tma_reduce_add_2d(&map, rows, 0, int(blockIdx.x) * kWgmmaM);
    ptx::bulk_commit_group();
    ptx::bulk_wait_all();
  }
}

bool subnormal(uint32_t u) { return (u & 0x7f800000u) == 0 && (u & 0x7fffffu) != 0; }
bool is_nan_bits(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }
uint32_t flushed(uint32_t u) { return subnormal(u) ? u & 0x80000000u : u; }
uint32_t ieee_add(uint32_t a, uint32_t b) { return bits_of(add_f32_gradient(float_of(a), float_of(b))); }
uint32_t flushing_add(uint32_t a, uint32_t b) { return flushed(ieee_add(flushed(a), flushed(b))); }

// Operand pairs of nine kinds, in turn: any bits (NaNs among them), both subnormal, a subnormal and a
// small normal, small normals of opposite signs (sums subnormal or zero), ordinary normals (ties to
// even), signed zeros, x + -x, a subnormal and a signed zero, and normals near the largest finite
// magnitude, a quarter of them against an infinity (sums overflowing to Inf, or Inf).
void fill_pairs(std::vector<uint32_t>& a, std::vector<uint32_t>& b) {
  std::mt19937_64 rng(20261204);
  const auto any_subnormal = [&] { return uint32_t(rng() & 0x807fffffu) | 1u; };
  const auto normal = [&](int biased_exponent) {
    return uint32_t(rng() & 0x807fffffu) | uint32_t(biased_exponent) << 23;
  };
  const auto sign = [&] { return uint32_t(rng() % 2) << 31; };
  for (size_t i = 0; i < a.size(); ++i) switch (i % 9) {
      case 0:
        a[i] = uint32_t(rng()), b[i] = uint32_t(rng());
        break;
      case 1:
        a[i] = any_subnormal(), b[i] = any_subnormal();
        break;
      case 2:
        a[i] = any_subnormal(), b[i] = normal(1 + int(rng() % 30));
        break;
      case 3:
        a[i] = normal(1 + int(rng() % 3)) & 0x7fffffffu, b[i] = normal(1 + int(rng() % 3)) | 0x80000000u;
        break;
      case 4:
        a[i] = normal(100 + int(rng() % 50)), b[i] = normal(100 + int(rng() % 50));
        break;
      case 5:
        a[i] = sign(), b[i] = sign();
        break;
      case 6:
        a[i] = normal(1 + int(rng() % 254)), b[i] = a[i] ^ 0x80000000u;
        break;
      case 7:
        a[i] = any_subnormal(), b[i] = sign();
        break;
      default:
        a[i] = normal(252 + int(rng() % 3)), b[i] = rng() % 4 ? normal(252 + int(rng() % 3)) : sign() | 0x7f800000u;
        break;
    }
}

// The GPU's sums of a + b, elementwise, by reduce_add_boxes under a map of Out (Word: Out's bits).
template <class Out, class Word>
std::vector<Word> tma_sums(const std::vector<Word>& a, const std::vector<Word>& b) {
  const long boxes = long(a.size()) / kBoxElements<Out>;
  const size_t bytes = a.size() * sizeof(Word);
  Word *d_sums = nullptr, *d_b = nullptr;
  MOK_CUDA_CHECK(cudaMalloc(&d_sums, bytes));
  MOK_CUDA_CHECK(cudaMalloc(&d_b, bytes));
  MOK_CUDA_CHECK(cudaMemcpy(d_sums, a.data(), bytes, cudaMemcpyHostToDevice));
  MOK_CUDA_CHECK(cudaMemcpy(d_b, b.data(), bytes, cudaMemcpyHostToDevice));
  CUtensorMap map;  // cuda.h declares it 128-byte aligned
  encode_tensor_map(map, d_sums, boxes * kWgmmaM, kOutChunkCols<Out>,
                    sizeof(Out) == 4 ? MapElement::f32 : MapElement::bf16_out);
  reduce_add_boxes<Out><<<boxes, 128>>>(map, reinterpret_cast<const Out*>(d_b));
  MOK_CUDA_CHECK(cudaGetLastError());
  std::vector<Word> sums(a.size());
  MOK_CUDA_CHECK(cudaMemcpy(sums.data(), d_sums, bytes, cudaMemcpyDeviceToHost));
  MOK_CUDA_CHECK(cudaFree(d_sums));
  MOK_CUDA_CHECK(cudaFree(d_b));
  return sums;
}

// The GPU's sums against want(a, b), bit for bit, and the data's points: more than a quarter of the
// sums are ones flushing(a, b) would change, and some are NaN (each NaN sum the canonical one).
template <class Out, class Word, class Want, class Flushing, class IsNan>
void expect_sums(const std::vector<Word>& a, const std::vector<Word>& b, Want want, Flushing flushing, IsNan is_nan) {
  const std::vector<Word> sums = tma_sums<Out>(a, b);
  long flushing_differs = 0, nan_sums = 0, wrong = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const Word w = want(a[i], b[i]);
    flushing_differs += w != flushing(a[i], b[i]);
    nan_sums += is_nan(w);
    if (sums[i] != w && wrong++ < 5)
      ADD_FAILURE() << std::hex << "a " << a[i] << " + b " << b[i] << ": the TMA gave " << sums[i] << ", want " << w;
  }
  EXPECT_EQ(wrong, 0) << "of " << a.size() << " sums";
  EXPECT_GT(flushing_differs, long(a.size()) / 4) << "sums where a flushing add differs (the data's point)";
  EXPECT_GT(nan_sums, 0) << "NaN sums";
}

constexpr long kPairs = 2048L * kBoxElements<float>;

TEST(TmaReduceAdd, IsTheIeeeAddWithSubnormalsKept) {
  if (!device_available()) GTEST_SKIP() << "no Hopper GPU";
  std::vector<uint32_t> a(kPairs), b(kPairs);
  fill_pairs(a, b);
  expect_sums<float>(a, b, ieee_add, flushing_add, is_nan_bits);
}

// bf16 pairs: the upper halves of the fp32 kinds (subnormal, small, near-largest and infinite values
// alike: bf16 has fp32's exponent).
uint16_t subnormal_flushed(uint16_t u) { return (u & 0x7f80u) == 0 ? u & 0x8000u : u; }
uint16_t autograd_add(uint16_t a, uint16_t b) { return add_bf16_gradient(bf16{a}, to_float(bf16{b})).bits; }
uint16_t flushing_bf16_add(uint16_t a, uint16_t b) {
  return subnormal_flushed(autograd_add(subnormal_flushed(a), subnormal_flushed(b)));
}

TEST(TmaReduceAdd, Bf16IsAutogradsAdd) {
  if (!device_available()) GTEST_SKIP() << "no Hopper GPU";
  std::vector<uint32_t> a32(kPairs), b32(kPairs);
  fill_pairs(a32, b32);
  std::vector<uint16_t> a(kPairs), b(kPairs);
  for (long i = 0; i < kPairs; ++i) a[i] = uint16_t(a32[i] >> 16), b[i] = uint16_t(b32[i] >> 16);
  expect_sums<bf16>(a, b, autograd_add, flushing_bf16_add, [](uint16_t u) { return (u & 0x7fffu) > 0x7f80u; });
}

}  // namespace
}  // namespace mok::gpu
