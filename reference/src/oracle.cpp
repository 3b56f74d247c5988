#include "mok/reference/oracle.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>

namespace mok::ref {
namespace {

using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstView = Eigen::Map<const Matrix>;
using View = Eigen::Map<Matrix>;

size_t at(long a, long b) { return size_t(a) * size_t(b); }

std::vector<double> widened(const std::vector<bf16>& v) {
  std::vector<double> out(v.size());
  std::transform(v.begin(), v.end(), out.begin(), [](bf16 b) { return double(to_float(b)); });
  return out;
}

std::vector<double> widened(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
double silu(double v) { return v * sigmoid(v); }
double silu_grad(double v) {
  const double s = sigmoid(v);
  return s * (1.0 + v * (1.0 - s));
}

// The clamp of core/swiglu.h at the same limit: gate clamped above, up to [-limit, limit]. Which
// operands are clamped is a discrete choice, like the routing, and the layer makes it on its bf16 h;
// at the limit the layer is not differentiable, and its forward fixes the side of the kink it is on.
// So the oracle takes that choice as given (OracleInputs::clamped, from the layer's saved h) and
// computes the exact math of that branch. A branch decided on the oracle's own h instead, in fp64 or
// as bf16(fp64 h), differs from the layer's wherever rounding moves h across the limit, or across the
// bf16 midpoint next to it, and flips that operand's gradient between 0 and its full value: an error
// of the comparison, not of the layer (issue 16). Without the layer's h, the oracle decides on
// bf16(fp64 h), which equals the layer's choice unless h is within fp32 error of that midpoint.
bool beyond(double v, double limit) { return v > limit || v < -limit; }
double bf16_of(double v) { return double(to_float(to_bf16(float(v)))); }

// Which operands of h = [gate | up] ([m, 2I]) are clamped: 1 per clamped operand.
std::vector<uint8_t> clamp_branches(const Matrix& h, double limit) {
  const long inter = h.cols() / 2;
  std::vector<uint8_t> out(at(h.rows(), h.cols()));
  for (long r = 0; r < h.rows(); ++r)
    for (long i = 0; i < inter; ++i) {
      out[at(r, h.cols()) + i] = bf16_of(h(r, i)) > limit;
      out[at(r, h.cols()) + inter + i] = beyond(bf16_of(h(r, inter + i)), limit);
    }
  return out;
}

struct SwigluOperands {
  double gate, up;
  bool gate_clamped, up_clamped;
};

SwigluOperands operands(double gate, double up, double limit, bool gate_clamped, bool up_clamped) {
  return SwigluOperands{gate_clamped ? limit : gate, up_clamped ? std::copysign(limit, up) : up, gate_clamped,
                        up_clamped};
}

// One SwiGLU MLP over m rows: h = x W1^T ([m, 2I], gate | up), a = swiglu(h), out = a W2^T, with the
// clamp branches `clamped` ([m, 2I], the layer's) or, when empty, decided on bf16(h).
struct MlpPass {
  Matrix x, h, a, out;
  std::vector<uint8_t> clamped;  // [m, 2I]; empty without a clamp

  SwigluOperands swiglu_operands(long r, long i, double limit) const {
    const long inter = a.cols();
    if (clamped.empty()) return operands(h(r, i), h(r, inter + i), limit, false, false);
    return operands(h(r, i), h(r, inter + i), limit, clamped[at(r, 2 * inter) + i] != 0,
                    clamped[at(r, 2 * inter) + inter + i] != 0);
  }
};

MlpPass mlp_forward(Matrix x, const ConstView& w1, const ConstView& w2, double limit, std::vector<uint8_t> clamped) {
  const long inter = w2.cols();
  MlpPass p{std::move(x), Matrix(), Matrix(), Matrix(), std::move(clamped)};
  p.h = p.x * w1.transpose();
  require(p.clamped.empty() || p.clamped.size() == at(p.h.rows(), p.h.cols()),
          "oracle: clamp branches of a wrong size");
  if (limit <= 0)
    p.clamped.clear();
  else if (p.clamped.empty())
    p.clamped = clamp_branches(p.h, limit);
  p.a.resize(p.h.rows(), inter);
  for (long r = 0; r < p.h.rows(); ++r)
    for (long i = 0; i < inter; ++i) {
      const SwigluOperands op = p.swiglu_operands(r, i, limit);
      p.a(r, i) = silu(op.gate) * op.up;
    }
  p.out = p.a * w2.transpose();
  return p;
}

// dh from da: a clamped operand passes no gradient, as in core/swiglu.h.
Matrix swiglu_backward(const MlpPass& p, const Matrix& da, double limit) {
  const long inter = da.cols();
  Matrix dh(p.h.rows(), 2 * inter);
  for (long r = 0; r < p.h.rows(); ++r)
    for (long i = 0; i < inter; ++i) {
      const SwigluOperands op = p.swiglu_operands(r, i, limit);
      dh(r, i) = op.gate_clamped ? 0.0 : da(r, i) * op.up * silu_grad(op.gate);
      dh(r, inter + i) = op.up_clamped ? 0.0 : da(r, i) * silu(op.gate);
    }
  return dh;
}

// The (token, slot) pairs each expert serves.
struct ExpertRows {
  std::vector<int> token, slot;
};

std::vector<ExpertRows> rows_by_expert(const LayerConfig& c, const std::vector<int32_t>& topk_idx) {
  std::vector<ExpertRows> rows(c.experts);
  for (int g = 0; g < c.tokens(); ++g)
    for (int j = 0; j < c.top_k; ++j) {
      ExpertRows& r = rows[topk_idx[at(g, c.top_k) + j]];
      r.token.push_back(g);
      r.slot.push_back(j);
    }
  return rows;
}

Matrix gather(const ConstView& m, const std::vector<int>& rows) {
  Matrix out(long(rows.size()), m.cols());
  for (size_t i = 0; i < rows.size(); ++i) out.row(long(i)) = m.row(rows[i]);
  return out;
}

// The given clamp branches of an expert's rows ((token, slot) pairs), or none.
std::vector<uint8_t> expert_branches(const OracleInputs& in, const ExpertRows& rows) {
  if (in.clamped.empty()) return {};
  const size_t width = size_t(2 * in.config.intermediate);
  std::vector<uint8_t> out(rows.token.size() * width);
  for (size_t i = 0; i < rows.token.size(); ++i) {
    const size_t src = at(rows.token[i], in.config.top_k) + size_t(rows.slot[i]);
    std::copy_n(in.clamped.begin() + long(src * width), width, out.begin() + long(i * width));
  }
  return out;
}

ConstView expert_w1(const OracleInputs& in, int e) {
  const long I = in.config.intermediate, H = in.config.hidden;
  return ConstView(in.w1.data() + at(e, 2 * I * H), 2 * I, H);
}

ConstView expert_w2(const OracleInputs& in, int e) {
  const long I = in.config.intermediate, H = in.config.hidden;
  return ConstView(in.w2.data() + at(e, H * I), H, I);
}

// Softmax over E or elementwise sigmoid, for one token.
std::vector<double> scores_of(const LayerConfig& c, const double* logits) {
  const int E = c.experts;
  std::vector<double> s(E);
  if (c.score_mode == ScoreMode::sigmoid) {
    for (int e = 0; e < E; ++e) s[e] = sigmoid(logits[e]);
    return s;
  }
  const double m = *std::max_element(logits, logits + E);
  double sum = 0;
  for (int e = 0; e < E; ++e) sum += (s[e] = std::exp(logits[e] - m));
  for (double& v : s) v /= sum;
  return s;
}

double weight_scale(const LayerConfig& c) { return c.score_mode == ScoreMode::sigmoid ? c.routed_scale : 1.0; }

// d logits of one token from d topk_w: the chain rule through w_j = scale * s_{e_j} / S
// (S = sum of the selected scores when renormalising, else 1; without the layer's 1e-20, which no fp32
// sum from 2^-42 (2.3e-13) up keeps, and which in exact arithmetic would give k = 1 a derivative 1e-20 / S^2
// where the layer's is exactly zero) and through the scores. The
// renormalisation's Jacobian is applied as (dw_j - sum_i dw_i w'_i) / S with w'_i = s_i / S, as in
// core/routing.h: at k = 1, w'_0 = s / s = 1 exactly, so d scores, and with them d logits, come out
// exactly zero, as they are mathematically (the weight is the constant `scale`). The form
// (dw_j - sum_i dw_i s_i / S) / S rounds dw_0 s / s and left noise of 1e-17 there.
//
// Also the condition scale of d logits (OracleResult::d_logits_scale): sqrt(sum_j (J_je m_j)^2)
// with J_je = d w_j / d logit_e and m = d_topk_w_scale, or |d logit_e| where that is larger.
void router_backward(const LayerConfig& c, const double* logits, const int32_t* idx, const double* d_topk_w,
                     const double* d_topk_w_scale, double* d_logits, double* d_logits_scale) {
  const int E = c.experts, k = c.top_k;
  const bool sigmoid = c.score_mode == ScoreMode::sigmoid;
  const std::vector<double> s = scores_of(c, logits);
  const double scale = weight_scale(c);
  double sum = 0;
  for (int j = 0; j < k; ++j) sum += s[idx[j]];
  std::vector<double> unit(k);  // w'_j = s_j / S
  for (int j = 0; j < k; ++j) unit[j] = c.renormalize ? s[idx[j]] / sum : s[idx[j]];
  double weighted = 0;  // sum_i dw_i w'_i
  for (int j = 0; j < k; ++j) weighted += d_topk_w[j] * unit[j];
  std::vector<double> d_scores(E, 0.0);
  for (int j = 0; j < k; ++j)
    d_scores[idx[j]] = c.renormalize ? scale * (d_topk_w[j] - weighted) / sum : scale * d_topk_w[j];
  // d w_j / d s_{e_i}: scale (delta_ij - w'_j) / S renormalised (0 at k = 1), else scale delta_ij.
  const auto dw_ds = [&](int j, int i) {
    const double delta = i == j ? 1.0 : 0.0;
    return c.renormalize ? scale * (delta - unit[j]) / sum : scale * delta;
  };
  // d s_{e_i} / d logit_e: sigmoid s (1 - s) on the diagonal; softmax s_i (delta - s_e).
  const auto ds_dl = [&](int i, int e) {
    const double delta = idx[i] == e ? 1.0 : 0.0;
    return sigmoid ? delta * s[e] * (1.0 - s[e]) : s[idx[i]] * (delta - s[e]);
  };
  std::vector<double> spread2(E, 0.0);  // sum_j (J_je m_j)^2
  for (int j = 0; j < k; ++j)
    for (int e = 0; e < E; ++e) {
      double jacobian = 0;
      for (int i = 0; i < k; ++i) jacobian += dw_ds(j, i) * ds_dl(i, e);
      spread2[e] += (jacobian * d_topk_w_scale[j]) * (jacobian * d_topk_w_scale[j]);
    }
  if (sigmoid) {
    for (int e = 0; e < E; ++e) d_logits[e] = d_scores[e] * s[e] * (1.0 - s[e]);
  } else {
    double dot = 0;
    for (int e = 0; e < E; ++e) dot += d_scores[e] * s[e];
    for (int e = 0; e < E; ++e) d_logits[e] = s[e] * (d_scores[e] - dot);
  }
  for (int e = 0; e < E; ++e) d_logits_scale[e] = std::max(std::abs(d_logits[e]), std::sqrt(spread2[e]));
}

template <class T, class ToDouble>
TensorError error_of(const std::vector<T>& out, const std::vector<double>& ref, const std::vector<double>& scale,
                     ToDouble to_double) {
  if (out.size() != ref.size())
    fail_internal("tensor_error: " + std::to_string(out.size()) + " elements against " + std::to_string(ref.size()) +
                  " in the oracle");
  if (!scale.empty() && scale.size() != ref.size())
    fail_internal("tensor_error: " + std::to_string(scale.size()) + " scales for " + std::to_string(ref.size()) +
                  " elements");
  double diff2 = 0, scale2 = 0;
  TensorError err;
  for (size_t i = 0; i < out.size(); ++i) {
    const double d = std::abs(to_double(out[i]) - ref[i]);
    const double s = scale.empty() ? std::abs(ref[i]) : scale[i];
    diff2 += d * d;
    scale2 += s * s;
    err.max_abs = std::max(err.max_abs, d);
    err.max_ref = std::max(err.max_ref, s);
  }
  // 0/0 -> 0: an exactly-zero oracle tensor matched exactly. A difference against zero fails.
  if (diff2 == 0)
    err.relative = 0.0;
  else if (scale2 == 0)
    err.relative = std::numeric_limits<double>::infinity();
  else
    err.relative = std::sqrt(diff2 / scale2);
  return err;
}

constexpr const char* kTensorNames[] = {"logits",   "topk_w", "y",    "dx",          "d_topk_w",   "d_logits",
                                        "d_router", "d_w1",   "d_w2", "d_shared_w1", "d_shared_w2"};

}  // namespace

OracleInputs oracle_inputs(const LayerConfig& c, const std::vector<bf16>& x, const LayerWeights& w,
                           const std::vector<bf16>& dy, const Forward& fwd) {
  validate_inputs(c, x, w, &fwd.routing, false, "the forward's");
  validate_tokens(c, dy, "dy [N, H]");
  OracleInputs in;
  in.config = c;
  in.x = widened(x);
  in.dy = widened(dy);
  in.router = widened(w.router);
  in.w1 = widened(w.w1);
  in.w2 = widened(w.w2);
  in.shared_w1 = widened(w.shared_w1);
  in.shared_w2 = widened(w.shared_w2);
  in.topk_idx = fwd.routing.topk_idx;
  if (fwd.logits.empty()) in.given_topk_w = widened(fwd.routing.topk_w);
  if (c.swiglu_limit > 0) {
    const int N = c.tokens(), k = c.top_k, I2 = 2 * c.intermediate, Is2 = 2 * c.shared_intermediate;
    const double limit = c.swiglu_limit;
    if (!fwd.h.empty()) {  // layout order: row slot_row[g k + j] holds (token g, slot j)
      require(fwd.h.size() == at(at(N, k), I2) && fwd.layout.slot_row.size() == at(N, k),
              "oracle_inputs: the forward's h is [" + std::to_string(fwd.h.size()) + "], not [N k 2I]");
      in.clamped.resize(fwd.h.size());
      for (size_t src = 0; src < at(N, k); ++src) {
        const size_t row = size_t(fwd.layout.slot_row[src]);
        for (int n = 0; n < I2; ++n) {
          const double h = to_float(fwd.h[row * I2 + n]);
          in.clamped[src * I2 + n] = n < I2 / 2 ? h > limit : beyond(h, limit);
        }
      }
    }
    if (c.has_shared() && !fwd.shared_h.empty()) {
      require(fwd.shared_h.size() == at(N, Is2),
              "oracle_inputs: the forward's shared h is [" + std::to_string(fwd.shared_h.size()) + "], not [N 2Is]");
      in.shared_clamped.resize(fwd.shared_h.size());
      for (size_t i = 0; i < fwd.shared_h.size(); ++i) {
        const double h = to_float(fwd.shared_h[i]);
        in.shared_clamped[i] = long(i % Is2) < Is2 / 2 ? h > limit : beyond(h, limit);
      }
    }
  }
  return in;
}

std::vector<double> oracle_logits(const OracleInputs& in) {
  const LayerConfig& c = in.config;
  std::vector<double> logits(at(c.tokens(), c.experts));
  View(logits.data(), c.tokens(), c.experts) =
      ConstView(in.x.data(), c.tokens(), c.hidden) * ConstView(in.router.data(), c.experts, c.hidden).transpose();
  return logits;
}

std::vector<double> oracle_router_weights(const LayerConfig& c, const std::vector<double>& logits,
                                          const std::vector<int32_t>& topk_idx) {
  const int k = c.top_k;
  std::vector<double> topk_w(at(c.tokens(), k));
  for (int g = 0; g < c.tokens(); ++g) {
    const std::vector<double> s = scores_of(c, logits.data() + at(g, c.experts));
    const int32_t* idx = topk_idx.data() + at(g, k);
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += s[idx[j]];
    for (int j = 0; j < k; ++j) topk_w[at(g, k) + j] = weight_scale(c) * (c.renormalize ? s[idx[j]] / sum : s[idx[j]]);
  }
  return topk_w;
}

std::vector<double> oracle_y(const OracleInputs& in, const std::vector<double>& topk_w) {
  const LayerConfig& c = in.config;
  const int N = c.tokens(), H = c.hidden, k = c.top_k, Is = c.shared_intermediate;
  const ConstView x(in.x.data(), N, H);
  std::vector<double> y(at(N, H), 0.0);
  View Y(y.data(), N, H);
  const std::vector<ExpertRows> rows = rows_by_expert(c, in.topk_idx);
  for (int e = 0; e < c.experts; ++e) {
    const MlpPass p = mlp_forward(gather(x, rows[e].token), expert_w1(in, e), expert_w2(in, e), c.swiglu_limit,
                                  expert_branches(in, rows[e]));
    for (size_t i = 0; i < rows[e].token.size(); ++i) {
      const int g = rows[e].token[i];
      Y.row(g) += topk_w[at(g, k) + rows[e].slot[i]] * p.out.row(long(i));
    }
  }
  if (c.has_shared())
    Y += mlp_forward(x, ConstView(in.shared_w1.data(), 2 * Is, H), ConstView(in.shared_w2.data(), H, Is),
                     c.swiglu_limit, in.shared_clamped)
             .out;
  return y;
}

OracleResult oracle(const OracleInputs& in) {
  const LayerConfig& c = in.config;
  const int N = c.tokens(), H = c.hidden, I = c.intermediate, E = c.experts, k = c.top_k;
  const int Is = c.shared_intermediate;
  const double limit = c.swiglu_limit;
  const ConstView x(in.x.data(), N, H), dy(in.dy.data(), N, H);
  OracleResult o;
  o.precision = c.precision;
  if (in.routed_by_router()) {
    o.logits = oracle_logits(in);
    o.topk_w = oracle_router_weights(c, o.logits, in.topk_idx);
  } else {
    o.topk_w = in.given_topk_w;
  }
  o.y.assign(at(N, H), 0.0);
  o.dx.assign(at(N, H), 0.0);
  o.d_topk_w.assign(at(N, k), 0.0);
  o.d_topk_w_scale.assign(at(N, k), 0.0);
  o.d_w1.assign(at(E, at(2 * I, H)), 0.0);
  o.d_w2.assign(at(E, at(H, I)), 0.0);
  View Y(o.y.data(), N, H), DX(o.dx.data(), N, H);

  const std::vector<ExpertRows> rows = rows_by_expert(c, in.topk_idx);
  for (int e = 0; e < E; ++e) {
    const long m = long(rows[e].token.size());
    const ConstView w1 = expert_w1(in, e), w2 = expert_w2(in, e);
    const MlpPass p = mlp_forward(gather(x, rows[e].token), w1, w2, limit, expert_branches(in, rows[e]));
    Eigen::VectorXd w(m);
    for (long i = 0; i < m; ++i) w(i) = o.topk_w[at(rows[e].token[i], k) + rows[e].slot[i]];
    const Matrix dy_e = gather(dy, rows[e].token);
    const Matrix g = dy_e * w2;  // [m, I], the gradient reaching a before the routing weight
    const Matrix dh = swiglu_backward(p, w.asDiagonal() * g, limit);
    const Matrix dx_e = dh * w1;
    for (long i = 0; i < m; ++i) {
      const int t = rows[e].token[i];
      Y.row(t) += w(i) * p.out.row(i);
      DX.row(t) += dx_e.row(i);
      const size_t slot = at(t, k) + rows[e].slot[i];
      o.d_topk_w[slot] = g.row(i).dot(p.a.row(i));
      o.d_topk_w_scale[slot] = std::max(std::abs(o.d_topk_w[slot]), g.row(i).cwiseProduct(p.a.row(i)).norm());
    }
    View(o.d_w1.data() + at(e, at(2 * I, H)), 2 * I, H) = dh.transpose() * p.x;
    View(o.d_w2.data() + at(e, at(H, I)), H, I) = (w.asDiagonal() * dy_e).transpose() * p.a;
  }

  if (c.has_shared()) {
    const ConstView w1(in.shared_w1.data(), 2 * Is, H), w2(in.shared_w2.data(), H, Is);
    const MlpPass p = mlp_forward(x, w1, w2, limit, in.shared_clamped);
    const Matrix dh = swiglu_backward(p, dy * w2, limit);
    Y += p.out;
    DX += dh * w1;
    o.d_shared_w1.resize(at(2 * Is, H));
    o.d_shared_w2.resize(at(H, Is));
    View(o.d_shared_w1.data(), 2 * Is, H) = dh.transpose() * x;
    View(o.d_shared_w2.data(), H, Is) = dy.transpose() * p.a;
  }

  if (in.routed_by_router()) {
    o.d_logits.resize(at(N, E));
    o.d_logits_scale.resize(at(N, E));
    for (int g = 0; g < N; ++g)
      router_backward(c, o.logits.data() + at(g, E), in.topk_idx.data() + at(g, k), o.d_topk_w.data() + at(g, k),
                      o.d_topk_w_scale.data() + at(g, k), o.d_logits.data() + at(g, E),
                      o.d_logits_scale.data() + at(g, E));
    const ConstView d_logits(o.d_logits.data(), N, E), router(in.router.data(), E, H);
    o.d_router.resize(at(E, H));
    View(o.d_router.data(), E, H) = d_logits.transpose() * x;
    o.d_router_scale.resize(at(E, H));
    const Matrix spread2 = ConstView(o.d_logits_scale.data(), N, E).cwiseAbs2().transpose() * x.cwiseAbs2();
    View(o.d_router_scale.data(), E, H) = View(o.d_router.data(), E, H).cwiseAbs().cwiseMax(spread2.cwiseSqrt());
    DX += d_logits * router;
  }
  return o;
}

const char* to_string(OracleTensor t) { return kTensorNames[int(t)]; }

TensorError tensor_error(const std::vector<float>& out, const std::vector<double>& ref,
                         const std::vector<double>& scale) {
  return error_of(out, ref, scale, [](float v) { return double(v); });
}

TensorError tensor_error(const std::vector<bf16>& out, const std::vector<double>& ref,
                         const std::vector<double>& scale) {
  return error_of(out, ref, scale, [](bf16 v) { return double(to_float(v)); });
}

std::vector<OracleCheck> compare_with_oracle(const Forward& fwd, const Gradients& grad, const OracleResult& o) {
  std::vector<OracleCheck> checks;
  const auto add = [&](OracleTensor t, const auto& out, const std::vector<double>& ref,
                       const std::vector<double>& scale = {}) {
    if (!ref.empty()) checks.push_back(OracleCheck{t, tensor_error(out, ref, scale), oracle_bound(t, o.precision)});
  };
  add(OracleTensor::logits, fwd.logits, o.logits);
  add(OracleTensor::topk_w, fwd.routing.topk_w, o.topk_w);
  add(OracleTensor::y, fwd.y, o.y);
  add(OracleTensor::dx, grad.dx, o.dx);
  add(OracleTensor::d_topk_w, grad.d_topk_w, o.d_topk_w, o.d_topk_w_scale);
  add(OracleTensor::d_logits, grad.d_logits, o.d_logits, o.d_logits_scale);
  add(OracleTensor::d_router, grad.d_router, o.d_router, o.d_router_scale);
  add(OracleTensor::d_w1, grad.d_w1, o.d_w1);
  add(OracleTensor::d_w2, grad.d_w2, o.d_w2);
  add(OracleTensor::d_shared_w1, grad.d_shared_w1, o.d_shared_w1);
  add(OracleTensor::d_shared_w2, grad.d_shared_w2, o.d_shared_w2);
  return checks;
}

}  // namespace mok::ref
