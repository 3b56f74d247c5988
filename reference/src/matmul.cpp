#include "mok/reference/matmul.h"

#include <algorithm>
#include <cstddef>
#include <string>

#include "mok/core/fp8_gemm.h"

namespace mok::ref {
namespace {

size_t at(long a, long b) { return size_t(a) * size_t(b); }

bool parallel_worth_it(int m, int n, int k) { return long(m) * n * k > (1l << 18); }

// Fp32FmaStep: the same per-element fma sequence, vectorised across n (B transposed to [K, N]).
void matmul_fp32(const bf16* a, int m, const bf16* b, int n, int k, float* c, bool accumulate) {
  std::vector<float> bt(at(k, n));
  for (int j = 0; j < n; ++j)
    for (int q = 0; q < k; ++q) bt[at(q, n) + j] = to_float(b[at(j, k) + q]);
#pragma omp parallel for schedule(static) if (parallel_worth_it(m, n, k))
  for (int i = 0; i < m; ++i) {
    float* crow = c + at(i, n);
    if (!accumulate)
      for (int j = 0; j < n; ++j) crow[j] = 0.0f;
    for (int q = 0; q < k; ++q) {
      const float aq = to_float(a[at(i, k) + q]);
      const float* brow = bt.data() + at(q, n);
      for (int j = 0; j < n; ++j) crow[j] = fma32(aq, brow[j], crow[j]);
    }
    for (int j = 0; j < n; ++j) crow[j] = canonical_nan(crow[j]);  // as every fp32 output's NaN
  }
}

// A matrix unpacked once for HopperBf16Step::finite_step, with its rows holding Inf/NaN flagged.
struct Unpacked {
  std::vector<int32_t> sig, exp;
  std::vector<bool> special_row;

  Unpacked(const bf16* v, int rows, int k) : sig(at(rows, k)), exp(at(rows, k)), special_row(rows, false) {
    for (int r = 0; r < rows; ++r)
      for (int q = 0; q < k; ++q) {
        const bf16 x = v[at(r, k) + q];
        HopperBf16Step::unpack(x, sig[at(r, k) + q], exp[at(r, k) + q]);
        if (HopperBf16Step::special(x)) special_row[r] = true;
      }
  }
};

void matmul_hopper(const bf16* a, int m, const bf16* b, int n, int k, float* c, bool accumulate) {
  const Unpacked ua(a, m, k), ub(b, n, k);
#pragma omp parallel for schedule(dynamic, 4) if (parallel_worth_it(m, n, k))
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      float acc = accumulate ? c[at(i, n) + j] : 0.0f;
      const bf16* arow = a + at(i, k);
      const bf16* brow = b + at(j, k);
      if (ua.special_row[i] || ub.special_row[j]) {
        acc = kchain(arow, brow, k, acc, HopperBf16Step{});
      } else {
        for (int s = 0; s < k; s += kStepK)
          acc = HopperBf16Step::finite_step(acc, &ua.sig[at(i, k) + s], &ua.exp[at(i, k) + s], &ub.sig[at(j, k) + s],
                                            &ub.exp[at(j, k) + s], arow + s, brow + s);
      }
      c[at(i, n) + j] = acc;
    }
}

// An operand of the FP8 GEMM: its rows as E4M3 values and one scale exponent per block of
// `block_rows` rows and 128 columns (the last block row may be shorter).
struct Fp8Operand {
  std::vector<fp8_e4m3> values;
  std::vector<int> exps;
  int k_blocks, block_rows;

  Fp8Operand(const bf16* v, int rows, int k, int block_rows)
      : values(at(rows, k)),
        exps(at((rows + block_rows - 1) / block_rows, k / kFp8Block)),
        k_blocks(k / kFp8Block),
        block_rows(block_rows) {
    for (int r = 0; r < rows; r += block_rows)
      for (int kb = 0; kb < k_blocks; ++kb) {
        const size_t first = at(r, k) + at(kb, kFp8Block);
        exps[at(r / block_rows, k_blocks) + kb] =
            quantize_block(v + first, std::min(block_rows, rows - r), kFp8Block, k, values.data() + first, k);
      }
  }

  const fp8_e4m3* row(int r) const { return values.data() + at(r, at(k_blocks, kFp8Block)); }
  const int* row_exps(int r) const { return exps.data() + at(r / block_rows, k_blocks); }
};

}  // namespace

void matmul_fp8(const bf16* a, int m, const bf16* b, int n, int k, int b_block_rows, float* c) {
  if (k % kFp8Block != 0) fail_internal("an fp8 GEMM's K = " + std::to_string(k) + " is not a multiple of 128");
  const Fp8Operand qa(a, m, k, 1), qb(b, n, k, b_block_rows);
#pragma omp parallel for schedule(dynamic, 4) if (parallel_worth_it(m, n, k))
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j)
      c[at(i, n) + j] = fp8_gemm_element(qa.row(i), qa.row_exps(i), qb.row(j), qb.row_exps(j), k);
}

void matmul(StepModel step, Precision precision, const bf16* a, int m, const bf16* b, int n, int k, float* c) {
  if (precision == Precision::fp8)
    matmul_fp8(a, m, b, n, k, kFp8Block, c);
  else
    matmul(step, a, m, b, n, k, c);
}

void matmul(StepModel step, const bf16* a, int m, const bf16* b, int n, int k, float* c, bool accumulate) {
  if (step == StepModel::hopper_tc)
    matmul_hopper(a, m, b, n, k, c, accumulate);
  else
    matmul_fp32(a, m, b, n, k, c, accumulate);
}

std::vector<bf16> transpose_padded(const bf16* src, int rows, int cols, int multiple) {
  const int padded = (rows + multiple - 1) / multiple * multiple;
  std::vector<bf16> out(at(cols, padded), bf16{0});
  for (int r = 0; r < rows; ++r)
    for (int q = 0; q < cols; ++q) out[at(q, padded) + r] = src[at(r, cols) + q];
  return out;
}

}  // namespace mok::ref
