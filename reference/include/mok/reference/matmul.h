// Row-major products in the shared K-step order: C[m, n] = chain_k A[m, k] * B[n, k].
#pragma once

#include <vector>

#include "mok/core/kstep.h"

namespace mok::ref {

// K a multiple of 16. accumulate: each chain starts from C's value instead of +0 (weight gradients
// continued across ring minibatches).
void matmul(StepModel step, const bf16* a, int m, const bf16* b, int n, int k, float* c, bool accumulate = false);

// [rows, cols] -> [cols, rows rounded up to 16], zero-padded.
std::vector<bf16> transpose_padded(const bf16* src, int rows, int cols);

inline int round_up16(int v) { return (v + kStepK - 1) / kStepK * kStepK; }

}  // namespace mok::ref
