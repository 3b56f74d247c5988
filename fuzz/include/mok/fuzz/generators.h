// rapidcheck generators of fuzz cases. Every choice shrinks toward the first (simplest) option:
// fewer experts, ranks and tokens, k = 1, softmax, no shared expert, no clamp, fp32_fma steps.
// Sizes are fixed (rapidcheck's size parameter does not scale them), so case i of a seed is the same
// case whatever the run's length.
#pragma once

#include <rapidcheck.h>

#include <ostream>

#include "mok/fuzz/fuzz_case.h"

namespace mok::fuzz {

// Valid small configs: E in {1, 2, 4, 8, 16, 3, 6, 12}, R a divisor of E up to 8, T in 1..65 (odd
// T and T = 1 included, N = R T <= 160), H in {64, 128, 448}, I in {64, 128, 320}, k <= min(E, 8), both score modes
// (sigmoid with a valid n_group / topk_group), shared expert and SwiGLU clamp on or off; precision fp8
// one time in four, its H, I and Is rounded up to a multiple of 128 (at most 256).
rc::Gen<LayerConfig> gen_config();

// Every RoutingKind: router, router_ties (exact score ties), and the given uniform, zipf (exponent
// in [0.25, 4)), one_hot, all_to_one, sparse (many empty experts).
rc::Gen<ref::RoutingKind> gen_routing_kind();

// StepModel fp32_fma three times in four, hopper_tc otherwise; ring_rows a multiple of 16 in
// 16..1024; recompute on or off. The fault stays none: the driver sets it.
rc::Gen<ref::Options> gen_options();

rc::Gen<FuzzCase> gen_fuzz_case();

// rapidcheck prints counterexamples through this.
void showValue(const FuzzCase& fc, std::ostream& os);

}  // namespace mok::fuzz
