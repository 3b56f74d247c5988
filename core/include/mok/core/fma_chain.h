// CUDA-core reductions (router dots, router-gradient dots, weight-gradient of the router):
// one fp32 fma per term, in index order from +0. A kernel computes each such sum in one thread; a
// chain may run in pieces, each continuing from the last one's acc. A NaN result is the canonical one
// (host_device.h), as the GPU's fma writes it; the GPU's tiled chains (chain_gemm.cuh) end the same way.
#pragma once

#include "mok/core/host_device.h"

namespace mok {

template <class A, class B>
MOK_HD float fma_chain(int n, A a, B b, float acc = 0.0f) {
  for (int i = 0; i < n; ++i) acc = fma32(a(i), b(i), acc);
  return canonical_nan(acc);
}

}  // namespace mok
