// The fp64 oracle of the layer (docs/design.md, verification level V1) and the accuracy bounds the reference (and,
// through the goldens, the megakernel) must meet against it. docs/accuracy.md explains and measures them.
//
// The oracle is the layer's exact math in double precision with no intermediate rounding, on the
// reference's inputs converted exactly to double (in the fp8 mode too: the unquantized bf16 inputs,
// the quantization being part of the error the fp8 bounds allow). Routing is discrete, so the oracle
// takes the reference's topk_idx as given: it checks the arithmetic, not the choice. With the router
// it recomputes logits and topk_w in fp64 from those ids; with a replayed routing it uses the given
// weights. Every tensor is in the reference's layout (layer.h), flattened row-major.
#pragma once

#include <cstdint>
#include <vector>

#include "mok/reference/layer.h"

namespace mok::ref {

struct OracleInputs {
  LayerConfig config;
  std::vector<double> x;             // [N, H]
  std::vector<double> dy;            // [N, H]
  std::vector<double> router;        // [E, H]
  std::vector<double> w1;            // [E, 2I, H]
  std::vector<double> w2;            // [E, H, I]
  std::vector<double> shared_w1;     // [2Is, H]
  std::vector<double> shared_w2;     // [H, Is]
  std::vector<int32_t> topk_idx;     // [N, k], held fixed
  std::vector<double> given_topk_w;  // [N, k] a replayed routing's weights; empty when the router routes
  // The SwiGLU clamp's branch per operand, held fixed like topk_idx: 1 where the layer's bf16 h is
  // beyond the limit (gate > limit; |up| > limit), so the operand is clamped and passes no gradient.
  // [N * k, 2I] in (token, slot) order and [N, 2Is]; empty (no clamp, or no saved h): the oracle
  // decides on bf16 of its own fp64 h, which can differ where h is within fp32 error of a bf16
  // rounding boundary next to the limit (docs/accuracy.md).
  std::vector<uint8_t> clamped;
  std::vector<uint8_t> shared_clamped;

  bool routed_by_router() const { return given_topk_w.empty(); }
};

// The reference's inputs, its forward's routing (fwd.logits empty means the routing was given) and,
// with a clamp, its clamp branches from fwd.h and fwd.shared_h. A recompute-mode forward saves neither:
// pass the forward of the same run with saved activations (the same bits), or the branches are the
// oracle's own.
OracleInputs oracle_inputs(const LayerConfig& c, const std::vector<bf16>& x, const LayerWeights& w,
                           const std::vector<bf16>& dy, const Forward& fwd);

struct OracleResult {
  std::vector<double> logits;       // [N, E]; empty for a given routing
  std::vector<double> topk_w;       // [N, k]
  std::vector<double> y;            // [N, H]
  std::vector<double> dx;           // [N, H]
  std::vector<double> d_topk_w;     // [N, k]
  std::vector<double> d_logits;     // [N, E]; empty for a given routing
  std::vector<double> d_router;     // [E, H]; empty for a given routing
  std::vector<double> d_w1;         // [E, 2I, H]
  std::vector<double> d_w2;         // [E, H, I]
  std::vector<double> d_shared_w1;  // [2Is, H]; empty without a shared expert
  std::vector<double> d_shared_w2;  // [H, Is]

  // Condition scales of the tensors whose exact value can cancel far below the size of its terms
  // (docs/accuracy.md, Metric): per element, max(|value|, the RMS size of the rounding error the
  // bounds allow, per unit of roundoff). Empty where the tensor is.
  //   d_topk_w_scale: max(|<g, a>|, ||g .* a||_2)
  //   d_logits_scale: max(|d logit_e|, sqrt(sum_j (J_je d_topk_w_scale_j)^2)), J = d topk_w / d logits
  //   d_router_scale: max(|d router_eh|, sqrt(sum_n (d_logits_scale_ne x_nh)^2))
  std::vector<double> d_topk_w_scale;  // [N, k]
  std::vector<double> d_logits_scale;  // [N, E]
  std::vector<double> d_router_scale;  // [E, H]

  Precision precision = Precision::bf16;  // the config's: the layer's results are held to its bounds
};

// Forward and backward of the loss L = sum(dy * y).
OracleResult oracle(const OracleInputs& in);

// The oracle's forward in pieces, so finite differences can perturb logits and weights directly.
std::vector<double> oracle_logits(const OracleInputs& in);  // [N, E] = x Wr^T
std::vector<double> oracle_router_weights(const LayerConfig& c, const std::vector<double>& logits,
                                          const std::vector<int32_t>& topk_idx);          // [N, k]
std::vector<double> oracle_y(const OracleInputs& in, const std::vector<double>& topk_w);  // [N, H]

// ---- Accuracy: per-tensor error against the oracle and its documented bound ----

enum class OracleTensor : uint8_t {
  logits,
  topk_w,
  y,
  dx,
  d_topk_w,
  d_logits,
  d_router,
  d_w1,
  d_w2,
  d_shared_w1,
  d_shared_w2,
};

const char* to_string(OracleTensor t);

// Against a per-element scale s (s = |ref| when no scale is given; otherwise OracleResult's condition
// scale, which is >= |ref|): relative = ||out - ref||_F / ||s||_F; max_abs = max |out - ref|;
// max_ref = max s. Exact agreement is error 0 even where s is all zeros (0/0 -> 0); a nonzero
// difference against an all-zero s is relative = infinity, which fails every bound.
struct TensorError {
  double relative = 0.0;
  double max_abs = 0.0;
  double max_ref = 0.0;
};

TensorError tensor_error(const std::vector<float>& out, const std::vector<double>& ref,
                         const std::vector<double>& scale = {});
TensorError tensor_error(const std::vector<bf16>& out, const std::vector<double>& ref,
                         const std::vector<double>& scale = {});

// bf16's unit roundoff: one round-to-nearest changes a value by at most this fraction of it.
inline constexpr double kBf16Unit = 0x1p-8;

// E4M3's unit roundoff (3 fraction bits): one quantization of the fp8 mode changes an element by at
// most this fraction. Its errors, spread evenly over half an E4M3 ulp either way, have an RMS size of
// at most kE4m3Unit / sqrt(3) of the element: what a quantization point adds to a relative Frobenius
// error (docs/accuracy.md, "FP8 mode").
inline constexpr double kE4m3Unit = 0x1p-4;
inline constexpr double kE4m3Rms = kE4m3Unit / 1.7320508075688772;

// The E4M3 quantization points on a tensor's path in the fp8 mode, each weighted by how much the later
// math can amplify it (as in oracle_bound): the operands of h = x W1^T (x, W1) reach the gate through
// silu 2x and up 1x: a carries 3 x 2 = 6; y_e = a W2^T adds a's and W2's own (8). In the backward
// g = dy W2 carries 2 (dy, W2); dh = swiglu_grad(h, w g) carries h's 2 through swiglu_grad (3x) and
// g's 2 (8); dx_j = dh W1 adds dh's and W1's (10). The weight gradients take bf16 operands, but
// operands that carry the quantization of the forward (a) or of the input gradient (dh).
constexpr double fp8_quantization_points(OracleTensor t) {
  switch (t) {
    case OracleTensor::logits:
    case OracleTensor::topk_w:
      return 0;  // the router is fp32 in either precision
    case OracleTensor::y:
    case OracleTensor::d_topk_w:  // <g, a>: g 2, a 6
    case OracleTensor::d_w1:      // dh^T x: dh 8
    case OracleTensor::d_shared_w1:
      return 8;
    case OracleTensor::dx:
      return 10;
    case OracleTensor::d_logits:  // d topk_w through the renormalisation, 2x as in oracle_bound
    case OracleTensor::d_router:
      return 16;
    case OracleTensor::d_w2:  // bf16(w dy)^T a: a 6
    case OracleTensor::d_shared_w2:
      return 6;
  }
  return 0;
}

// The bound on relative (and on max_abs / max_ref) per tensor: the bf16 rounding points on the
// tensor's path, each at most kBf16Unit of the rounded value, weighted by how much the later math
// can amplify it to first order (silu: up to 2x; the renormalisation's difference of weights: 2x).
// Tensors that see no bf16 rounding (logits, topk_w) are bounded at the fp32 level instead. The fp8
// mode adds kE4m3Rms per weighted quantization point (fp8_quantization_points).
// docs/accuracy.md derives every line and lists the measured errors, which sit well inside.
constexpr double oracle_bound(OracleTensor t, Precision precision = Precision::bf16) {
  if (precision == Precision::fp8) return oracle_bound(t) + fp8_quantization_points(t) * kE4m3Rms;
  // a = bf16(silu(gate) * up) from bf16 gate and up: up 1, gate through silu 2, a itself 1.
  constexpr double a_rounding = 4 * kBf16Unit;
  // dh = bf16(swiglu_grad(h, da)): gate and up rounding 3 as above, dh itself 1.
  constexpr double dh_rounding = 4 * kBf16Unit;
  switch (t) {
    case OracleTensor::logits:
    case OracleTensor::topk_w:
      return 0x1p-16;  // fp32 only: H-term chain ~2^-24 sqrt(H / 6), exp 2 ulp, a division; 7x up to H = 8192
    case OracleTensor::y:
      return a_rounding + 2 * kBf16Unit;  // + y_e = bf16(a W2^T), + y = bf16(sum)
    case OracleTensor::dx:
      return dh_rounding + 2 * kBf16Unit;  // + dx_j = bf16(dh W1), + dx = bf16(sum)
    case OracleTensor::d_topk_w:
      return a_rounding;  // <dy W2, a>: g in fp32, a carries its rounding
    case OracleTensor::d_logits:
    case OracleTensor::d_router:
      return 2 * a_rounding;  // d topk_w through the renormalisation's d w_j - sum_i d w_i w_i
    case OracleTensor::d_w1:
    case OracleTensor::d_shared_w1:
      return dh_rounding;  // dh^T x, x exact, fp32 accumulation
    case OracleTensor::d_w2:
      return a_rounding + kBf16Unit;  // bf16(w dy)^T a
    case OracleTensor::d_shared_w2:
      return a_rounding;  // dy^T a, dy exact
  }
  return 0.0;
}

struct OracleCheck {
  OracleTensor tensor;
  TensorError error;
  double bound;

  bool passed() const { return error.relative <= bound && error.max_abs <= bound * error.max_ref; }
};

// Every tensor the reference's forward and backward produced, against the oracle's.
std::vector<OracleCheck> compare_with_oracle(const Forward& fwd, const Gradients& grad, const OracleResult& o);

}  // namespace mok::ref
