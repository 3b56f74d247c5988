// The matrix-product accumulation order shared by every GEMM of the layer, CPU and GPU:
//   out = +0;  for c in 0..K/16-1:  out = step(out, a[16c .. 16c+15], b[16c .. 16c+15])
// K is always a multiple of 16 (callers zero-pad). A K-step is exactly one bf16 tensor-core
// instruction (mma.sync m16n8k16 / wgmma m64nNk16) with its accumulator as C, so a kernel that never
// splits K computes each output element as this chain. Two step models plug in:
//   Fp32FmaStep      16 sequential fp32 fmas (a plain, fast model; not the GPU's bits)
//   HopperBf16Step   bit-accurate model of the sm_90 bf16 tensor-core step (docs/numerics.md)
#pragma once

#include "mok/core/bf16.h"

namespace mok {

inline constexpr int kStepK = 16;

enum class StepModel : uint8_t { fp32_fma = 0, hopper_tc = 1 };

struct Fp32FmaStep {
  MOK_HD float operator()(float c, const bf16* a, const bf16* b) const {
    for (int i = 0; i < kStepK; ++i) c = fma32(to_float(a[i]), to_float(b[i]), c);
    return c;
  }
};

// The Hopper bf16 tensor-core step, in the SoftFloat manner: unpack, special cases, integer sum,
// one rounding routine. Rules (probed on the H200, docs/numerics.md):
//  - each product a_i*b_i is exact: integer significands (8 bits each) multiplied, exponent
//    e_a + e_b, not renormalised; subnormal inputs have exponent -126 and no hidden bit;
//  - the 16 products and C are aligned to the largest exponent e_max among the nonzero terms,
//    floored at kAlignFloor = -133 (so terms of sums below 2^-133 are cut at 2^-158: probed on the
//    underflow class of mok-tc-validate; a floor at -126, or none, mismatches there);
//  - every term is truncated toward zero to kFractionBits bits below 2^e_max, then summed exactly;
//  - the sum is normalised and truncated toward zero to fp32 (subnormals kept); overflow gives Inf;
//  - NaN in, Inf*0 or Inf-Inf give the canonical NaN 0x7fffffff; an Inf term gives that Inf;
//    a sum that is or truncates to zero is +0, unless every term is -0 (then -0).
// finite_step is the arithmetic on unpacked operands (the CPU reference unpacks whole matrices
// once); operator() is the whole instruction on raw bf16 operands.
template <int kFractionBits, int kAlignFloor>
struct HopperBf16StepModel {
  static_assert(kFractionBits >= 23 && kFractionBits <= 28, "aligned terms must fit the integer sum");
  // Terms are widened, never narrowed, before alignment: both operand kinds have <= 23 fraction bits.
  static constexpr int kProductFrac = 14;  // 8-bit significands: 2 integer, 14 fraction bits
  static constexpr int kAccFrac = 23;
  static constexpr int kNoTerm = -1000;  // below any exponent a term can have

  // Finite bf16 -> signed integer significand and exponent: value = sig * 2^(exp - 7).
  MOK_HD static void unpack(bf16 v, int32_t& sig, int32_t& exp) {
    const int32_t field = (v.bits >> 7) & 0xff;
    const int32_t mant = field == 0 ? (v.bits & 0x7f) : ((v.bits & 0x7f) | 0x80);
    sig = (v.bits & 0x8000) ? -mant : mant;
    exp = field == 0 ? -126 : field - 127;
  }

  MOK_HD static bool special(bf16 v) { return (v.bits & 0x7f80u) == 0x7f80u; }

  // |sig| * 2^(exp - frac), truncated toward zero to a multiple of 2^(e_max - kFractionBits).
  // Branch-free (the CPU reference vectorises the 16 products): the significand widened to
  // kFractionBits fraction bits, then shifted down by its distance below e_max. A zero term may sit
  // above e_max (e_max counts nonzero terms only); its distance is clamped and it stays zero.
  MOK_HD static int64_t aligned(int64_t sig, int exp, int frac, int e_max) {
    const int distance = e_max - exp;
    const int64_t mag = (sig < 0 ? -sig : sig) << (kFractionBits - frac);
    const int64_t out = distance > 62 ? 0 : mag >> (distance < 0 ? 0 : distance);
    return sig < 0 ? -out : out;
  }

  // sum * 2^(e_max - kFractionBits) to fp32, truncating toward zero; overflow gives +-Inf.
  MOK_HD static float round_to_f32(int64_t sum, int e_max) {
    const uint32_t sign = sum < 0 ? 0x80000000u : 0u;
    uint64_t mag = uint64_t(sum < 0 ? -sum : sum);
    const int exp = leading_bit(mag) + e_max - kFractionBits;  // unbiased exponent of the leading bit
    if (exp > 127) return float_of(sign | 0x7f800000u);
    const int lsb_exp = exp >= -126 ? exp - 23 : -149;  // 24 bits if normal, fewer if subnormal
    const int drop = lsb_exp - (e_max - kFractionBits);
    if (drop > 0) mag = drop >= 64 ? 0 : (mag >> drop);
    if (drop < 0) mag <<= -drop;
    if (mag == 0) return 0.0f;  // truncated to zero: +0 whatever the sign (probed)
    if (exp < -126) return float_of(sign | uint32_t(mag));
    return float_of(sign | (uint32_t(exp + 127) << 23) | (uint32_t(mag) & 0x7fffffu));
  }

  // The sign of an exact zero sum: -0 only when C and every product are -0.
  MOK_HD static float zero_sum(float c, const bf16* a, const bf16* b) {
    bool negative = bits_of(c) == 0x80000000u;
    for (int i = 0; i < kStepK; ++i) negative = negative && (((a[i].bits ^ b[i].bits) >> 15) & 1u);
    return negative ? -0.0f : 0.0f;
  }

  // a, b: the raw operands (consulted only for the sign of an all-zero sum).
  MOK_HD static float finite_step(float c, const int32_t* a_sig, const int32_t* a_exp, const int32_t* b_sig,
                                  const int32_t* b_exp, const bf16* a, const bf16* b) {
    const uint32_t cu = bits_of(c);
    const int32_t c_field = (cu >> 23) & 0xff;
    if (c_field == 0xff) return (cu & 0x7fffffu) ? float_of(kCanonicalNanF32) : c;
    const int32_t c_mant = c_field == 0 ? int32_t(cu & 0x7fffffu) : int32_t((cu & 0x7fffffu) | 0x800000u);
    const int32_t c_sig = (cu >> 31) ? -c_mant : c_mant;
    const int32_t c_exp = c_field == 0 ? -126 : c_field - 127;
    int32_t p_sig[kStepK], p_exp[kStepK];
    int e_max = c_sig != 0 ? c_exp : kNoTerm;
    for (int i = 0; i < kStepK; ++i) {
      p_sig[i] = a_sig[i] * b_sig[i];
      p_exp[i] = a_exp[i] + b_exp[i];
      const int exp = p_sig[i] != 0 ? p_exp[i] : kNoTerm;  // branch-free: the loop vectorises
      e_max = exp > e_max ? exp : e_max;
    }
    if (e_max == kNoTerm) return zero_sum(c, a, b);
    if (e_max < kAlignFloor) e_max = kAlignFloor;
    int64_t sum = aligned(c_sig, c_exp, kAccFrac, e_max);
    for (int i = 0; i < kStepK; ++i) sum += aligned(p_sig[i], p_exp[i], kProductFrac, e_max);
    return sum == 0 ? 0.0f : round_to_f32(sum, e_max);
  }

  MOK_HD static float special_step(float c, const bf16* a, const bf16* b) {
    const uint32_t cu = bits_of(c);
    bool nan = (cu & 0x7fffffffu) > 0x7f800000u;
    bool pos_inf = cu == 0x7f800000u, neg_inf = cu == 0xff800000u;
    for (int i = 0; i < kStepK; ++i) {
      if (!special(a[i]) && !special(b[i])) continue;
      const bool a_nan = special(a[i]) && (a[i].bits & 0x7fu), b_nan = special(b[i]) && (b[i].bits & 0x7fu);
      const bool a_zero = (a[i].bits & 0x7fffu) == 0, b_zero = (b[i].bits & 0x7fffu) == 0;
      if (a_nan || b_nan || (special(a[i]) && b_zero) || (special(b[i]) && a_zero))
        nan = true;
      else if ((a[i].bits ^ b[i].bits) & 0x8000u)
        neg_inf = true;
      else
        pos_inf = true;
    }
    if (nan || (pos_inf && neg_inf)) return float_of(kCanonicalNanF32);
    return pos_inf ? float_of(0x7f800000u) : float_of(0xff800000u);
  }

  MOK_HD float operator()(float c, const bf16* a, const bf16* b) const {
    bool any_special = false;
    int32_t as[kStepK], ae[kStepK], bs[kStepK], be[kStepK];
    for (int i = 0; i < kStepK; ++i) {
      any_special |= special(a[i]) || special(b[i]);
      unpack(a[i], as[i], ae[i]);
      unpack(b[i], bs[i], be[i]);
    }
    if (any_special) return special_step(c, a, b);
    return finite_step(c, as, ae, bs, be, a, b);
  }
};

// The model the megakernel's bits are checked against (variants exist only for the probes).
using HopperBf16Step = HopperBf16StepModel<25, -133>;

template <class Step>
MOK_HD float kchain(const bf16* a, const bf16* b, int k, float acc, Step step) {
  for (int c = 0; c < k; c += kStepK) acc = step(acc, a + c, b + c);
  return acc;
}

}  // namespace mok
