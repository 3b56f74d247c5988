// mok-scalar-check: the layer's shared scalar functions on the GPU against the same source on the
// CPU, bit for bit, over whole input spaces (D5: one host/device implementation must also compile to
// the same bits on both).
// - exp_f32, sigmoid_f32 (also against its definition on the CPU), silu_with_grad_f32 (value and
//   gradient) and to_bf16 see every one of the 2^32 float bit patterns; to_bf16x2 (the GPU's hardware
//   pair conversion) every float in either half, against to_bf16 of each, compared bit for bit.
// - swiglu (unclamped and clamped) and swiglu_grad see every pair of bf16 operands (their inputs are
//   bf16-rounded h), swiglu_grad with a gradient drawn from the pair by a hash.
// - A NaN matches any NaN, but in the checks marked kEveryBit: fp32 arithmetic NaNs differ by design
//   (the GPU gives 0x7fffffff, x86 keeps an operand's payload), and no NaN pattern reaches an output
//   (bf16 results go through to_bf16, which has one NaN; the router rejects non-finite logits).
//   Differing NaN patterns are counted apart.
// - The E4M3 and bf16 pair conversions are the functions whose two sides are different code (to_bf16x2
//   above, compared bit for bit: kEveryBit). The E4M3 one: to_e4m3x2 (the GPU's
//   cvt.rn.satfinite.e4m3x2.f32, which the FP8 quantizers use) against the portable to_e4m3 of each
//   half on the CPU, every float in either half (the low half u, the high half u ^ 0x80000001: the
//   halves differ in sign, so a swap of the bytes shows), plain and scaled (to_e4m3x2_scaled, e in
//   [-126, 120] from a hash of u). Its results are 16 bits, never a NaN pattern: equal means equal.
// The CPU side is this file's host code (nvcc's host compiler, -ffp-contract=off), not the
// reference library's object code; fma32 is correctly rounded either way.
// Usage: mok-scalar-check [stride=1 [name]]: stride > 1 checks every stride-th input only (the ctest);
// a name (as printed, e.g. to_bf16x2) runs that check alone.
// Exit status: 0 no mismatch, 1 any, 2 error, 77 no GPU (a skip for ctest).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "mok/core/bf16.h"
#include "mok/core/fp8.h"
#include "mok/core/scalar.h"
#include "mok/core/swiglu.h"
#include "mok/core/tool_exit.h"
#include "mok/megakernel/check.h"

namespace {

using mok::bf16;
using mok::bits_of;
using mok::float_of;

constexpr float kLimit = 7.0f;  // the clamped SwiGLU's limit (gpt-oss)

// A function under test: input pattern u (32 bits) -> output bits; the same object runs on both sides.
struct Exp {
  __host__ __device__ uint32_t operator()(uint32_t u) const { return bits_of(mok::exp_f32(float_of(u))); }
};
struct Sigmoid {
  __host__ __device__ uint32_t operator()(uint32_t u) const { return bits_of(mok::sigmoid_f32(float_of(u))); }
};
// sigmoid_f32 on the GPU (its fast path wherever |x| <= kModerateExp) against its definition on the CPU,
// 1 / (1 + exp_f32(-x)) by division.
struct SigmoidAsDefined {
  __host__ __device__ uint32_t operator()(uint32_t u) const {
#if defined(__CUDA_ARCH__)
    return bits_of(mok::sigmoid_f32(float_of(u)));
#else
    return bits_of(1.0f / (1.0f + mok::exp_f32(-float_of(u))));
#endif
  }
};
// reciprocal_from_one on every float of its range [1, 2^126) (u folded onto it): the GPU's fast path
// against the host's division.
struct Reciprocal {
  __host__ __device__ uint32_t operator()(uint32_t u) const {
    return bits_of(mok::reciprocal_from_one(float_of(0x3f800000u + u % (126u << 23))));
  }
};
// sigmoids_f32 of a batch: u's value beside three drawn from a hash of u (any bit pattern, so most
// batches hold a value past kModerateExp and take the definition for all).
struct SigmoidInBatch {
  __host__ __device__ uint32_t operator()(uint32_t u) const {
    float s[4] = {float_of(u), float_of(u * 0x9e3779b1u), float_of(u * 0x85ebca77u), float_of(u ^ 0xc2b2ae35u)};
    mok::sigmoids_f32(s);
    return bits_of(s[0]);
  }
};
struct SiluValue {
  __host__ __device__ uint32_t operator()(uint32_t u) const {
    return bits_of(mok::silu_with_grad_f32(float_of(u)).value);
  }
};
struct SiluGrad {
  __host__ __device__ uint32_t operator()(uint32_t u) const {
    return bits_of(mok::silu_with_grad_f32(float_of(u)).grad);
  }
};
struct ToBf16 {
  __host__ __device__ uint32_t operator()(uint32_t u) const { return mok::to_bf16(float_of(u)).bits; }
};

// u = gate bits << 16 | up bits.
__host__ __device__ float gate_of(uint32_t u) { return mok::to_float(bf16{uint16_t(u >> 16)}); }
__host__ __device__ float up_of(uint32_t u) { return mok::to_float(bf16{uint16_t(u & 0xffffu)}); }

struct Swiglu {
  float limit;
  __host__ __device__ uint32_t operator()(uint32_t u) const {
    return bits_of(mok::swiglu(gate_of(u), up_of(u), limit));
  }
};

// The gradient reaching a: a finite float of either sign, exponents 2^-20 .. 2^11, from a hash of u.
__host__ __device__ float da_of(uint32_t u) {
  uint32_t h = u * 0x9e3779b1u;
  h ^= h >> 15;
  h *= 0x85ebca77u;
  h ^= h >> 13;
  return float_of((h & 0x80000000u) | ((107u + (h >> 8) % 32u) << 23) | (h & 0x7fffffu));
}
struct SwigluGradPart {
  float limit;
  bool up;  // which output: d gate or d up
  __host__ __device__ uint32_t operator()(uint32_t u) const {
    const mok::SwigluGrad g = mok::swiglu_grad(gate_of(u), up_of(u), da_of(u), limit);
    return bits_of(up ? g.up : g.gate);
  }
};

// The E4M3 pair: lo = u, hi = u ^ kPairFlip; lo's code in the low byte. The device converts both with
// to_e4m3x2 (one instruction), the host with the portable to_e4m3, one by one. e_of gives the scaled
// variant's exponent, in [-126, 120] (the exponents a block scale takes).
constexpr uint32_t kPairFlip = 0x80000001u;
__host__ __device__ int e_of(uint32_t u) {
  uint32_t h = u * 0x85ebca77u;
  h ^= h >> 16;
  return int(h % 247u) - 126;
}
// The bf16 pair: lo = u, hi = u ^ kPairFlip, lo's bits in the low half; to_bf16x2 on both sides (on the
// device the hardware conversion, on the host to_bf16 of each half). Compared bit for bit: a word of two
// bf16 values must not pass as "a NaN against another NaN pattern".
struct Bf16Pair {
  static constexpr bool kEveryBit = true;
  __host__ __device__ uint32_t operator()(uint32_t u) const {
    return mok::to_bf16x2(float_of(u), float_of(u ^ kPairFlip));
  }
};
struct E4m3Pair {
  bool scaled;  // to_e4m3x2_scaled with e_of(u), against to_e4m3_scaled
  __host__ __device__ uint32_t operator()(uint32_t u) const {
    const float lo = float_of(u), hi = float_of(u ^ kPairFlip);
    const int e = scaled ? e_of(u) : 0;
#if defined(__CUDA_ARCH__)
    return scaled ? mok::to_e4m3x2_scaled(lo, hi, e) : mok::to_e4m3x2(lo, hi);
#else
    const mok::fp8_e4m3 l = scaled ? mok::to_e4m3_scaled(lo, e) : mok::to_e4m3(lo),
                        h = scaled ? mok::to_e4m3_scaled(hi, e) : mok::to_e4m3(hi);
    return uint32_t(l.bits) | uint32_t(h.bits) << 8;
#endif
  }
};

template <class F>
__global__ void evaluate(uint64_t first, uint64_t stride, uint32_t n, uint32_t* out, F f) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = f(uint32_t(first + uint64_t(i) * stride));
}

__global__ void fill_poison(uint32_t* out, uint32_t n) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 0xdeadbeefu;
}

constexpr uint32_t kChunk = 1u << 26;  // inputs per launch (256 MB of results)

__host__ __device__ bool is_nan(uint32_t bits) { return (bits & 0x7fffffffu) > 0x7f800000u; }

struct Report {
  uint64_t inputs = 0, mismatches = 0, nan_patterns = 0;  // NaN against NaN of another pattern
  uint32_t first_input = 0, gpu = 0, cpu = 0;
};

// Whether F's results are compared bit for bit (kEveryBit), NaN patterns included.
template <class F>
constexpr bool every_bit() {
  if constexpr (requires { F::kEveryBit; })
    return F::kEveryBit;
  else
    return false;
}

// Compares the chunk's GPU results with the CPU's, on every core; keeps the first mismatch.
template <class F>
void compare_chunk(const std::vector<uint32_t>& gpu, uint64_t first, uint64_t stride, uint32_t n, F f, Report& report) {
  const unsigned workers = std::max(1u, std::thread::hardware_concurrency());
  std::vector<Report> part(workers);
  std::vector<std::thread> threads;
  for (unsigned w = 0; w < workers; ++w)
    threads.emplace_back([&, w] {
      for (uint32_t i = uint32_t(uint64_t(n) * w / workers); i < uint32_t(uint64_t(n) * (w + 1) / workers); ++i) {
        const uint32_t input = uint32_t(first + uint64_t(i) * stride), want = f(input);
        if (gpu[i] == want) continue;
        if (!every_bit<F>() && is_nan(gpu[i]) && is_nan(want)) {
          ++part[w].nan_patterns;
          continue;
        }
        if (part[w].mismatches++ == 0) part[w].first_input = input, part[w].gpu = gpu[i], part[w].cpu = want;
      }
    });
  for (std::thread& t : threads) t.join();
  report.inputs += n;
  for (const Report& p : part) {
    if (p.mismatches > 0 && report.mismatches == 0)
      report.first_input = p.first_input, report.gpu = p.gpu, report.cpu = p.cpu;
    report.mismatches += p.mismatches;
    report.nan_patterns += p.nan_patterns;
  }
}

template <class F>
bool check(const char* name, F f, uint64_t stride, uint32_t* device_out) {
  const uint64_t total = ((uint64_t(1) << 32) + stride - 1) / stride;
  std::vector<uint32_t> gpu(kChunk);
  Report report;
  for (uint64_t done = 0; done < total; done += kChunk) {
    const uint32_t n = uint32_t(std::min<uint64_t>(kChunk, total - done));
    // Poison 0xdeadbeef: no NaN (a NaN would pass as any NaN), and outside every one-operand
    // function's range, so an unwritten result shows as a mismatch.
    fill_poison<<<(n + 255) / 256, 256>>>(device_out, n);
    MOK_CUDA_CHECK(cudaGetLastError());
    evaluate<<<(n + 255) / 256, 256>>>(done * stride, stride, n, device_out, f);
    MOK_CUDA_CHECK(cudaGetLastError());
    MOK_CUDA_CHECK(cudaMemcpy(gpu.data(), device_out, size_t(n) * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    compare_chunk(gpu, done * stride, stride, n, f, report);
  }
  std::printf("%-26s %10llu inputs  %llu mismatches  (%llu NaN against another NaN pattern)", name,
              static_cast<unsigned long long>(report.inputs), static_cast<unsigned long long>(report.mismatches),
              static_cast<unsigned long long>(report.nan_patterns));
  if (report.mismatches > 0)
    std::printf("  (first: input 0x%08x, gpu 0x%08x, cpu 0x%08x)", report.first_input, report.gpu, report.cpu);
  std::printf("\n");
  std::fflush(stdout);
  return report.mismatches == 0;
}

}  // namespace

// Every check, in order, as visit(name, the function on the GPU and the CPU).
template <class Visit>
void for_each_check(Visit&& visit) {
  visit("exp_f32", Exp{});
  visit("reciprocal_from_one", Reciprocal{});
  visit("sigmoid_f32", Sigmoid{});
  visit("sigmoid_f32 as defined", SigmoidAsDefined{});
  visit("sigmoids_f32 in a batch", SigmoidInBatch{});
  visit("silu value", SiluValue{});
  visit("silu gradient", SiluGrad{});
  visit("to_bf16", ToBf16{});
  visit("swiglu", Swiglu{0.0f});
  visit("swiglu clamped", Swiglu{kLimit});
  visit("swiglu_grad gate", SwigluGradPart{0.0f, false});
  visit("swiglu_grad up", SwigluGradPart{0.0f, true});
  visit("swiglu_grad gate clamped", SwigluGradPart{kLimit, false});
  visit("swiglu_grad up clamped", SwigluGradPart{kLimit, true});
  visit("to_bf16x2", Bf16Pair{});
  visit("to_e4m3x2", E4m3Pair{false});
  visit("to_e4m3x2_scaled", E4m3Pair{true});
}

constexpr const char* kUsage = "usage: mok-scalar-check [stride >= 1 [name of one check]]\n";

int tool_main(int argc, char** argv) {
  if (mok::printed_help(argc, argv, kUsage)) return 0;
  try {
    char* end = nullptr;
    const long long stride = argc > 1 ? std::strtoll(argv[1], &end, 10) : 1;
    if (argc > 3 || stride < 1 || stride > (1ll << 32) || (argc > 1 && (end == argv[1] || *end != '\0'))) {
      std::fputs(kUsage, stderr);
      return 2;
    }
    const char* only = argc > 2 ? argv[2] : nullptr;
    bool known = !only;  // named before any GPU is looked for (it was after a GPU's whole run: exit 77 here)
    for_each_check([&](const char* name, auto) { known = known || std::strcmp(name, only) == 0; });
    if (!known) throw mok::Error(std::string("no check is named ") + mok::quote_input(only));
    const int devices = mok::gpu::cuda_device_count();
    if (devices == 0) {
      std::printf("mok-scalar-check: no GPU, skipped\n");
      return 77;
    }
    uint32_t* out = nullptr;
    MOK_CUDA_CHECK(cudaMalloc(&out, size_t(kChunk) * sizeof(uint32_t)));
    const uint64_t s = uint64_t(stride);
    bool ok = true;
    for_each_check([&](const char* name, auto f) {
      if (!only || std::strcmp(name, only) == 0) ok = check(name, f, s, out) && ok;
    });
    MOK_CUDA_CHECK(cudaFree(out));
    std::printf("mok-scalar-check: %s\n", ok ? "every output equal" : "MISMATCH");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mok-scalar-check: %s\n", e.what());
    return 2;
  }
}

// A report lost to a full disk or a closed pipe is no success.
int main(int argc, char** argv) { return mok::tool_exit_status("mok-scalar-check", tool_main(argc, argv)); }
