// The layer's configuration: a plain struct that travels to the device as it is.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "mok/core/host_device.h"

namespace mok {

// Any bad input (shape, value, file) is reported as this, with a message naming the problem.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An error's text without its leading "mok: ", for wrapping it in more context.
inline std::string reason_of(const std::exception& e) {
  const std::string what = e.what();
  return what.rfind("mok: ", 0) == 0 ? what.substr(5) : what;
}

enum class ScoreMode : uint8_t { softmax = 0, sigmoid = 1 };

// The arithmetic of the expert GEMMs of the forward and of the input gradients (docs/numerics.md):
// bf16 operands, or (fp8) operands quantized to E4M3 in blocks with power-of-two scales (DeepSeek-V3's
// recipe; issue 19). Router, SwiGLU, combine and the weight gradients are the same in both.
enum class Precision : uint8_t { bf16 = 0, fp8 = 1 };

inline constexpr int kMaxExperts = 512;    // E's bound (the GPU router's scratch in shared memory fits it)
inline constexpr int kShapeMultiple = 64;  // H, I and the shared expert's I are multiples of this
inline constexpr int kFp8Block = 128;      // the FP8 mode's scale blocks: 1 x 128 activations, 128 x 128 weights

struct LayerConfig {
  int32_t ranks = 1;            // R, simulated or real expert-parallel ranks
  int32_t tokens_per_rank = 1;  // T
  int32_t experts = 1;          // E, E / R on each rank
  int32_t hidden = 64;          // H
  int32_t intermediate = 64;    // I
  int32_t top_k = 1;            // k
  ScoreMode score_mode = ScoreMode::softmax;
  bool renormalize = true;          // divide the selected weights by their sum
  int32_t n_group = 1;              // sigmoid mode: expert groups (DeepSeek-V3 n_group)
  int32_t topk_group = 1;           // sigmoid mode: groups kept (DeepSeek-V3 topk_group)
  float routed_scale = 1.0f;        // sigmoid mode: weights times this
  float swiglu_limit = 0.0f;        // > 0: gate clamped above, up clamped to [-limit, limit]
  int32_t shared_intermediate = 0;  // > 0: a shared SwiGLU expert of this intermediate size
  Precision precision = Precision::bf16;

  MOK_HD int tokens() const { return ranks * tokens_per_rank; }
  MOK_HD int experts_per_rank() const { return experts / ranks; }
  MOK_HD int expert_rank(int e) const { return e / experts_per_rank(); }
  MOK_HD int token_rank(int g) const { return g / tokens_per_rank; }
  MOK_HD int routed_rows() const { return tokens() * top_k; }
  MOK_HD bool has_shared() const { return shared_intermediate > 0; }
};

// A config from its shapes, everything else at its default.
inline LayerConfig make_config(int ranks, int tokens_per_rank, int hidden, int intermediate, int experts, int top_k) {
  LayerConfig c;
  c.ranks = ranks;
  c.tokens_per_rank = tokens_per_rank;
  c.hidden = hidden;
  c.intermediate = intermediate;
  c.experts = experts;
  c.top_k = top_k;
  return c;
}

inline void require(bool ok, const std::string& what) {
  if (!ok) throw Error("mok: invalid input: " + what);
}

// The same, the message built by `what()` only on failure: for the checks every call of a hot path
// makes (config validation, the op's argument checks), where building each message costs more than
// the check.
template <class Message>
requires std::is_invocable_r_v<std::string, Message>
void require(bool ok, Message&& what) {
  if (!ok) throw Error("mok: invalid input: " + std::string(what()));
}

// A broken invariant of mok itself, never the caller's input: a bug to report. Not a mok::Error, so
// that nothing mistakes it for a rejected input.
struct InternalError : std::logic_error {
  using std::logic_error::logic_error;
};

[[noreturn]] inline void fail_internal(const std::string& what) { throw InternalError("mok: internal error: " + what); }

inline bool printable_ascii(unsigned char ch) { return ch >= 0x20 && ch < 0x7f; }

// One byte as the escape sequence \xNN.
inline std::string hex_escape(unsigned char ch) {
  constexpr char kHex[] = "0123456789abcdef";
  return {'\\', 'x', kHex[ch >> 4], kHex[ch & 15]};
}

// Text with each byte outside printable ASCII written as \xNN (newlines kept where `keep_newlines`):
// binary junk from a file or an argument must not reach the terminal raw.
inline std::string escape_bytes(const std::string& text, bool keep_newlines = false) {
  std::string out;
  for (const unsigned char ch : text) {
    if (printable_ascii(ch) || (keep_newlines && ch == '\n'))
      out += char(ch);
    else
      out += hex_escape(ch);
  }
  return out;
}

// The whole of text as a number of type T, strictly: no sign on unsigned types, no '+', no spaces, no
// trailing text, in T's range (atoi and stoull took "2x" as 2 and "-1" as 2^64 - 1). Every tool's and
// file reader's parse of a number.
template <class T>
bool parse_whole_number(std::string_view text, T& out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

// Input text as an error message echoes it: quoted, escaped. A quote or backslash in it is escaped too,
// so that the quoted text ends where it seems to and \xNN always means an escaped byte. Past `most` bytes
// it is cut, the cut said (a 100 MB line of a case file made a 420 MB message).
inline constexpr size_t kQuotedBytes = 200;
inline std::string quote_input(const std::string& text, size_t most = kQuotedBytes) {
  std::string quoted(1, '\'');  // appended, not "'" + ...: GCC 12 warns (-Wrestrict) on that form
  for (size_t i = 0; i < text.size() && i < most; ++i) {
    const unsigned char ch = text[i];
    if (ch == '\'' || ch == '\\') quoted += '\\';
    if (printable_ascii(ch))
      quoted += char(ch);
    else
      quoted += hex_escape(ch);
  }
  quoted += '\'';
  if (text.size() > most)
    quoted += " (its first " + std::to_string(most) + " of " + std::to_string(text.size()) + " bytes)";
  return quoted;
}

// A name (a file's above all) as a tool's output prints it: as it is when it is plain printable ASCII,
// otherwise as quote_input quotes it. A newline, control byte or quote in a file name can then neither
// forge a line of the output nor end a quoted part of it early, while ordinary names read as before.
inline std::string display_name(const std::string& name) {
  bool plain = !name.empty();
  for (const unsigned char ch : name) plain = plain && printable_ascii(ch) && ch != '\'' && ch != '"' && ch != '\\';
  return plain ? name : quote_input(name, name.size());  // a name whole, however long
}

// Products the code indexes with int (token ids g * k + j, logits g * E + e, 2I rows of W1, router
// rows e * H) must fit in int32; computed in 64 bits, so that the check itself cannot overflow.
inline constexpr int64_t kMaxIndex = std::numeric_limits<int32_t>::max();

inline void require_int_index(int64_t value, const char* what) {
  require(value <= kMaxIndex, [&] {
    return std::string(what) + " = " + std::to_string(value) +
           " is more than 2^31 - 1: too large for mok's 32-bit indices";
  });
}

// Why a finite number cannot be a float32 config value (routed_scale, swiglu_limit), or "": out of range, or
// so small that it rounds to 0 or to a subnormal (a limit of 1e-50 would silently switch the clamp off).
// The case files' and the ops' readers of the float fields (a double each) both ask it.
inline std::string float32_problem(double d) {
  const float f = float(d);
  if (std::isfinite(d) && !std::isfinite(f)) return "is out of the float32 range";
  if (d != 0 && std::fabs(f) < std::numeric_limits<float>::min()) return "rounds to 0 or to a subnormal in float32";
  return "";
}

// 0 (off), or a positive normal float: a subnormal limit is a typo, not a clamp.
inline bool valid_swiglu_limit(float limit) {
  return limit == 0.0f || (limit >= std::numeric_limits<float>::min() && limit <= std::numeric_limits<float>::max());
}

// The bytes of a problem's tensors on the host: its inputs (x, dy, router, W1, W2, shared weights), the
// forward's results and saved activations (routing, logits, the k slots per token, h) and the
// gradients (fp32 weight gradients). A lower bound of what the reference, a golden or a fuzz case holds
// at once. In double: with every dimension below 2^31 the products can pass 2^64.
inline double problem_bytes(const LayerConfig& c) {
  const double N = double(c.ranks) * c.tokens_per_rank, k = c.top_k, E = c.experts, H = c.hidden, I = c.intermediate,
               Is = c.shared_intermediate;
  const double expert_weights = E * 3 * I * H + 3 * Is * H;               // W1 [E, 2I, H], W2 [E, H, I], shared
  const double inputs = 2 * N * H * 2 + E * H * 4 + expert_weights * 2;   // bf16 x, dy, weights; fp32 router
  const double forward = N * k * (4 + 4 + 2 * 4) + N * E * 4 + N * H * 2  // routing, layout, logits, y
                         + N * k * (H + 2 * I) * 2 + N * 2 * Is * 2;      // slots, h, shared h
  const double gradients = N * H * 2 + N * (k + E) * 4 + E * H * 4 + expert_weights * 4;
  return inputs + forward + gradients;
}

// The most bytes a problem's tensors may need (problem_bytes): 1 PiB, more than any machine holds, and
// far below 2^63: every buffer mok sizes in size_t (the saved buffer, a GPU's workspace, window and
// quantized weights) is at most a few hundred times it (a rank's ring is sized for all of N min(k, E/R)
// rows), so none wraps 64 bits nor passes torch's int64 sizes. Within the int32 limits above it could:
// I = Is = 2^30 - 64 on 2^31 - 1 tokens (H = 448, E = k = 1) needs a saved buffer of 2.3e19 bytes, which wrapped.
inline constexpr double kMaxProblemBytes = double(int64_t(1) << 50);

inline void validate(const LayerConfig& c) {
  const auto n = [](const char* name, long v) { return std::string(name) + " = " + std::to_string(v); };
  require(c.ranks >= 1, [&] { return n("ranks R", c.ranks) + " (need R >= 1)"; });
  require(c.tokens_per_rank >= 1, [&] { return n("tokens per rank T", c.tokens_per_rank) + " (need T >= 1)"; });
  require(c.experts >= 1 && c.experts <= kMaxExperts,
          [&] { return n("experts E", c.experts) + " (need 1 <= E <= " + std::to_string(kMaxExperts) + ")"; });
  require(c.experts % c.ranks == 0,
          [&] { return n("experts E", c.experts) + " is not a multiple of " + n("ranks R", c.ranks); });
  require(c.top_k >= 1 && c.top_k <= c.experts,
          [&] { return n("top_k k", c.top_k) + " (need 1 <= k <= E = " + std::to_string(c.experts) + ")"; });
  require(c.hidden > 0 && c.hidden % kShapeMultiple == 0,
          [&] { return n("hidden H", c.hidden) + " (need a positive multiple of 64)"; });
  require(c.intermediate > 0 && c.intermediate % kShapeMultiple == 0,
          [&] { return n("intermediate I", c.intermediate) + " (need a positive multiple of 64)"; });
  require(c.shared_intermediate >= 0 && c.shared_intermediate % kShapeMultiple == 0,
          [&] { return n("shared_intermediate", c.shared_intermediate) + " (need 0 or a multiple of 64)"; });
  if (c.precision == Precision::fp8)  // every scale block whole: H, I and Is are the GEMMs' K and N
    for (const auto& [name, v] : {std::pair<const char*, int>{"hidden H", c.hidden},
                                  {"intermediate I", c.intermediate},
                                  {"shared_intermediate", c.shared_intermediate}})
      require(v % kFp8Block == 0, [&] { return n(name, v) + " is not a multiple of 128, the fp8 mode's block size"; });
  require(c.score_mode == ScoreMode::softmax || c.score_mode == ScoreMode::sigmoid,
          [&] { return n("score_mode", long(c.score_mode)) + " (need 0 = softmax or 1 = sigmoid)"; });
  require(c.precision == Precision::bf16 || c.precision == Precision::fp8,
          [&] { return n("precision", long(c.precision)) + " (need 0 = bf16 or 1 = fp8)"; });
  require(valid_swiglu_limit(c.swiglu_limit),
          [&] { return "swiglu_limit must be 0 (off) or a positive, finite, normal float32 (at least 2^-126)"; });
  require(c.routed_scale > 0.0f && c.routed_scale <= std::numeric_limits<float>::max(),
          [&] { return "routed_scale must be positive and finite"; });
  const int64_t N = int64_t(c.ranks) * c.tokens_per_rank;  // before anything calls tokens()
  require_int_index(N, "tokens N = R * T");
  require_int_index(N * c.top_k, "routed rows N * k");
  require_int_index(N * c.experts, "logits N * E");
  require_int_index(2 * int64_t(c.intermediate), "W1 rows per expert 2 * I");
  require_int_index(2 * int64_t(c.shared_intermediate), "shared W1 rows 2 * Is");
  require_int_index(int64_t(c.experts) * c.hidden, "router elements E * H");
  require(N * c.hidden < (int64_t(1) << 40), [&] { return "problem too large: N * H >= 2^40"; });
  require(problem_bytes(c) <= kMaxProblemBytes, [&] {
    char bytes[32];
    std::snprintf(bytes, sizeof bytes, "%.3g", problem_bytes(c));
    return std::string("problem too large: its tensors need ") + bytes +
           " bytes, more than 2^50 (1 PiB; mok sizes its buffers in 64 bits)";
  });
  if (c.score_mode == ScoreMode::sigmoid) {
    require(c.n_group >= 1 && c.experts % c.n_group == 0,
            [&] { return n("n_group", c.n_group) + " must divide " + n("E", c.experts); });
    require(c.topk_group >= 1 && c.topk_group <= c.n_group,
            [&] { return n("topk_group", c.topk_group) + " (need 1 <= topk_group <= n_group)"; });
    require(c.top_k <= c.topk_group * (c.experts / c.n_group),
            [&] { return n("top_k", c.top_k) + " exceeds the experts in the kept groups"; });
  } else {  // softmax mode has no groups and no scale: one given there was ignored without a word
    for (const auto& [name, v] : {std::pair<const char*, int>{"n_group", c.n_group}, {"topk_group", c.topk_group}})
      require(v == 1, [&] { return n(name, v) + " is sigmoid mode's (softmax mode takes 1)"; });
    require(c.routed_scale == 1.0f, [&] { return "routed_scale is sigmoid mode's (softmax mode takes 1)"; });
  }
}

}  // namespace mok
