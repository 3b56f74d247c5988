// The FP8 (E4M3) tensor-core step, as a parameterised model under validation (issue 19; docs/numerics.md,
// "FP8 tensor-core accumulation"). One step is what wgmma.mma_async m64nNk32.f32.e4m3.e4m3 computes per
// output element: D = C + sum of 32 products a[k] b[k], k in 0..31. The hardware does not accumulate as
// IEEE fp32 does (public measurements: about 14 bits kept, terms aligned to the largest exponent and
// truncated; MMA-Sim, arXiv 2511.10909, models Hopper's FP8 wgmma as 13 fraction bits kept and the result
// truncated to 13 fraction bits). Which rules hold bit for bit is decided by mok-tc-validate's
// wgmma-e4m3 mode, which scores every candidate of Fp8StepModel::candidates() against the tensor cores:
// on the H200 hopper() matched all 1.0e7 outputs of its ten input classes and every other candidate
// missed (docs/results/2026-12-01-h200-n). The layer's FP8 mode uses hopper() (mok/core/fp8_gemm.h).
//
// The model, in the manner of HopperBf16Step (kstep.h):
//  - a product of two E4M3 values is exact: 4-bit significands (hidden bit included; a subnormal has
//    exponent -6 and no hidden bit) multiplied as integers, exponent e_a + e_b, not renormalised;
//  - C is unpacked likewise (24-bit significand, a subnormal at exponent -126);
//  - the products are taken in groups of `group` consecutive k (32: all of them in one sum with C);
//    per group, the group's products and the accumulator (C, then the previous group's result) are
//    aligned to e_max, the largest exponent among the nonzero terms (and, when zero_exp is not
//    kZeroIgnored, among the zero products too, a zero operand having exponent zero_exp);
//  - every term is cut to a multiple of 2^(e_max - align_frac): toward zero (floor_terms false) or
//    toward -Inf (floor_terms true, two's complement truncation), then all are summed exactly;
//  - the sum is normalised and truncated toward zero to out_frac fraction bits (23: an fp32 value;
//    13: the "e8m13" result, fp32 with the low 10 bits zero; subnormal results keep out_frac bits below
//    2^-126); a result past the fp32 range is +-Inf (the 32 products cannot reach it: <= 2^23 in all);
//  - a sum that is, or truncates to, zero is +0, unless signed_zero and every term is -0 (then -0);
//  - NaN in (E4M3 S.1111.111, or C), gives 0x7fffffff; C = +-Inf gives C (E4M3 has no Inf).
#pragma once

#include "mok/core/fp8.h"

namespace mok {

inline constexpr int kFp8StepK = 32;

struct Fp8StepModel {
  static constexpr int kZeroIgnored = -1000;  // zero_exp: zero products take no part in e_max
  static constexpr int kProductFrac = 6;      // 4-bit significands: 2 integer, 6 fraction bits
  static constexpr int kAccFrac = 23;
  static constexpr int kNoTerm = -2000;  // below any exponent a term can have

  int align_frac;    // fraction bits kept below 2^e_max for each term (8..40)
  int out_frac;      // fraction bits of the normalised result (1..23)
  int group;         // products per fused sum: 32, 16, 8 or 4
  bool floor_terms;  // terms cut toward -Inf (two's complement) instead of toward zero
  int zero_exp;      // exponent of a zero E4M3 operand in the search for e_max, or kZeroIgnored
  bool signed_zero;  // an exact zero sum of -0 terms only is -0 (else +0)

  // The H200's rule (the validator's first candidate; its exit status follows it): MMA-Sim's Hopper
  // FP8 rule, and a zero sum is +0 even where every term is -0 (unlike the bf16 step).
  MOK_HD static constexpr Fp8StepModel hopper() { return {13, 13, 32, false, kZeroIgnored, false}; }

  // clang-format off
  // The candidates mok-tc-validate scores side by side: hopper(), then one or two rules changed.
  //   {align_frac, out_frac, group, floor_terms, zero_exp, signed_zero}
  static constexpr int kCandidates = 12;
  MOK_HD static constexpr Fp8StepModel candidate(int i) {
    constexpr int z = kZeroIgnored;
    switch (i) {
      case 1: return {12, 12, 32, false, z, false};     // 13 significant bits in all
      case 2: return {14, 14, 32, false, z, false};     // 15 significant bits
      case 3: return {14, 13, 32, false, z, false};     // one more alignment bit than result bits
      case 4: return {13, 23, 32, false, z, false};     // terms cut at 13 bits, an fp32 result
      case 5: return {25, 23, 32, false, z, false};     // the bf16 step's widths
      case 6: return {13, 13, 16, false, z, false};     // two chained sums of 16 products
      case 7: return {13, 13, 8, false, z, false};      // four chained sums of 8
      case 8: return {13, 13, 32, true, z, false};      // two's complement truncation of the terms
      case 9: return {13, 13, 32, false, -6, false};    // a zero is a subnormal of exponent -6
      case 10: return {13, 13, 32, false, -126, false}; // MMA-Sim's zero exponent
      case 11: return {13, 13, 32, false, z, true};     // -0 when every term is -0 (the bf16 step's rule)
      default: return hopper();
    }
  }
  // clang-format on

  // E4M3 -> signed integer significand and exponent: value = sig 2^(exp - 3). A zero gets zero_exp.
  MOK_HD static void unpack(fp8_e4m3 v, int32_t& sig, int32_t& exp) {
    const int32_t field = (v.bits >> 3) & 0xf;
    const int32_t mant = field == 0 ? (v.bits & 0x7) : ((v.bits & 0x7) | 0x8);
    sig = (v.bits & 0x80) ? -mant : mant;
    exp = field == 0 ? -6 : field - 7;
  }

  // sig 2^(exp - frac) as a count of 2^(e_max - align_frac) units, cut toward zero or toward -Inf.
  MOK_HD int64_t aligned(int64_t sig, int exp, int frac, int e_max) const {
    if (sig == 0) return 0;
    const int up = exp - frac - e_max + align_frac;  // <= align_frac - frac for a nonzero term (exp <= e_max)
    if (up >= 0) return sig << up;
    const int down = -up;
    const int64_t mag = sig < 0 ? -sig : sig;
    if (!floor_terms || sig > 0) {
      const int64_t out = down > 62 ? 0 : mag >> down;
      return sig < 0 ? -out : out;
    }
    if (down > 62) return -1;  // a negative term below the grid: one unit toward -Inf
    return -((mag + (int64_t(1) << down) - 1) >> down);
  }

  // sum 2^(e_max - align_frac), nonzero, truncated toward zero to out_frac fraction bits; +-Inf past fp32.
  MOK_HD float normalise(int64_t sum, int e_max) const {
    const uint32_t sign = sum < 0 ? 0x80000000u : 0u;
    uint64_t mag = uint64_t(sum < 0 ? -sum : sum);
    const int lead = leading_bit(mag) + e_max - align_frac;  // exponent of the leading bit
    if (lead > 127) return float_of(sign | 0x7f800000u);
    const int exp = lead >= -126 ? lead : -126;
    const int drop = (exp - out_frac) - (e_max - align_frac);
    if (drop > 0) mag = drop >= 64 ? 0 : mag >> drop;
    if (drop < 0) mag <<= -drop;
    if (mag == 0) return 0.0f;                                   // truncated to zero: +0
    const uint32_t fraction = uint32_t(mag) << (23 - out_frac);  // < 2^24: the hidden bit at bit 23
    if (lead < -126) return float_of(sign | fraction);           // subnormal (no hidden bit)
    return float_of(sign | uint32_t(exp + 127) << 23 | (fraction & 0x7fffffu));
  }

  // One fused sum: c (finite or +-Inf) and the products [first, first + count).
  MOK_HD float fused(float c, const int32_t* p_sig, const int32_t* p_exp, const fp8_e4m3* a, const fp8_e4m3* b,
                     int first, int count) const {
    const uint32_t cu = bits_of(c);
    const int32_t c_field = (cu >> 23) & 0xff;
    if (c_field == 0xff) return c;  // +-Inf (NaN was handled before): finite products leave it
    const int32_t c_mant = c_field == 0 ? int32_t(cu & 0x7fffffu) : int32_t((cu & 0x7fffffu) | 0x800000u);
    const int32_t c_sig = (cu >> 31) ? -c_mant : c_mant;
    const int32_t c_exp = c_field == 0 ? -126 : c_field - 127;
    int e_max = c_sig != 0 ? c_exp : kNoTerm;
    for (int i = first; i < first + count; ++i) {
      const bool counts = p_sig[i] != 0 || zero_exp != kZeroIgnored;
      const int exp = counts ? p_exp[i] : kNoTerm;
      e_max = exp > e_max ? exp : e_max;
    }
    int64_t sum = 0;
    bool all_zero = c_sig == 0;
    if (e_max != kNoTerm) {
      sum = aligned(c_sig, c_exp, kAccFrac, e_max);
      for (int i = first; i < first + count; ++i) {
        sum += aligned(p_sig[i], p_exp[i], kProductFrac, e_max);
        all_zero = all_zero && p_sig[i] == 0;
      }
    }
    if (sum != 0) return normalise(sum, e_max);
    if (!all_zero || !signed_zero) return 0.0f;
    bool negative = cu == 0x80000000u;  // every term -0: C and each product (sign of a xor sign of b)
    for (int i = first; i < first + count; ++i) negative = negative && (((a[i].bits ^ b[i].bits) >> 7) & 1u);
    return negative ? -0.0f : 0.0f;
  }

  // The whole step on raw operands: a[0..31], b[0..31] (b is B's column).
  MOK_HD float operator()(float c, const fp8_e4m3* a, const fp8_e4m3* b) const {
    if ((bits_of(c) & 0x7fffffffu) > 0x7f800000u) return float_of(kCanonicalNanF32);
    int32_t p_sig[kFp8StepK], p_exp[kFp8StepK];
    bool nan = false;
    for (int i = 0; i < kFp8StepK; ++i) {
      nan = nan || is_nan(a[i]) || is_nan(b[i]);
      int32_t as, ae, bs, be;
      unpack(a[i], as, ae);
      unpack(b[i], bs, be);
      if (as == 0) ae = zero_exp;
      if (bs == 0) be = zero_exp;
      p_sig[i] = as * bs;
      p_exp[i] = ae + be;
    }
    if (nan) return float_of(kCanonicalNanF32);
    for (int first = 0; first < kFp8StepK; first += group) c = fused(c, p_sig, p_exp, a, b, first, group);
    return c;
  }
};

}  // namespace mok
