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

// Straight-line code (selects, no early returns): a GPU epilogue runs dozens of these per thread, and
// without branches the compiler interleaves them.
MOK_HD float exp_f32(float x) {
  constexpr float kOverflow = 88.72283935546875f, kUnderflow = -103.972076416015625f;
  const bool nan = x != x;
  // The reduction runs on x clamped into the finite range (and NaN on 0), so n below is a small
  // integer for every input; the selects at the end give the clamped inputs their results.
  const float xc = nan ? 0.0f : (x > kOverflow ? kOverflow : (x < kUnderflow ? kUnderflow : x));
  // n = round(x / ln 2) through the 1.5*2^23 shifter; r = x - n*ln2 in two exact-ish parts.
  constexpr float kLog2e = 1.44269502162933349609375f;
  constexpr float kShifter = 12582912.0f;
  constexpr float kLn2Hi = 0.693145751953125f;  // 11 significant bits: n*kLn2Hi is exact
  constexpr float kLn2Lo = 1.428606765330187045e-06f;
  const float shifted = fma32(xc, kLog2e, kShifter);
  const float n = shifted - kShifter;
  float r = fma32(-n, kLn2Hi, xc);
  r = fma32(-n, kLn2Lo, r);
  // exp(r) on |r| <= 0.35 by Taylor to degree 7 in Horner form.
  float p = 1.0f / 5040.0f;
  p = fma32(p, r, 1.0f / 720.0f);
  p = fma32(p, r, 1.0f / 120.0f);
  p = fma32(p, r, 1.0f / 24.0f);
  p = fma32(p, r, 1.0f / 6.0f);
  p = fma32(p, r, 0.5f);
  p = fma32(p, r, 1.0f);
  p = fma32(p, r, 1.0f);
  // p 2^n as (p 2^a) b with 2^a normal: two exact power-of-two scalings keep a subnormal result to a
  // single rounding (a = n + 64, b = 2^-64), and 2^128 is reached as 2^127 * 2; else b = 1.
  const int ni = int(n);
  const int a = ni < -125 ? ni + 64 : (ni > 127 ? ni - 1 : ni);
  const float b = ni < -125 ? exp2_int(-64) : (ni > 127 ? 2.0f : 1.0f);
  const float e = (p * float_of(uint32_t(a + 127) << 23)) * b;
  return nan ? x : (x > kOverflow ? float_of(0x7f800000u) : (x < kUnderflow ? 0.0f : e));
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

// Sigmoids of kCount values at once, in place: s[i] = 1 / (1 + e^-s[i]). Every reciprocal is taken by
// reciprocal_from_one first, and only when a denominator lies past its range (x < -87.3, or NaN) are
// all taken again by division. On a GPU a division is a branch to its slow path, and with one per value
// the values' chains ran one after another (most of the GEMM1 epilogue, docs/benchmarks.md);
// this way the common case is straight-line code over all kCount, which the compiler interleaves.
template <int kCount>
MOK_HD void sigmoids_f32(float (&s)[kCount]) {
  float d[kCount];
  bool past = false;
  MOK_UNROLL
  for (int i = 0; i < kCount; ++i) {
    d[i] = 1.0f + exp_f32(-s[i]);
    past |= !(d[i] < 0x1p126f);
    s[i] = reciprocal_from_one(d[i]);
  }
  if (past) {
    MOK_UNROLL
    for (int i = 0; i < kCount; ++i) s[i] = 1.0f / d[i];
  }
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
