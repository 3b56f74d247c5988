// The scalar functions of the layer (exp, sigmoid, silu and their derivatives), written once for
// host and device with no libm: range reduction and a fixed polynomial, every fused step explicit.
// Accuracy: exp_f32 is within 2 ulp of the true exponential on its whole range (tested against fp64).
#pragma once

#include "mok/core/host_device.h"

namespace mok {

// 2^n for n in [-149, 127] as an exact float (subnormals included).
MOK_HD float exp2_int(int n) {
  if (n >= -126) return float_of(uint32_t(n + 127) << 23);
  return float_of(1u << (n + 149));
}

// e^x = p 2^n: n = round(x / ln 2) through the 1.5*2^23 shifter, r = x - n ln 2 in two exact-ish parts,
// and p = exp(r) on |r| <= 0.35 by Taylor to degree 7 in Horner form. n is read from the shifter's bits
// (shifted is exactly 1.5*2^23 + n), as a two's complement word: no float-to-int conversion.
struct ExpParts {
  float p;
  uint32_t n;
};
MOK_HD ExpParts exp_parts(float x) {
  constexpr float kLog2e = 1.44269502162933349609375f;
  constexpr float kShifter = 12582912.0f;
  constexpr float kLn2Hi = 0.693145751953125f;  // 11 significant bits: n*kLn2Hi is exact
  constexpr float kLn2Lo = 1.428606765330187045e-06f;
  const float shifted = fma32(x, kLog2e, kShifter);
  const float n = shifted - kShifter;
  float r = fma32(-n, kLn2Hi, x);
  r = fma32(-n, kLn2Lo, r);
  float p = 1.0f / 5040.0f;
  p = fma32(p, r, 1.0f / 720.0f);
  p = fma32(p, r, 1.0f / 120.0f);
  p = fma32(p, r, 1.0f / 24.0f);
  p = fma32(p, r, 1.0f / 6.0f);
  p = fma32(p, r, 0.5f);
  p = fma32(p, r, 1.0f);
  p = fma32(p, r, 1.0f);
  return ExpParts{p, bits_of(shifted) - bits_of(kShifter)};
}

// Straight-line code (selects, no early returns): a GPU epilogue runs dozens of these per thread, and
// without branches the compiler interleaves them.
MOK_HD float exp_f32(float x) {
  constexpr float kOverflow = 88.72283935546875f, kUnderflow = -103.972076416015625f;
  const bool nan = x != x;
  // The reduction runs on x clamped into the finite range (and NaN on 0), so n is a small integer for
  // every input; the selects at the end give the clamped inputs their results.
  const float xc = nan ? 0.0f : (x > kOverflow ? kOverflow : (x < kUnderflow ? kUnderflow : x));
  const ExpParts parts = exp_parts(xc);
  // p 2^n as (p 2^a) b with 2^a normal: two exact power-of-two scalings keep a subnormal result to a
  // single rounding (a = n + 64, b = 2^-64), and 2^128 is reached as 2^127 * 2; else b = 1.
  const int ni = int(parts.n);
  const int a = ni < -125 ? ni + 64 : (ni > 127 ? ni - 1 : ni);
  const float b = ni < -125 ? exp2_int(-64) : (ni > 127 ? 2.0f : 1.0f);
  const float e = (parts.p * float_of(uint32_t(a + 127) << 23)) * b;
  return nan ? x : (x > kOverflow ? float_of(0x7f800000u) : (x < kUnderflow ? 0.0f : e));
}

// exp_f32(x) for |x| <= kModerateExp, bit for bit, with none of its selects: there n lies in [-124, 124],
// so x needs no clamp, b = 1 and a = n (p 2^n is a normal float). Outside (NaN included) its result
// means nothing: the caller checks the range.
inline constexpr float kModerateExp = 86.0f;
MOK_HD float exp_f32_moderate(float x) {
  const ExpParts parts = exp_parts(x);
  return parts.p * float_of((parts.n + 127u) << 23);
}

// 1 / d, as 1.0f / d rounds it, for d in [1, 2^126): on a GPU the fast path of CUDA's rcp.rn.f32, what
// 1.0f / d compiles to (the hardware's approximate reciprocal and one Newton step), exact there: at its
// default stride mok-scalar-check compares every float of the range with the host's division.
MOK_HD float reciprocal_from_one(float d) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  return fma32(r, fma32(-d, r, 1.0f), r);
#else
  return 1.0f / d;
#endif
}

// Sigmoids of kCount values at once, in place: s[i] = 1 / (1 + exp_f32(-s[i])). When every |s[i]| <=
// kModerateExp (nearly always), each is exp_f32_moderate's exponential and reciprocal_from_one's
// reciprocal (1 + e^-x lies in [1, 2^126) there): straight-line code over all kCount, which the compiler
// interleaves (one by one, on a GPU, the division's branch to its slow path ran the values' chains one
// after another: most of the GEMM1 epilogue, docs/benchmarks.md). Else all are taken again as defined.
template <int kCount>
MOK_HD void sigmoids_f32(float (&s)[kCount]) {
  float r[kCount];
  bool moderate = true;
  MOK_UNROLL
  for (int i = 0; i < kCount; ++i) {
    moderate &= s[i] >= -kModerateExp && s[i] <= kModerateExp;  // false for NaN
    r[i] = reciprocal_from_one(1.0f + exp_f32_moderate(-s[i]));
  }
  if (!moderate) {
    MOK_UNROLL
    for (int i = 0; i < kCount; ++i) r[i] = 1.0f / (1.0f + exp_f32(-s[i]));
  }
  MOK_UNROLL
  for (int i = 0; i < kCount; ++i) s[i] = r[i];
}

MOK_HD float sigmoid_f32(float x) {
  float s[1] = {x};
  sigmoids_f32(s);
  return s[0];
}

// silu(x) = x s and d silu / dx = s * (1 + x * (1 - s)) from one sigmoid s = sigmoid(x): the SwiGLU
// backward needs both, and the sigmoid is most of the cost (sigmoids_f32 takes many at once).
struct SiluWithGrad {
  float value, grad;
};
MOK_HD SiluWithGrad silu_with_grad_given_sigmoid(float x, float s) {
  return SiluWithGrad{x * s, s * (1.0f + x * (1.0f - s))};
}
MOK_HD SiluWithGrad silu_with_grad_f32(float x) { return silu_with_grad_given_sigmoid(x, sigmoid_f32(x)); }

MOK_HD float silu_f32(float x) { return silu_with_grad_f32(x).value; }
MOK_HD float silu_grad_f32(float x) { return silu_with_grad_f32(x).grad; }

}  // namespace mok
