// Host-side input checks shared by the reference and the megakernel's host API: every bad shape or
// value is a mok::Error naming the tensor and the problem, before any work starts.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <span>
#include <sstream>
#include <string>

#include "mok/core/config.h"
#include "mok/core/dispatch_layout.h"
#include "mok/core/kstep.h"
#include "mok/core/layer_io.h"

namespace mok {

// A shape for messages: "[2, 64]".
inline std::string shape_text(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

inline bool all_finite(const std::vector<bf16>& v) {
  return std::all_of(v.begin(), v.end(), [](bf16 b) { return is_finite(b); });
}

inline bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float f) { return is_finite(f); });
}

// A receive ring of `rows` rows per rank, in whole units of `granularity` rows: K-steps for the
// reference (its chains run per ring chunk), 128-row tiles for the GPU. The problem's text ("" for
// none), for a caller that names where the number came from.
inline std::string ring_rows_problem(int rows, int granularity = kStepK) {
  if (rows > 0 && rows % granularity == 0) return "";
  return "ring_rows = " + std::to_string(rows) + " is not a positive multiple of " + std::to_string(granularity);
}
inline void validate_ring_rows(int rows, int granularity = kStepK) {
  const std::string problem = ring_rows_problem(rows, granularity);
  require(problem.empty(), problem);
}

template <class V>
void require_size(const V& v, size_t want, const char* name) {
  require(v.size() == want,
          std::string(name) + " has " + std::to_string(v.size()) + " elements, expected " + std::to_string(want));
}

// x or dy: [N, H], finite.
inline void validate_tokens(const LayerConfig& c, const std::vector<bf16>& v, const char* name) {
  require_size(v, size_t(c.tokens()) * c.hidden, name);
  require(all_finite(v), std::string(name) + " holds NaN or Inf");
}

// The bias moves sigmoid mode's selection key alone (routing.h, router_select): one given in softmax
// mode would change nothing, so it is refused rather than ignored. By presence: the Python op cannot
// read a GPU tensor's values without a host synchronisation.
inline void validate_expert_bias_given(const LayerConfig& c, bool given) {
  require(!given || c.score_mode == ScoreMode::sigmoid,
          "expert_bias is given, but the config's score_mode is softmax: only sigmoid mode adds the bias to the "
          "selection key (pass no expert_bias)");
}

inline void validate_weights(const LayerConfig& c, const LayerWeights& w) {
  const size_t H = c.hidden, I = c.intermediate, E = c.experts, Is = c.shared_intermediate;
  require_size(w.router, E * H, "router weight [E, H]");
  if (!w.expert_bias.empty()) require_size(w.expert_bias, E, "expert_bias [E]");
  require_size(w.w1, E * 2 * I * H, "w1 [E, 2I, H]");
  require_size(w.w2, E * H * I, "w2 [E, H, I]");
  require_size(w.shared_w1, 2 * Is * H, "shared_w1 [2Is, H]");
  require_size(w.shared_w2, H * Is, "shared_w2 [H, Is]");
  require(all_finite(w.router), "router weight holds NaN or Inf");
  require(all_finite(w.expert_bias), "expert_bias holds NaN or Inf");
  require(all_finite(w.w1) && all_finite(w.w2), "expert weights hold NaN or Inf");
  require(all_finite(w.shared_w1) && all_finite(w.shared_w2), "shared expert weights hold NaN or Inf");
  // Last: a bad bias's size or values get their own messages in either mode.
  validate_expert_bias_given(c, !w.expert_bias.empty());
}

// A given (replayed) routing, or `whose` else: ids in [0, E), no expert twice for one token, finite
// weights (unless only the ids are replayed).
inline void validate_routing(const LayerConfig& c, const Routing& r, bool ids_only = false,
                             const std::string& whose = "given") {
  const int N = c.tokens(), k = c.top_k, E = c.experts;
  require_size(r.topk_idx, size_t(N) * k, (whose + " topk_idx [N, k]").c_str());
  if (!ids_only) {
    require_size(r.topk_w, size_t(N) * k, (whose + " topk_w [N, k]").c_str());
    require(all_finite(r.topk_w), whose + " topk_w holds NaN or Inf");
  }
  for (int g = 0; g < N; ++g)
    for (int j = 0; j < k; ++j) {
      const int32_t e = r.topk_idx[size_t(g) * k + j];
      require(e >= 0 && e < E, "topk_idx[" + std::to_string(g) + ", " + std::to_string(j) + "] = " + std::to_string(e) +
                                   " is outside [0, " + std::to_string(E) + ")");
      for (int i = 0; i < j; ++i)
        require(r.topk_idx[size_t(g) * k + i] != e,
                "token " + std::to_string(g) + " is routed to expert " + std::to_string(e) + " twice");
    }
}

inline void validate_inputs(const LayerConfig& c, const std::vector<bf16>& x, const LayerWeights& w,
                            const Routing* given, bool ids_only = false, const std::string& whose = "given") {
  validate(c);
  validate_tokens(c, x, "x [N, H]");
  validate_weights(c, w);
  if (given) validate_routing(c, *given, ids_only, whose);
}

// This machine's physical memory in bytes (sysconf), or 0 where the system does not say.
inline double physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? double(pages) * double(page) : 0.0;
}

// The smallest memory limit of a process's cgroups and their ancestors (v2: memory.max, v1: the memory
// controller's memory.limit_in_bytes) in bytes, or 0 where none is set: `groups` is /proc/self/cgroup's
// text, `root` the directory the cgroup file systems are mounted under. A container's or a batch job's
// limit is below the machine's memory, and its OOM killer ended a problem too large for it without a
// word (exit 137). The group's path is tried up to the mount's root: in a container it may be the host's.
inline double cgroup_memory_limit_bytes(const std::string& groups, const std::string& root = "/sys/fs/cgroup") {
  double limit = 0.0;
  std::istringstream lines(groups);
  for (std::string line; std::getline(lines, line);) {
    const size_t a = line.find(':'), b = line.find(':', a == std::string::npos ? a : a + 1);
    if (b == std::string::npos) continue;
    std::string controllers(1, ',');  // appended, not "," + ...: GCC 12 warns (-Wrestrict) on that form
    controllers += line.substr(a + 1, b - a - 1) + ",";
    const bool v2 = line.compare(0, a, "0") == 0 && controllers == ",,",
               v1 = controllers.find(",memory,") != std::string::npos;
    if (!v2 && !v1) continue;
    const std::string mount = root + (v2 ? "" : "/memory"), file = v2 ? "/memory.max" : "/memory.limit_in_bytes";
    for (std::string path = line.substr(b + 1);; path.erase(path.rfind('/'))) {
      std::ifstream in(mount + path + file);
      double bytes = 0.0;  // v2's "max" reads as no number: no limit
      if (in >> bytes && bytes > 0.0 && (limit == 0.0 || bytes < limit)) limit = bytes;
      if (path.rfind('/') == std::string::npos) break;
    }
  }
  return limit;
}

// The memory this process may take: the machine's, or its cgroups' limit where that is smaller (0: unknown).
inline double memory_limit_bytes() {
  std::ifstream in("/proc/self/cgroup");
  const std::string groups((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const double machine = physical_memory_bytes(), group = cgroup_memory_limit_bytes(groups);
  return group > 0.0 && (machine <= 0.0 || group < machine) ? group : machine;
}

// "12.5 GiB"
inline std::string gib_text(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", bytes / double(1ull << 30));
  return text;
}

// Refuses, before anything is allocated, a problem for which the caller would hold more than `limit` bytes
// (default: the memory this process may take): `copies` times its tensors (problem_bytes), the most the
// caller holds at once as measured (its working copies, the fp64 oracle's, a file's image). The host-side
// tools would otherwise allocate until the system kills them, with no message.
inline void require_fits_in_memory(const LayerConfig& c, double copies, double limit = memory_limit_bytes()) {
  const double tensors = problem_bytes(c), need = copies * tensors;
  char times[32];
  std::snprintf(times, sizeof times, "%g", copies);
  require(limit <= 0 || need <= limit,
          "this problem (R = " + std::to_string(c.ranks) + ", T = " + std::to_string(c.tokens_per_rank) +
              ", E = " + std::to_string(c.experts) + ", H = " + std::to_string(c.hidden) +
              ", I = " + std::to_string(c.intermediate) + ") needs " + gib_text(need) + " of host memory here (" +
              times + " times its tensors' " + gib_text(tensors) + "), more than the " + gib_text(limit) +
              " this process may take (the machine's memory, or its cgroup's limit)");
}

// The layout's tables for N tokens of k slots: sizes, offsets from 0 rising to N k by at most N an
// expert (dispatch_layout.h), counts their steps.
inline bool layout_tables_hold(const DispatchLayout& l, size_t tokens, int k) {
  const size_t E = l.counts.size(), rows = tokens * size_t(k);
  if (l.row_source.size() != rows || l.slot_row.size() != rows || l.offsets.size() != E + 1 ||
      !offsets_span(int(E), int32_t(rows), l.offsets.data()))
    return false;
  for (size_t e = 0; e < E; ++e)
    if (!offsets_step_at(int(e), int32_t(tokens), l.offsets.data()) || l.counts[e] != l.offsets[e + 1] - l.offsets[e])
      return false;
  return true;
}

// The first token whose slots a layout (its tables holding) places otherwise than the routing does, by
// the checks the GPU's backward makes too (slot_is_laid_out); -1 where the layout is the routing's, the
// one a forward makes of it. A layout of another forward, beside this forward's routing, would give
// gradients of neither: its first such token is the first the two routings differ at.
inline long first_token_laid_out_otherwise(const DispatchLayout& l, const std::vector<int32_t>& topk_idx, int k) {
  const int E = int(l.counts.size());
  for (size_t s = 0; s < topk_idx.size(); ++s)
    if (!slot_is_laid_out(int32_t(s), topk_idx[s], E, l.offsets.data(), l.row_source.data(), l.slot_row.data()))
      return long(s) / k;
  return -1;
}

// What is wrong with a saved buffer whose layout is not the routing's (the host's error, and the GPU
// backward's; `where`: " on GPU g" across GPUs).
inline std::string saved_of_another_routing(long token, const std::string& where = "") {
  return "saved" + where + " is not this topk_idx's: its dispatch layout routes token " + std::to_string(token) +
         " otherwise (pass the saved output of the forward that returned topk_idx)";
}

// The backward's inputs: the forward's inputs again, a Forward made for this config (with its saved
// activations, the shared expert's too, unless the backward recomputes them), and dy.
inline void validate_backward_inputs(const LayerConfig& c, const std::vector<bf16>& x, const LayerWeights& w,
                                     const Forward& fwd, const std::vector<bf16>& dy, bool recompute) {
  validate_inputs(c, x, w, &fwd.routing, false, "the forward's");
  const size_t N = c.tokens(), k = c.top_k, E = c.experts, Is = c.shared_intermediate;
  require(fwd.layout.counts.size() == E && (fwd.logits.empty() || fwd.logits.size() == N * E),
          "the forward's outputs do not match the config: pass the Forward made for these inputs");
  // The forward refuses a logit that overflows, so a NaN or Inf here is not its logits (the router's
  // backward would turn it into NaN gradients without a word).
  require(all_finite(fwd.logits), "the forward's logits hold NaN or Inf: pass the Forward made for these inputs");
  require(layout_tables_hold(fwd.layout, N, int(k)),
          "the forward's dispatch layout is no layout of this config: pass the Forward made for these inputs");
  const long token = first_token_laid_out_otherwise(fwd.layout, fwd.routing.topk_idx, int(k));
  require(token < 0, [&] { return saved_of_another_routing(token); });
  validate_tokens(c, dy, "dy [N, H]");
  require(recompute || (fwd.h.size() == N * k * 2 * size_t(c.intermediate) && fwd.shared_h.size() == N * 2 * Is &&
                        fwd.shared_a.size() == N * Is),
          "forward saved no activations: use recompute");
}

}  // namespace mok
