#include "mok/verify/report.h"

#include <cmath>
#include <cstdio>

#include "mok/golden/locate.h"

namespace mok::verify {
namespace {

std::string printf_string(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string percent(int64_t part, int64_t whole) {
  return printf_string("%.2f%%", whole ? 100.0 * double(part) / double(whole) : 100.0);
}

std::string padded(const std::string& s, size_t width) {
  return s.size() >= width ? s + " " : s + std::string(width - s.size(), ' ');
}

std::string histogram_text(const TensorReport& t) {
  std::string s;
  for (int b = 0; b < kUlpBuckets; ++b)
    if (t.ulp_histogram[b])
      s += (s.empty() ? "" : ", ") + ulp_bucket_label(b) + ": " + std::to_string(t.ulp_histogram[b]);
  return s;
}

// ---- JSON ---------------------------------------------------------------------------------------

// The length of the valid UTF-8 sequence at s[i], or 0 (a stray or truncated byte, an overlong form, a
// surrogate, past U+10FFFF).
size_t utf8_length(const std::string& s, size_t i) {
  const auto at = [&](size_t j) { return j < s.size() ? static_cast<unsigned char>(s[j]) : 0u; };
  const unsigned b = at(i);
  const size_t n = b >= 0xf0 && b <= 0xf4 ? 4 : b >= 0xe0 ? 3 : b >= 0xc2 && b <= 0xdf ? 2 : 0;
  if (n == 0 || b >= 0xf5) return 0;
  for (size_t j = 1; j < n; ++j)
    if ((at(i + j) & 0xc0) != 0x80) return 0;
  const unsigned b1 = at(i + 1);
  if ((b == 0xe0 && b1 < 0xa0) || (b == 0xed && b1 >= 0xa0) || (b == 0xf0 && b1 < 0x90) || (b == 0xf4 && b1 >= 0x90))
    return 0;
  return n;
}

// A JSON string: quotes, backslashes and control bytes escaped, and a byte that is not part of valid
// UTF-8 (a path's, say) as the code point of its value, so the report is always valid JSON text.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
      ++i;
    } else if (c < 0x20 || (c >= 0x80 && utf8_length(s, i) == 0)) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
      out += buf;
      ++i;
    } else {
      const size_t n = c < 0x80 ? 1 : utf8_length(s, i);
      out.append(s, i, n);
      i += n;
    }
  }
  return out + "\"";
}

// JSON has no infinity or NaN: those are written as null.
std::string number(double v) { return std::isfinite(v) ? printf_string("%.17g", v) : "null"; }

std::string tensor_json(const TensorReport& t) {
  std::string s = "{\"name\": " + quoted(t.name) + ", \"group\": " + quoted(golden::to_string(t.group)) +
                  ", \"dtype\": " + quoted(golden::to_string(t.dtype)) + ", \"shape\": [";
  for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  s += "], \"bitwise_equal\": " + std::string(t.bitwise_equal() ? "true" : "false");
  if (!t.absent.empty()) return s + ", \"absent\": " + quoted(t.absent) + "}";
  s += ", \"elements\": " + std::to_string(t.elements) + ", \"equal_elements\": " + std::to_string(t.equal) +
       ", \"equal_fraction\": " + number(t.elements ? double(t.equal) / double(t.elements) : 1.0) +
       ", \"max_abs\": " + number(t.max_abs);
  if (t.dtype != golden::DType::i32) {
    s += ", \"max_ulp\": " + std::to_string(t.max_ulp) + ", \"max_rel\": " + number(t.max_rel) +
         ", \"norm_rel\": " + number(t.norm_rel) + ", \"ulp_histogram\": {";
    bool first = true;
    for (int b = 0; b < kUlpBuckets; ++b)
      if (t.ulp_histogram[b]) {
        s += (first ? "" : ", ") + quoted(ulp_bucket_label(b)) + ": " + std::to_string(t.ulp_histogram[b]);
        first = false;
      }
    s += "}";
  }
  if (t.first_mismatch) {
    const Mismatch& m = *t.first_mismatch;
    s += ", \"first_mismatch\": {\"index\": " + std::to_string(m.index) + ", \"element\": " + quoted(m.element) +
         ", \"location\": " + quoted(m.location) +
         ", \"golden\": " + quoted(golden::describe_bits(t.dtype, m.golden_bits)) +
         ", \"candidate\": " + quoted(golden::describe_bits(t.dtype, m.candidate_bits)) + "}";
  }
  if (t.oracle)
    s += ", \"oracle\": {\"golden_rel_error\": " + number(t.oracle->rel_error) +
         ", \"bound\": " + number(t.oracle->bound) +
         ", \"within_bound\": " + (*t.within_oracle_bound() ? "true" : "false") + "}";
  return s + "}";
}

}  // namespace

std::string format_text(const CaseReport& r) {
  // Names as display_name prints them: a file name's newline must not forge a line of the report.
  std::string s =
      "golden " + display_name(r.golden_file) + " (" + r.golden_name + ") against " + display_name(r.candidate);
  if (r.seconds > 0) s += printf_string(", ran %.2f s", r.seconds);
  s += "\n";
  if (!r.config_note.empty()) s += "  note: " + r.config_note + "\n";
  s += "  " + padded("tensor", 22) + padded("dtype", 6) + padded("bitwise equal", 26) + padded("max ulp", 12) +
       padded("max abs", 11) + padded("max rel", 11) + padded("norm rel", 11) +
       "oracle: golden err + norm rel <= bound\n";
  for (const TensorReport& t : r.tensors) {
    s += "  " + padded(golden::to_string(t.group) + "/" + t.name, 22) + padded(golden::to_string(t.dtype), 6);
    if (!t.absent.empty()) {
      s += "ABSENT: " + t.absent + "\n";
      continue;
    }
    const bool is_float = t.dtype != golden::DType::i32;
    s += padded(std::to_string(t.equal) + "/" + std::to_string(t.elements) + " " + percent(t.equal, t.elements), 26) +
         padded(is_float ? std::to_string(t.max_ulp) : "-", 12) + padded(printf_string("%.3g", t.max_abs), 11) +
         padded(is_float ? printf_string("%.3g", t.max_rel) : "-", 11) +
         padded(is_float ? printf_string("%.3g", t.norm_rel) : "-", 11);
    if (t.oracle)
      s += printf_string("%.3g", t.oracle->rel_error) + " + " + printf_string("%.3g", t.norm_rel) +
           " <= " + printf_string("%.3g", t.oracle->bound) + (*t.within_oracle_bound() ? " yes" : " NO");
    s += "\n";
  }
  for (const TensorReport& t : r.tensors) {
    if (!t.first_mismatch) continue;
    const Mismatch& m = *t.first_mismatch;
    s += "  " + t.name + ": first mismatch " + m.element + " (" + m.location + "): golden " +
         golden::describe_bits(t.dtype, m.golden_bits) + ", candidate " +
         golden::describe_bits(t.dtype, m.candidate_bits) + "\n";
    if (t.dtype != golden::DType::i32) s += "  " + t.name + ": ulp histogram " + histogram_text(t) + "\n";
  }
  const bool forward_only = !r.backward_skipped.empty();
  if (forward_only) {
    s += "  backward skipped: " + r.backward_skipped + "\n  not compared:";
    for (size_t i = 0; i < r.skipped_tensors.size(); ++i) s += (i ? ", " : " ") + r.skipped_tensors[i];
    s += "\n";
  }
  const int differing = r.differing_tensors();
  s += (differing ? "MISMATCH " : "EQUAL    ") + r.golden_name + ": " +
       (differing ? std::to_string(differing) + " of " + std::to_string(r.tensors.size()) + " tensors differ"
                  : "all " + std::to_string(r.tensors.size()) + " tensors bitwise equal") +
       (forward_only ? " (forward only: backward skipped, " + std::to_string(r.skipped_tensors.size()) +
                           " gradient tensors not compared)"
                     : "") +
       "\n";
  return s;
}

std::string format_json(const std::vector<CaseReport>& cases, const std::vector<std::string>& errors,
                        const std::vector<std::string>& skipped) {
  bool all_equal = errors.empty() && !cases.empty();  // nothing compared is not all equal
  for (const CaseReport& c : cases) all_equal = all_equal && c.equal();
  const auto list = [](const std::vector<std::string>& items) {
    std::string l;
    for (size_t i = 0; i < items.size(); ++i) l += (i ? ", " : "") + quoted(items[i]);
    return l;
  };
  std::string s = "{\n  \"tool\": \"mok-verify\",\n  \"all_equal\": " + std::string(all_equal ? "true" : "false") +
                  ",\n  \"errors\": [" + list(errors) + "],\n  \"skipped\": [" + list(skipped) + "],\n  \"cases\": [";
  for (size_t i = 0; i < cases.size(); ++i) {
    const CaseReport& c = cases[i];
    s += std::string(i ? "," : "") + "\n    {\"golden\": " + quoted(c.golden_file) +
         ", \"name\": " + quoted(c.golden_name) + ", \"candidate\": " + quoted(c.candidate) +
         ", \"config_note\": " + quoted(c.config_note) + ", \"seconds\": " + number(c.seconds) +
         ", \"equal\": " + (c.equal() ? "true" : "false") +
         ", \"differing_tensors\": " + std::to_string(c.differing_tensors()) +
         ", \"backward_skipped\": " + (c.backward_skipped.empty() ? "null" : quoted(c.backward_skipped)) +
         ", \"skipped_tensors\": [" + list(c.skipped_tensors) + "],\n     \"tensors\": [";
    for (size_t j = 0; j < c.tensors.size(); ++j)
      s += std::string(j ? "," : "") + "\n       " + tensor_json(c.tensors[j]);
    s += "]}";
  }
  return s + "]\n}\n";
}

}  // namespace mok::verify
