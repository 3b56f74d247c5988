// Which add does the TMA's bf16 reduce perform on the H200 (cp.reduce.async.bulk.tensor .add under a
// bf16 map, and the plain cp.reduce.async.bulk .add.noftz.bf16)? mok adds a bf16 gradient into a bf16
// .grad as autograd does: the two bf16 values added in fp32 (one rounding), then rounded to bf16
// (add_bf16_gradient, core/bf16.h: two roundings). Each element's global value `held` and shared value
// `g` (both bf16) are summed by the TMA; the result is compared on the host with that model and with
// the exact sum rounded once to bf16 (to nearest even, subnormals kept), NaNs matching any NaN.
//   nvcc -O2 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -I core/include bf16_reduce_probe.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "mok/core/bf16.h"

#define CHECK(x)                                                                     \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

constexpr int kRows = 64, kCols = 32, kBox = kRows * kCols;  // 64 bytes a row

__device__ uint32_t smem_address(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__global__ void reduce_kernel(const __grid_constant__ CUtensorMap map, uint16_t* g, const uint16_t* b, bool tensor) {
  __shared__ alignas(128) uint16_t s[kBox];
  const long base = long(blockIdx.x) * kBox;
  for (int i = threadIdx.x; i < kBox; i += blockDim.x) s[i] = b[base + i];
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  if (threadIdx.x == 0) {
    if (tensor)
      asm volatile(
          "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
              reinterpret_cast<uint64_t>(&map)),
          "r"(smem_address(s)), "r"(0), "r"(int(blockIdx.x) * kRows)
          : "memory");
    else
      asm volatile(
          "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.noftz.bf16 [%0], [%1], %2;\n" ::"l"(g + base),
          "r"(smem_address(s)), "r"(kBox * 2)
          : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  }
}

bool is_nan(uint16_t u) { return (u & 0x7fff) > 0x7f80; }
bool same(uint16_t x, uint16_t y) { return x == y || (is_nan(x) && is_nan(y)); }
double value(uint16_t u) { return double(mok::to_float(mok::bf16{u})); }
uint16_t autograd_add(uint16_t held, uint16_t g) { return uint16_t(mok::add_bf16_words(held, g) & 0xffffu); }
// The exact sum (a double holds it: two bf16 values) rounded once to bf16, to nearest even.
uint16_t once_rounded_add(uint16_t held, uint16_t g) {
  const double exact = value(held) + value(g);
  if (std::isnan(exact)) return 0x7fc0;
  if (std::isinf(exact)) return exact > 0 ? 0x7f80 : 0xff80;
  if (exact == 0) return (held & g & 0x8000) ? 0x8000 : 0;  // -0 only from -0 + -0
  // Neighbouring bf16 values below and above by bisection over the ordered codes.
  const auto code_value = [](int c) { return c < 0 ? value(uint16_t(0x8000 | (-c))) : value(uint16_t(c)); };
  int lo = -0x7f7f, hi = 0x7f7f;  // largest finite magnitudes
  if (exact > code_value(hi))
    return exact - code_value(hi) >= (code_value(hi) - code_value(hi - 1)) / 2 ? 0x7f80 : 0x7f7f;
  if (exact < code_value(lo))
    return code_value(lo) - exact >= (code_value(lo + 1) - code_value(lo)) / 2 ? 0xff80 : 0xff7f;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (code_value(mid) <= exact ? lo : hi) = mid;
  }
  const double dl = exact - code_value(lo), dh = code_value(hi) - exact;
  const int c = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
  return c < 0 ? uint16_t(0x8000 | (-c)) : c == 0 && exact < 0 ? 0x8000 : uint16_t(c);
}

int main() {
  constexpr int kBlocks = 2048;
  constexpr long n = long(kBlocks) * kBox;
  std::vector<uint16_t> a(n), b(n);
  std::mt19937_64 rng(20261204);
  const auto normal = [&](int e) { return uint16_t((rng() & 0x807f) | (uint16_t(e) << 7)); };
  for (long i = 0; i < n; ++i) {
    switch (i % 6) {
      case 0:
        a[i] = uint16_t(rng()), b[i] = uint16_t(rng());
        break;  // any bits
      case 1: {
        const int e = 20 + int(rng() % 200);
        a[i] = normal(e), b[i] = normal(std::max(1, e - 9 - int(rng() % 20)));
        break;
      }  // far apart: double rounding
      case 2:
        a[i] = uint16_t((rng() & 0x807f) | 1), b[i] = uint16_t((rng() & 0x807f) | 1);
        break;  // subnormals
      case 3:
        a[i] = normal(1 + int(rng() % 3)), b[i] = normal(1 + int(rng() % 3)) ^ 0x8000;
        break;  // cancel
      case 4:
        a[i] = normal(100 + int(rng() % 20)), b[i] = normal(100 + int(rng() % 20));
        break;  // ties
      default:
        a[i] = uint16_t(rng() % 2) << 15, b[i] = uint16_t(rng() % 2) << 15;
        break;  // zeros
    }
  }
  uint16_t *dg, *db;
  CHECK(cudaMalloc(&dg, n * 2));
  CHECK(cudaMalloc(&db, n * 2));
  CHECK(cudaMemcpy(db, b.data(), n * 2, cudaMemcpyHostToDevice));
  CUtensorMap map;
  const cuuint64_t dims[2] = {kCols, cuuint64_t(kBlocks) * kRows}, strides[1] = {kCols * 2};
  const cuuint32_t box[2] = {kCols, kRows}, elem[2] = {1, 1};
  if (cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, dg, dims, strides, box, elem,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    std::printf("cuTensorMapEncodeTiled failed\n");
    return 1;
  }
  for (int tensor = 1; tensor >= 0; --tensor) {
    CHECK(cudaMemcpy(dg, a.data(), n * 2, cudaMemcpyHostToDevice));
    reduce_kernel<<<kBlocks, 256>>>(map, dg, db, tensor);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> r(n);
    CHECK(cudaMemcpy(r.data(), dg, n * 2, cudaMemcpyDeviceToHost));
    long differ = 0, autograd_miss = 0, once_miss = 0, shown = 0;
    for (long i = 0; i < n; ++i) {
      const uint16_t m2 = autograd_add(a[i], b[i]), m1 = once_rounded_add(a[i], b[i]);
      differ += !same(m1, m2);
      const bool x2 = !same(r[i], m2), x1 = !same(r[i], m1);
      autograd_miss += x2, once_miss += x1;
      if (x1 && x2 && shown++ < 6)
        std::printf("  kind %ld: %04x + %04x -> %04x (autograd %04x, once %04x)\n", i % 6, a[i], b[i], r[i], m2, m1);
    }
    std::printf(
        "%s: %ld sums (%ld where the models differ): %ld differ from autograd's two roundings, %ld from "
        "one rounding\n",
        tensor ? "cp.reduce.async.bulk.tensor .add (bf16 map)" : "cp.reduce.async.bulk .add.noftz.bf16", n, differ,
        autograd_miss, once_miss);
  }
  return 0;
}
