// mok-tc-validate: the bf16 tensor-core step of the H200 against HopperBf16Step, bit for bit.
// Inputs are regenerated from a hash on both sides (no transfers): for each input class, tiles of
// mma.sync m16n8k16 run on the tensor cores, then one thread per output element evaluates the CPU
// model (the same __host__ __device__ code the reference runs) and counts mismatches. Model
// variants (fraction bits kept, zero-term exponent rule) are scored side by side so the probe
// shows which rule the hardware follows. wgmma-e4m3: the FP8 step (wgmma m64n8k32.f32.e4m3.e4m3) against
// every candidate parameter set of Fp8StepModel (mok/core/fp8_dot.h, a model under validation) and an
// fp32 fma chain, side by side, with the first mismatches of hopper() printed in full. wgmma-e4m3-n128:
// the same on m64n128k32, the shape of the megakernel's FP8 GEMM (the same input classes, 8192 outputs
// per tile); wgmma-e4m3-n128-first: its first K-step of a half block, which reads no C (scale-d = 0),
// against the model from +0 (the registers hold C values the instruction must ignore). Exit status: 0 no mismatch of
// the shipped model (wgmma-e4m3*: of Fp8StepModel::hopper()), 1 any, 2 error, 77 no GPU (a skip for ctest). Usage:
// mok-tc-validate [outputs=1e8] [seed] [mma|wgmma|wgmma-e4m3|wgmma-e4m3-n128|wgmma-e4m3-n128-first].
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mok/core/fp8_dot.h"
#include "mok/core/kstep.h"
#include "mok/core/tool_exit.h"
#include "mok/megakernel/check.h"
#include "mok/megakernel/ptx/mma.cuh"
#include "mok/megakernel/ptx/wgmma.cuh"
#include "mok/tools/cli_args.h"

namespace {

using mok::bf16;

enum InputClass : int {
  kNormal,      // exponents within +-8 of 1
  kWide,        // any normal exponent: overflow, Inf results
  kCancel,      // exact cancelling pairs plus a small residue
  kSubnormal,   // subnormal and tiny operands, tiny C
  kRandomBits,  // any bit pattern: NaN, Inf, subnormals, -0
  kSpread,      // one large term, the rest 10..40 binades below: the truncation boundary
  kCDominant,   // C far above the products
  kFewBits,     // 1-2 significant bits: exact sums, ties at every rounding point
  kZeros,       // half the operands +-0, C +-0 half the time: sign of zero
  kUnderflow,   // every product below 2^-126, zeros among the terms: the tiny-exponent floor
  kClassCount
};
constexpr const char* kClassNames[] = {"normal", "wide",       "cancel",   "subnormal", "random_bits",
                                       "spread", "c_dominant", "few_bits", "zeros",     "underflow"};

__host__ __device__ uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__host__ __device__ uint64_t key(uint64_t seed, int cls, long tile, int which, int i, int j) {
  return mix(seed ^ mix(uint64_t(cls) * 1000003ull + uint64_t(tile) * 7919ull + uint64_t(which) * 131ull +
                        uint64_t(i) * 17ull + uint64_t(j)));
}

__host__ __device__ uint16_t bf16_bits(uint64_t r, int exp_lo, int exp_hi) {
  const uint32_t span = uint32_t(exp_hi - exp_lo + 1);
  const uint32_t field = uint32_t(exp_lo) + uint32_t((r >> 8) % span);
  return uint16_t(((r >> 40) & 1u) << 15 | (field & 0xffu) << 7 | (r & 0x7fu));
}

// Operand element (which = 0: A[m][k], 1: B[k][n] with i = k, j = n).
__host__ __device__ bf16 gen_operand(uint64_t seed, int cls, long tile, int which, int i, int j) {
  const int k = which == 0 ? j : i;
  const uint64_t r = key(seed, cls, tile, which, i, j);
  switch (cls) {
    case kWide:
      return bf16{bf16_bits(r, 1, 254)};
    case kCancel:
      if (k >= 8 && k < 15) {
        const bf16 twin = gen_operand(seed, cls, tile, which, which == 0 ? i : i - 8, which == 0 ? j - 8 : j);
        return bf16{uint16_t(which == 0 ? twin.bits ^ 0x8000u : twin.bits)};
      }
      return bf16{bf16_bits(r, k == 15 ? 100 : 120, k == 15 ? 110 : 134)};
    case kSubnormal:
      return bf16{bf16_bits(r, which == 0 ? 0 : 120, which == 0 ? 6 : 134)};
    case kRandomBits:
      return bf16{uint16_t(r)};
    case kSpread:
      return bf16{bf16_bits(r, k == (tile % 16) ? 127 : 127 - 20, k == (tile % 16) ? 130 : 127 - 5)};
    case kFewBits:
      return bf16{uint16_t((bf16_bits(r, 97, 127) & 0xffc0u))};
    case kZeros:
      return (r >> 50) & 1u ? bf16{uint16_t(((r >> 51) & 1u) << 15)} : bf16{bf16_bits(r, 110, 130)};
    case kUnderflow:
      return (r >> 50) & 3u ? bf16{bf16_bits(r, 40, 60)} : bf16{uint16_t(((r >> 52) & 1u) << 15)};
    default:
      return bf16{bf16_bits(r, 119, 135)};
  }
}

__host__ __device__ float gen_c(uint64_t seed, int cls, long tile, int m, int n) {
  const uint64_t r = key(seed, cls, tile, 2, m, n);
  const auto f32 = [&](int lo, int hi) {
    const uint32_t field = uint32_t(lo) + uint32_t((r >> 24) % uint32_t(hi - lo + 1));
    return mok::float_of(uint32_t((r >> 40) & 1u) << 31 | field << 23 | uint32_t(r & 0x7fffffu));
  };
  switch (cls) {
    case kWide:
      return f32(1, 254);
    case kCancel:
      return f32(100, 110);
    case kSubnormal:
      return f32(0, 30);
    case kRandomBits:
      return mok::float_of(uint32_t(r));
    case kSpread:
      return f32(127 - 40, 130);
    case kCDominant:
      return f32(147, 150);
    case kFewBits:
      return mok::float_of(mok::bits_of(f32(97, 127)) & 0xffc00000u);
    case kZeros:
      return (r >> 50) & 1u ? mok::float_of(uint32_t((r >> 51) & 1u) << 31) : f32(110, 130);
    case kUnderflow:
      return (r >> 50) & 1u ? mok::float_of(uint32_t((r >> 51) & 1u) << 31) : f32(0, 0);
    default:
      return f32(119, 135);
  }
}

// One warp per tile: D = A B + C on the tensor cores. d: [tiles, 16, 8].
__global__ void tensor_core_tiles(uint64_t seed, int cls, long tiles, float* d) {
  const long warp = (long(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const long warps = long(gridDim.x) * blockDim.x / 32;
  const int lane = threadIdx.x % 32, group = lane / 4, quad = lane % 4;
  for (long tile = warp; tile < tiles; tile += warps) {
    using namespace mok::gpu::ptx;
    const auto a = [&](int m, int k) { return gen_operand(seed, cls, tile, 0, m, k).bits; };
    const auto b = [&](int k, int n) { return gen_operand(seed, cls, tile, 1, k, n).bits; };
    FragA fa;
    fa.r[0] = pack_bf16(a(group, 2 * quad), a(group, 2 * quad + 1));
    fa.r[1] = pack_bf16(a(group + 8, 2 * quad), a(group + 8, 2 * quad + 1));
    fa.r[2] = pack_bf16(a(group, 2 * quad + 8), a(group, 2 * quad + 9));
    fa.r[3] = pack_bf16(a(group + 8, 2 * quad + 8), a(group + 8, 2 * quad + 9));
    FragB fb;
    fb.r[0] = pack_bf16(b(2 * quad, group), b(2 * quad + 1, group));
    fb.r[1] = pack_bf16(b(2 * quad + 8, group), b(2 * quad + 9, group));
    FragC fc;
    fc.v[0] = gen_c(seed, cls, tile, group, 2 * quad);
    fc.v[1] = gen_c(seed, cls, tile, group, 2 * quad + 1);
    fc.v[2] = gen_c(seed, cls, tile, group + 8, 2 * quad);
    fc.v[3] = gen_c(seed, cls, tile, group + 8, 2 * quad + 1);
    mma_bf16_16816(fc, fa, fb);
    float* out = d + tile * 128;
    out[group * 8 + 2 * quad] = fc.v[0];
    out[group * 8 + 2 * quad + 1] = fc.v[1];
    out[(group + 8) * 8 + 2 * quad] = fc.v[2];
    out[(group + 8) * 8 + 2 * quad + 1] = fc.v[3];
  }
}

// The shipped model first, then variants that each change one rule: the probe shows each rule matters.
constexpr int kVariants = 6;
constexpr const char* kVariantNames[kVariants] = {"shipped", "F24", "F26", "F27", "floor-126", "no_floor"};

template <int F, int Floor>
__device__ float model(float c, const bf16* a, const bf16* b) {
  return mok::HopperBf16StepModel<F, Floor>{}(c, a, b);
}

struct Mismatch {
  uint16_t a[16], b[16];
  float c, gpu, model;
};
constexpr int kKeep = 16;

// The tail of every comparison: counts the mismatches of each variant v[i] (the shipped model first) with
// the tensor cores' output, and has `fill` write the mismatches of v[0] into the first kKeep slots of keep.
template <int kCount, class M, class Fill>
__device__ void tally_and_keep(const float (&v)[kCount], float gpu, unsigned long long* counts, M* keep,
                               unsigned int* kept, Fill fill) {
  const uint32_t gpu_bits = mok::bits_of(gpu);
  for (int i = 0; i < kCount; ++i)
    if (mok::bits_of(v[i]) != gpu_bits) atomicAdd(&counts[i], 1ull);
  if (mok::bits_of(v[0]) != gpu_bits) {
    const unsigned slot = atomicAdd(kept, 1u);
    if (slot < kKeep) fill(keep[slot]);
  }
}

// rows: 16 (mma.sync tiles) or 64 (wgmma tiles); 8 columns.
__global__ void compare_with_model(uint64_t seed, int cls, long tiles, int rows, const float* d,
                                   unsigned long long* counts /* [kVariants] */, Mismatch* keep, unsigned int* kept) {
  const long total = tiles * rows * 8;
  for (long o = long(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += long(gridDim.x) * blockDim.x) {
    const long tile = o / (rows * 8);
    const int m = int(o % (rows * 8)) / 8, n = int(o % 8);
    bf16 a[16], b[16];
    for (int k = 0; k < 16; ++k) {
      a[k] = gen_operand(seed, cls, tile, 0, m, k);
      b[k] = gen_operand(seed, cls, tile, 1, k, n);
    }
    const float c = gen_c(seed, cls, tile, m, n);
    const float v[kVariants] = {mok::HopperBf16Step{}(c, a, b), model<24, -133>(c, a, b), model<26, -133>(c, a, b),
                                model<27, -133>(c, a, b),       model<25, -126>(c, a, b), model<25, -1000>(c, a, b)};
    tally_and_keep(v, d[o], counts, keep, kept, [&](Mismatch& mm) {
      for (int k = 0; k < 16; ++k) mm.a[k] = a[k].bits, mm.b[k] = b[k].bits;
      mm.c = c, mm.gpu = d[o], mm.model = v[0];
    });
  }
}

// One class's probe over `tiles` tiles of `per_tile` outputs, a batch of tiles at a time (2^18 tiles of
// up to 512 outputs, 2^27 outputs of larger tiles: 512 MiB): the device buffers (outputs, mismatch counts
// per model variant, the first kKeep mismatches of variant 0) and the batch loop (outputs poisoned, then
// launch(batch_seed, n): the instruction's kernel and the comparison's; batch seeds seed + first tile).
template <class M>
class Probe {
 public:
  Probe(long tiles, int per_tile, int variants)
      : tiles_(tiles),
        batch_(std::min(tiles, (1l << 27) / std::max(per_tile, 512))),
        per_tile_(per_tile),
        variants_(variants) {
    MOK_CUDA_CHECK(cudaMalloc(&d, size_t(batch_) * per_tile * sizeof(float)));
    MOK_CUDA_CHECK(cudaMalloc(&counts, variants * sizeof(unsigned long long)));
    MOK_CUDA_CHECK(cudaMalloc(&keep, kKeep * sizeof(M)));
    MOK_CUDA_CHECK(cudaMalloc(&kept, sizeof(unsigned int)));
  }
  ~Probe() { cudaFree(d), cudaFree(counts), cudaFree(keep), cudaFree(kept); }
  Probe(const Probe&) = delete;
  Probe& operator=(const Probe&) = delete;

  // The mismatch counts of one class per variant; its kept mismatches in `mismatches`.
  template <class Launch>
  std::vector<unsigned long long> run_class(uint64_t seed, Launch launch, std::vector<M>& mismatches) {
    std::vector<unsigned long long> sum(variants_, 0), c(variants_);
    MOK_CUDA_CHECK(cudaMemset(kept, 0, sizeof(unsigned int)));
    for (long first = 0; first < tiles_; first += batch_) {
      const long n = std::min(batch_, tiles_ - first);
      MOK_CUDA_CHECK(cudaMemset(d, 0xff, size_t(n) * per_tile_ * sizeof(float)));  // poison
      MOK_CUDA_CHECK(cudaMemset(counts, 0, variants_ * sizeof(unsigned long long)));
      launch(seed + uint64_t(first), n);
      MOK_CUDA_CHECK(cudaGetLastError());
      MOK_CUDA_CHECK(cudaMemcpy(c.data(), counts, variants_ * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
      for (int i = 0; i < variants_; ++i) sum[i] += c[i];
    }
    unsigned int n_kept = 0;
    MOK_CUDA_CHECK(cudaMemcpy(&n_kept, kept, sizeof n_kept, cudaMemcpyDeviceToHost));
    mismatches.resize(std::min(n_kept, unsigned(kKeep)));
    MOK_CUDA_CHECK(cudaMemcpy(mismatches.data(), keep, mismatches.size() * sizeof(M), cudaMemcpyDeviceToHost));
    return sum;
  }

  float* d = nullptr;
  unsigned long long* counts = nullptr;
  M* keep = nullptr;
  unsigned int* kept = nullptr;

 private:
  long tiles_, batch_;
  int per_tile_, variants_;
};

// A table row: the class, its outputs and each variant's mismatches.
void print_row(const char* name, unsigned long long outputs, const std::vector<unsigned long long>& mismatches) {
  std::printf("%-12s %12llu", name, outputs);
  for (unsigned long long m : mismatches) std::printf(" %10llu", m);
  std::printf("\n");
}

// ---- FP8 E4M3: wgmma m64n8k32 and m64n128k32 against the candidates of Fp8StepModel ----
using mok::fp8_e4m3;
using mok::Fp8StepModel;
constexpr int kK8 = mok::kFp8StepK;

constexpr const char* kE4m3ClassNames[] = {"normal", "wide",       "cancel",   "subnormal", "random_bits",
                                           "spread", "c_dominant", "few_bits", "zeros",     "tiny_c"};

// An E4M3 code with a random sign, exponent field in [lo, hi] (0: subnormal or zero) and fraction; never NaN.
__host__ __device__ uint8_t e4m3_bits(uint64_t r, int field_lo, int field_hi) {
  const uint32_t field = uint32_t(field_lo) + uint32_t((r >> 8) % uint32_t(field_hi - field_lo + 1));
  uint32_t fraction = r & 7u;
  if (field == 15 && fraction == 7) fraction = 6;  // S.1111.111 is NaN: 448 instead
  return uint8_t(((r >> 40) & 1u) << 7 | field << 3 | fraction);
}

// Operand element (which = 0: A[m][k], 1: B[k][n] with i = k, j = n). Products: exact, 2^-18 .. 2^17.6.
__host__ __device__ fp8_e4m3 gen_e4m3(uint64_t seed, int cls, long tile, int which, int i, int j) {
  const int k = which == 0 ? j : i;
  const uint64_t r = key(seed, cls + 64, tile, which, i, j);
  switch (cls) {
    case kWide:  // every finite code: subnormals, zeros, 448
      return fp8_e4m3{e4m3_bits(r, 0, 15)};
    case kCancel:  // products 16..30 cancel 0..14 exactly (A negated); 15 and 31 a small residue
      if (k >= 16 && k < 31) {
        const fp8_e4m3 twin = gen_e4m3(seed, cls, tile, which, which == 0 ? i : i - 16, which == 0 ? j - 16 : j);
        return fp8_e4m3{uint8_t(which == 0 ? twin.bits ^ 0x80u : twin.bits)};
      }
      return fp8_e4m3{e4m3_bits(r, k == 15 || k == 31 ? 0 : 4, k == 15 || k == 31 ? 4 : 15)};
    case kSubnormal:  // A mostly subnormal, B any normal: products 2^-18 .. 2^2
      return fp8_e4m3{e4m3_bits(r, which == 0 ? 0 : 1, which == 0 ? 2 : 15)};
    case kRandomBits:  // any code: NaN (0x7f, 0xff), +-0, subnormals
      return fp8_e4m3{uint8_t(r)};
    case kSpread:  // one large product (2^10 .. 2^17), the rest 8 .. 29 binades below it
      return fp8_e4m3{e4m3_bits(r, k == int(tile % kK8) ? 12 : 1, k == int(tile % kK8) ? 15 : 8)};
    case kFewBits:  // one fraction bit at most: exact sums, cuts on every bit position
      return fp8_e4m3{uint8_t(e4m3_bits(r, 3, 12) & 0xfcu)};
    case kZeros:  // half the operands +-0, beside operands of any size (0 * 448 next to 2^-12)
      return (r >> 50) & 1u ? fp8_e4m3{uint8_t(((r >> 51) & 1u) << 7)} : fp8_e4m3{e4m3_bits(r, 1, 15)};
    case kUnderflow:  // C alone (all products +-0) in rows 0..31, the products all -0 in rows 0..15 of
      // columns 0..3; rows 32..63: zeros and subnormals. B: subnormals and large values.
      if (which == 0) {
        if (i < 16) return fp8_e4m3{0x80};
        return i < 32 || (r >> 50) & 1u ? fp8_e4m3{uint8_t(((r >> 51) & 1u) << 7)} : fp8_e4m3{e4m3_bits(r, 0, 0)};
      } else {
        const uint8_t v = e4m3_bits(r, (r >> 52) & 1u ? 0 : 10, (r >> 52) & 1u ? 0 : 15);
        return fp8_e4m3{uint8_t(j < 4 ? v & 0x7fu : v)};
      }
    default:  // kNormal, kCDominant: any normal
      return fp8_e4m3{e4m3_bits(r, 1, 15)};
  }
}

__host__ __device__ float gen_c_e4m3(uint64_t seed, int cls, long tile, int m, int n) {
  const uint64_t r = key(seed, cls + 64, tile, 2, m, n);
  const auto f32 = [&](int lo, int hi) {
    const uint32_t field = uint32_t(lo) + uint32_t((r >> 24) % uint32_t(hi - lo + 1));
    return mok::float_of(uint32_t((r >> 40) & 1u) << 31 | field << 23 | uint32_t(r & 0x7fffffu));
  };
  switch (cls) {
    case kWide:  // any magnitude, fp32 subnormals to 2^127
      return f32(0, 254);
    case kCancel:
      return (r >> 50) & 1u ? f32(100, 125) : mok::float_of(uint32_t((r >> 51) & 1u) << 31);
    case kSubnormal:
      return (r >> 50) & 1u ? f32(0, 30) : f32(100, 125);
    case kRandomBits:
      return mok::float_of(uint32_t(r));
    case kSpread:
      return f32(127 - 18, 127 + 17);
    case kCDominant:  // 2^10 .. 2^40 above products near 1: C's own cut and the products' cut
      return f32(137, 167);
    case kFewBits:
      return mok::float_of(mok::bits_of(f32(115, 137)) & 0xffc00000u);
    case kZeros:
      return (r >> 50) & 1u ? mok::float_of(uint32_t((r >> 51) & 1u) << 31) : f32(110, 140);
    case kUnderflow:  // +-0, fp32 subnormals and the smallest normals
      return (r >> 50) & 3u ? f32(0, 3) : mok::float_of(uint32_t((r >> 52) & 1u) << 31);
    default:  // kNormal: 2^-8 .. 2^16, where the products are
      return f32(119, 143);
  }
}

// One warpgroup per tile: D(64xN) = A(64xK) B(KxN) + C through one wgmma of Op (below), N = Op::kN,
// operands staged in shared memory in the canonical no-swizzle K-major layout: core matrix (i, kk), 8 rows
// of 16 bytes (8 bf16 or 16 E4M3 along K), at 256 i + 128 kk bytes: K is 32 bytes (two core matrices) in
// every probed shape, so the core matrices along K are 128 bytes apart (LBO) and the 8-row groups along M
// or N 256 bytes apart (SBO), whatever the number of rows: the same descriptors for A (64 rows), an
// 8-row B and a 128-row B. d: [tiles, 64, N].
template <class Op>
__global__ void __launch_bounds__(128) warpgroup_tiles(uint64_t seed, int cls, long tiles, float* d) {
  using Bits = decltype(typename Op::Elem{}.bits);
  constexpr int K = Op::kK, N = Op::kN, per_row = 16 / int(sizeof(Bits));  // elements per core-matrix row
  static_assert(K * sizeof(Bits) == 32, "two core matrices along K");
  __shared__ __align__(256) Bits a_smem[64 * K];
  __shared__ __align__(256) Bits b_smem[N * K];
  const int t = threadIdx.x, warp = t / 32, group = (t % 32) / 4, quad = t % 4;
  const auto core_offset = [](int row, int k) {
    return (row / 8) * (256 / int(sizeof(Bits))) + (k / per_row) * (128 / int(sizeof(Bits))) + (row % 8) * per_row +
           k % per_row;
  };
  // The accumulator fragment: acc[i] is D[16 warp + group + 8 ((i / 2) % 2)][8 (i / 4) + 2 quad + i % 2].
  const auto frag_row = [&](int i) { return 16 * warp + group + 8 * ((i / 2) % 2); };
  const auto frag_col = [&](int i) { return 8 * (i / 4) + 2 * quad + i % 2; };
  for (long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    for (int i = t; i < 64 * K; i += 128)
      a_smem[core_offset(i / K, i % K)] = Op::a_b(seed, cls, tile, 0, i / K, i % K).bits;
    for (int i = t; i < N * K; i += 128)
      b_smem[core_offset(i / K, i % K)] = Op::a_b(seed, cls, tile, 1, i % K, i / K).bits;
    mok::gpu::ptx::fence_async_shared();
    __syncthreads();
    float acc[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[i] = Op::c(seed, cls, tile, frag_row(i), frag_col(i));
    mok::gpu::ptx::wgmma_fence();
    Op::mma(acc, mok::gpu::ptx::smem_descriptor(a_smem, 128, 256), mok::gpu::ptx::smem_descriptor(b_smem, 128, 256));
    mok::gpu::ptx::wgmma_commit();
    mok::gpu::ptx::wgmma_wait<0>();
    float* out = d + tile * 64 * N;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) out[frag_row(i) * N + frag_col(i)] = acc[i];
    __syncthreads();
  }
}

// The probed wgmma instructions: their element, K, N, operand and C generators, and the wgmma.
struct Bf16Wgmma {
  using Elem = bf16;
  static constexpr int kK = 16, kN = 8;
  __device__ static bf16 a_b(uint64_t seed, int cls, long tile, int which, int i, int j) {
    return gen_operand(seed, cls, tile, which, i, j);
  }
  __device__ static float c(uint64_t seed, int cls, long tile, int m, int n) { return gen_c(seed, cls, tile, m, n); }
  __device__ static void mma(float (&acc)[4], uint64_t a, uint64_t b) { mok::gpu::ptx::wgmma_bf16_m64n8k16(acc, a, b); }
};
// E4M3: the same input classes for every shape (columns 0..7 of a tile get the inputs of the m64n8k32 tile
// of the same batch seed and index).
struct E4m3Inputs {
  using Elem = fp8_e4m3;
  static constexpr bool kReadsC = true;
  static constexpr int kK = kK8;
  __device__ static fp8_e4m3 a_b(uint64_t seed, int cls, long tile, int which, int i, int j) {
    return gen_e4m3(seed, cls, tile, which, i, j);
  }
  __device__ static float c(uint64_t seed, int cls, long tile, int m, int n) {
    return gen_c_e4m3(seed, cls, tile, m, n);
  }
};
struct E4m3WgmmaN8 : E4m3Inputs {
  static constexpr int kN = 8;
  __device__ static void mma(float (&acc)[4], uint64_t a, uint64_t b) { mok::gpu::ptx::wgmma_e4m3_m64n8k32(acc, a, b); }
};
struct E4m3WgmmaN128 : E4m3Inputs {  // the megakernel's FP8 GEMM shape
  static constexpr int kN = 128;
  __device__ static void mma(float (&acc)[64], uint64_t a, uint64_t b) {
    mok::gpu::ptx::wgmma_e4m3_m64n128k32(acc, a, b, true);
  }
};
struct E4m3WgmmaN128First : E4m3WgmmaN128 {  // a half block's first K-step: C not read
  static constexpr bool kReadsC = false;
  __device__ static void mma(float (&acc)[64], uint64_t a, uint64_t b) {
    mok::gpu::ptx::wgmma_e4m3_m64n128k32(acc, a, b, false);
  }
};

// Fp8StepModel's candidates, then a sequential fp32 fma chain (k order) as the IEEE baseline.
constexpr int kE4m3Variants = Fp8StepModel::kCandidates + 1;
constexpr const char* kE4m3VariantNames[kE4m3Variants] = {"hopper",    "F12/O12", "F14/O14", "F14/O13", "F13/O23",
                                                          "F25/O23",   "group16", "group8",  "floor",   "zero@-6",
                                                          "zero@-126", "-0_kept", "fp32_fma"};
constexpr const char* kE4m3VariantRules[kE4m3Variants] = {
    "13 fraction bits kept below 2^e_max, result cut to 13, one sum of C and 32 products",
    "12 bits kept, result cut to 12",
    "14 bits kept, result cut to 14",
    "14 bits kept, result cut to 13",
    "13 bits kept, an fp32 result (cut to 23)",
    "25 bits kept, fp32 result: the bf16 step's widths",
    "two chained sums of 16 products",
    "four chained sums of 8 products",
    "terms cut toward -Inf (two's complement)",
    "a zero operand counts in e_max with exponent -6",
    "a zero operand counts in e_max with exponent -126 (MMA-Sim)",
    "a zero sum is +0 even when every term is -0",
    "32 sequential fp32 fmas in k order (IEEE)"};

struct MismatchE4m3 {
  uint8_t a[kK8], b[kK8];
  float c, gpu, v[kE4m3Variants];
  int m, n;  // the element of D (a staging or descriptor error shows as mismatches in some rows or columns)
};

__device__ float fp32_fma_chain(float c, const fp8_e4m3* a, const fp8_e4m3* b) {
  for (int k = 0; k < kK8; ++k) c = mok::fma32(mok::to_float(a[k]), mok::to_float(b[k]), c);
  return c;
}

// cols: N of the probed wgmma (8 or 128); 64 rows. reads_c false: the model's C is +0.
__global__ void compare_e4m3(uint64_t seed, int cls, long tiles, int cols, bool reads_c, const float* d,
                             unsigned long long* counts /* [kE4m3Variants] */, MismatchE4m3* keep, unsigned int* kept) {
  const long total = tiles * 64 * cols;
  for (long o = long(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += long(gridDim.x) * blockDim.x) {
    const long tile = o / (64 * cols);
    const int m = int(o % (64 * cols)) / cols, n = int(o % cols);
    fp8_e4m3 a[kK8], b[kK8];
    for (int k = 0; k < kK8; ++k) {
      a[k] = gen_e4m3(seed, cls, tile, 0, m, k);
      b[k] = gen_e4m3(seed, cls, tile, 1, k, n);
    }
    const float c = reads_c ? gen_c_e4m3(seed, cls, tile, m, n) : 0.0f;
    float v[kE4m3Variants];
#pragma unroll
    for (int i = 0; i < Fp8StepModel::kCandidates; ++i) v[i] = Fp8StepModel::candidate(i)(c, a, b);
    v[Fp8StepModel::kCandidates] = fp32_fma_chain(c, a, b);
    tally_and_keep(v, d[o], counts, keep, kept, [&](MismatchE4m3& mm) {
      for (int k = 0; k < kK8; ++k) mm.a[k] = a[k].bits, mm.b[k] = b[k].bits;
      mm.c = c, mm.gpu = d[o], mm.m = m, mm.n = n;
      for (int i = 0; i < kE4m3Variants; ++i) mm.v[i] = v[i];
    });
  }
}

void print_e4m3_mismatch(const MismatchE4m3& mm) {
  std::printf("  mismatch at D[%d][%d]: c=%a (0x%08x) gpu=%a (0x%08x) hopper=%a (0x%08x)\n", mm.m, mm.n, mm.c,
              mok::bits_of(mm.c), mm.gpu, mok::bits_of(mm.gpu), mm.v[0], mok::bits_of(mm.v[0]));
  std::printf("    a:");
  for (int k = 0; k < kK8; ++k) std::printf(" %02x", mm.a[k]);
  std::printf("\n    b:");
  for (int k = 0; k < kK8; ++k) std::printf(" %02x", mm.b[k]);
  std::printf("\n    products (exact):");
  for (int k = 0; k < kK8; ++k) {
    if (k % 8 == 0) std::printf("\n     ");
    std::printf(" %a", double(mok::to_float(fp8_e4m3{mm.a[k]})) * double(mok::to_float(fp8_e4m3{mm.b[k]})));
  }
  std::printf("\n    variants:");
  for (int i = 0; i < kE4m3Variants; ++i) std::printf(" %s=0x%08x", kE4m3VariantNames[i], mok::bits_of(mm.v[i]));
  std::printf("\n");
}

// The wgmma-e4m3 modes (Op: E4m3WgmmaN8, E4m3WgmmaN128 or E4m3WgmmaN128First): every class, every
// variant; exit status from hopper().
template <class Op>
int run_e4m3(double outputs, uint64_t seed, const cudaDeviceProp& prop) {
  constexpr int per_tile = 64 * Op::kN;
  const long tiles_per_class = long(outputs / per_tile / double(kClassCount)) + 1;
  Probe<MismatchE4m3> probe(tiles_per_class, per_tile, kE4m3Variants);
  std::printf(
      "mok-tc-validate: %s, seed %llu, %ld outputs per class, wgmma.mma_async m64n%dk32 (smem operands) "
      "e4m3->f32%s\n",
      prop.name, (unsigned long long)seed, tiles_per_class * per_tile, Op::kN,
      Op::kReadsC ? "" : ", scale-d = 0 (C not read; the model from +0)");
  std::printf(
      "mismatches of each candidate of the FP8 step model (mok/core/fp8_dot.h; F = fraction bits kept below\n"
      "2^e_max, O = fraction bits of the result):\n");
  for (int i = 0; i < kE4m3Variants; ++i) std::printf("  %-10s %s\n", kE4m3VariantNames[i], kE4m3VariantRules[i]);
  std::printf("%-12s %12s", "class", "outputs");
  for (const char* name : kE4m3VariantNames) std::printf(" %10s", name);
  std::printf("\n");
  std::vector<unsigned long long> total(kE4m3Variants, 0);
  unsigned long long total_outputs = 0;
  for (int cls = 0; cls < kClassCount; ++cls) {
    std::vector<MismatchE4m3> mm;
    const std::vector<unsigned long long> sum = probe.run_class(
        seed,
        [&](uint64_t batch_seed, long n) {
          warpgroup_tiles<Op><<<prop.multiProcessorCount * 16, 128>>>(batch_seed, cls, n, probe.d);
          MOK_CUDA_CHECK(cudaGetLastError());
          compare_e4m3<<<prop.multiProcessorCount * 8, 256>>>(batch_seed, cls, n, Op::kN, Op::kReadsC, probe.d,
                                                              probe.counts, probe.keep, probe.kept);
        },
        mm);
    print_row(kE4m3ClassNames[cls], tiles_per_class * per_tile, sum);
    for (int i = 0; i < kE4m3Variants; ++i) total[i] += sum[i];
    total_outputs += tiles_per_class * per_tile;
    for (size_t i = 0; i < std::min(mm.size(), size_t(3)); ++i) print_e4m3_mismatch(mm[i]);
  }
  print_row("all", total_outputs, total);
  std::printf("candidates with no mismatch:");
  bool any = false;
  for (int i = 0; i < kE4m3Variants; ++i)
    if (total[i] == 0) std::printf(" %s", kE4m3VariantNames[i]), any = true;
  std::printf("%s\n", any ? "" : " none (the hardware follows none of them: refit from the printed cases)");
  std::printf("hopper: %llu mismatches in %llu outputs\n", total[0], total_outputs);
  return total[0] == 0 ? 0 : 1;
}

}  // namespace

// The outputs to check, at least one and at most 10^12 (an hour's work): atof read 1e308 as a count past
// long, whose tiles came out negative and checked nothing, and "two" as 0; both passed.
constexpr double kMaxOutputs = 1e12;

constexpr const char* kUsage =
    "usage: mok-tc-validate [outputs in [1, 1e12], default 1e8] [seed: an unsigned integer] "
    "[mma|wgmma|wgmma-e4m3|wgmma-e4m3-n128|wgmma-e4m3-n128-first]\n";

int validate_main(int argc, char** argv) {
  if (mok::printed_help(argc, argv, kUsage)) return 0;
  double outputs = 1.0e8;
  uint64_t seed = 20261129ull;
  const std::string instruction = argc > 3 ? argv[3] : "mma";
  const bool outputs_ok =
      argc <= 1 || (mok::tools::parse_double(argv[1], outputs) && outputs >= 1 && outputs <= kMaxOutputs);
  if (!outputs_ok || (argc > 2 && !mok::tools::parse_uint64(argv[2], seed)) || argc > 4 ||
      (instruction != "mma" && instruction != "wgmma" && instruction != "wgmma-e4m3" &&
       instruction != "wgmma-e4m3-n128" && instruction != "wgmma-e4m3-n128-first")) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const bool wgmma = instruction == "wgmma";
  const int rows = wgmma ? 64 : 16, per_tile = rows * 8;
  try {
    const int devices = mok::gpu::cuda_device_count();
    if (devices == 0) {
      std::printf("mok-tc-validate: no CUDA device (skipped)\n");
      return 77;
    }
    cudaDeviceProp prop;
    MOK_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    if (instruction == "wgmma-e4m3") return run_e4m3<E4m3WgmmaN8>(outputs, seed, prop);
    if (instruction == "wgmma-e4m3-n128") return run_e4m3<E4m3WgmmaN128>(outputs, seed, prop);
    if (instruction == "wgmma-e4m3-n128-first") return run_e4m3<E4m3WgmmaN128First>(outputs, seed, prop);
    const long tiles_per_class = long(outputs / per_tile / double(kClassCount)) + 1;
    Probe<Mismatch> probe(tiles_per_class, per_tile, kVariants);
    std::printf("mok-tc-validate: %s, seed %llu, %ld outputs per class, %s bf16->f32\n", prop.name,
                (unsigned long long)seed, tiles_per_class * per_tile,
                wgmma ? "wgmma.mma_async m64n8k16 (smem operands)" : "mma.sync m16n8k16");
    std::printf(
        "mismatches of the shipped model (HopperBf16Step: 25 fraction bits, alignment exponent floored at\n"
        "-133) and of variants with 24/26/27 fraction bits, the floor at -126, or no floor:\n");
    std::printf("%-12s %12s", "class", "outputs");
    for (const char* name : kVariantNames) std::printf(" %10s", name);
    std::printf("\n");
    unsigned long long shipped_mismatches = 0, total_outputs = 0;
    for (int cls = 0; cls < kClassCount; ++cls) {
      std::vector<Mismatch> mm;
      const std::vector<unsigned long long> sum = probe.run_class(
          seed,
          [&](uint64_t batch_seed, long n) {
            if (wgmma)
              warpgroup_tiles<Bf16Wgmma><<<prop.multiProcessorCount * 16, 128>>>(batch_seed, cls, n, probe.d);
            else
              tensor_core_tiles<<<prop.multiProcessorCount * 8, 256>>>(batch_seed, cls, n, probe.d);
            MOK_CUDA_CHECK(cudaGetLastError());
            compare_with_model<<<prop.multiProcessorCount * 8, 256>>>(batch_seed, cls, n, rows, probe.d, probe.counts,
                                                                      probe.keep, probe.kept);
          },
          mm);
      print_row(kClassNames[cls], tiles_per_class * per_tile, sum);
      shipped_mismatches += sum[0];
      total_outputs += tiles_per_class * per_tile;
      for (size_t i = 0; i < std::min(mm.size(), size_t(4)); ++i) {
        std::printf("  mismatch: c=%a gpu=%a (0x%08x) model=%a (0x%08x)\n    a:", mm[i].c, mm[i].gpu,
                    mok::bits_of(mm[i].gpu), mm[i].model, mok::bits_of(mm[i].model));
        for (int k = 0; k < 16; ++k) std::printf(" %04x", mm[i].a[k]);
        std::printf("\n    b:");
        for (int k = 0; k < 16; ++k) std::printf(" %04x", mm[i].b[k]);
        std::printf("\n");
      }
    }
    std::printf("shipped model: %llu mismatches in %llu outputs\n", shipped_mismatches, total_outputs);
    return shipped_mismatches == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}

int main(int argc, char** argv) { return mok::tool_exit_status("mok-tc-validate", validate_main(argc, argv)); }
