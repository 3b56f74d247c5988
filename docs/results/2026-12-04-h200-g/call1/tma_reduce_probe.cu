// Which add does the TMA's reduce (cp.reduce.async.bulk{.tensor} .add.f32) perform on the H200: the
// IEEE binary32 add, rounding to nearest even with subnormals kept (the reference's `out + g`), or one
// that flushes subnormal inputs and results to sign-preserving zero? Each element's global value a and
// shared value b are summed by the TMA in one reduce; the result is compared with both models on the host
// (x86 SSE with FTZ/DAZ off: IEEE). Also red.global.add.f32 (atomicAdd) for comparison.
//   nvcc -O2 -std=c++20 -gencode=arch=compute_90a,code=sm_90a tma_reduce_probe.cu -lcuda -o probe && ./probe
#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#define CHECK(x)                                                                     \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

constexpr int kRows = 64, kCols = 16, kBox = kRows * kCols;  // one 4 KB box, as the fp32 chunks

__device__ uint32_t smem_address(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

enum Mode : int { kTensor = 0, kBulk = 1, kAtomic = 2 };

__global__ void reduce_kernel(const __grid_constant__ CUtensorMap map, float* g, const float* b, int mode) {
  __shared__ alignas(128) float s[kBox];
  const long base = long(blockIdx.x) * kBox;
  for (int i = threadIdx.x; i < kBox; i += blockDim.x) s[i] = b[base + i];
  if (mode == kAtomic) {
    for (int i = threadIdx.x; i < kBox; i += blockDim.x) atomicAdd(g + base + i, s[i]);
    return;
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  if (threadIdx.x == 0) {
    if (mode == kTensor)
      asm volatile(
          "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
              reinterpret_cast<uint64_t>(&map)),
          "r"(smem_address(s)), "r"(0), "r"(int(blockIdx.x) * kRows)
          : "memory");
    else
      asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(g + base),
                   "r"(smem_address(s)), "r"(kBox * 4)
                   : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  }
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
bool subnormal(uint32_t u) { return (u & 0x7f800000u) == 0 && (u & 0x7fffffu) != 0; }
uint32_t flush(uint32_t u) { return subnormal(u) ? u & 0x80000000u : u; }
bool is_nan(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }
uint32_t ieee_add(uint32_t a, uint32_t b) { return to_bits(from_bits(a) + from_bits(b)); }
uint32_t ftz_add(uint32_t a, uint32_t b) { return flush(to_bits(from_bits(flush(a)) + from_bits(flush(b)))); }
bool same(uint32_t x, uint32_t y) { return x == y || (is_nan(x) && is_nan(y)); }  // NaN payloads aside

int main() {
  constexpr int kBlocks = 4096;
  constexpr long n = long(kBlocks) * kBox;
  std::vector<uint32_t> a(n), b(n);
  std::mt19937_64 rng(20261204);
  const auto random_subnormal = [&] { return uint32_t(rng() & 0x807fffffu) | 1u; };
  const auto near = [&](int exponent) {  // a normal value of the given biased exponent
    return uint32_t(rng() & 0x807fffffu) | (uint32_t(exponent) << 23);
  };
  for (long i = 0; i < n; ++i) {
    switch (i % 8) {
      case 0:
        a[i] = uint32_t(rng());
        b[i] = uint32_t(rng());
        break;  // any bits
      case 1:
        a[i] = random_subnormal();
        b[i] = random_subnormal();
        break;  // both subnormal
      case 2:
        a[i] = random_subnormal();
        b[i] = near(1 + int(rng() % 30));
        break;  // one subnormal
      case 3:
        a[i] = near(1 + int(rng() % 3));
        b[i] = near(1 + int(rng() % 3)) ^ 0x80000000u;
        break;  // cancel
      case 4:
        a[i] = near(100 + int(rng() % 50));
        b[i] = near(100 + int(rng() % 50));
        break;  // ties, ordinary
      case 5: {
        const uint32_t zeros[2] = {0u, 0x80000000u};
        a[i] = zeros[rng() % 2];
        b[i] = zeros[rng() % 2];
        break;
      }
      case 6:
        a[i] = near(1 + int(rng() % 254));
        b[i] = a[i] ^ 0x80000000u;
        break;  // x + -x
      default:
        a[i] = random_subnormal();
        b[i] = uint32_t(rng() % 2) << 31;
        break;  // subnormal + zero
    }
  }
  float *dg, *db;
  CHECK(cudaMalloc(&dg, n * 4));
  CHECK(cudaMalloc(&db, n * 4));
  CHECK(cudaMemcpy(db, b.data(), n * 4, cudaMemcpyHostToDevice));
  CUtensorMap map;
  const cuuint64_t dims[2] = {kCols, cuuint64_t(kBlocks) * kRows}, strides[1] = {kCols * 4};
  const cuuint32_t box[2] = {kCols, kRows}, elem[2] = {1, 1};
  if (cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, dg, dims, strides, box, elem,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    std::printf("cuTensorMapEncodeTiled failed\n");
    return 1;
  }
  const char* names[3] = {"cp.reduce.async.bulk.tensor .add (f32 map)", "cp.reduce.async.bulk .add.f32",
                          "red.global.add.f32 (atomicAdd)"};
  int verdict = 0;
  for (int mode = 0; mode < 3; ++mode) {
    CHECK(cudaMemcpy(dg, a.data(), n * 4, cudaMemcpyHostToDevice));
    reduce_kernel<<<kBlocks, 256>>>(map, dg, db, mode);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<uint32_t> r(n);
    CHECK(cudaMemcpy(r.data(), dg, n * 4, cudaMemcpyDeviceToHost));
    long ieee_miss = 0, ftz_miss = 0, neither = 0, subnormal_cases = 0;
    long shown = 0;
    for (long i = 0; i < n; ++i) {
      const uint32_t ie = ieee_add(a[i], b[i]), fz = ftz_add(a[i], b[i]);
      if (ie != fz) ++subnormal_cases;
      const bool mi = !same(r[i], ie), mf = !same(r[i], fz);
      ieee_miss += mi;
      ftz_miss += mf;
      if (mi && mf) {
        ++neither;
        if (shown++ < 5)
          std::printf("  case %ld: a %08x b %08x -> %08x (ieee %08x, ftz %08x)\n", i % 8, a[i], b[i], r[i], ie, fz);
      }
    }
    std::printf(
        "%s: %ld sums (%ld where the models differ): %ld differ from the IEEE add, %ld from the "
        "flushing add, %ld from both\n",
        names[mode], n, subnormal_cases, ieee_miss, ftz_miss, neither);
    if (mode == kTensor) verdict = ieee_miss == 0 ? 0 : 2;
  }
  std::printf("verdict: the tensor reduce is %s\n", verdict == 0 ? "the IEEE add" : "NOT the IEEE add");
  return verdict;
}
