// The FP8 mode's weight quantization on the GPU (megakernel/src/quantize_fp8.h) against the core's
// quantize_block on the host, byte for byte: q from W's 128 x 128 blocks, q_t from the blocks of W^T
// transposed on the host (so also the claim that W^T's blocks have W's scales and codes), and every
// block's scale exponent. Blocks of very different magnitudes side by side: normal ones from 2^-100 to
// bf16's largest, all-zero and all-signed-zero blocks, blocks whose largest magnitude is below 2^-118
// (bf16 subnormals, the exponent stopping at -126), blocks of exact E4M3 ties (normal and subnormal,
// both parities), negative zeros everywhere, and blocks holding Inf or NaN. Outputs are poisoned (0xff)
// before each run. ctest label gpu; the GPU tests skip without a Hopper GPU, the argument checks need
// none.
#include "quantize_fp8.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "mok/core/config.h"
#include "mok/core/fp8_gemm.h"
#include "mok/megakernel/device_tensor.h"
#include "mok/megakernel/layer.h"

namespace mok::gpu {
namespace {

constexpr int kB = kFp8Block;

// What a block holds.
enum class Kind {
  spread,            // random signs, magnitudes log-uniform over 14 binades below 2^top
  zero,              // +0 only
  signed_zero,       // +0 and -0
  tiny,              // largest magnitude below 2^-118, bf16 subnormals included
  ties,              // 448 2^e and exact midpoints between neighbouring E4M3 values, times 2^e
  inf,               // a spread block with +Inf and -Inf
  nan,               // a spread block with NaNs of both signs
  outlier,           // a spread block with one value 2^6 times its largest, positive
  negative_outlier,  // the same, negative
};

bf16 bf16_exact(float f) {
  const bf16 v{uint16_t(bits_of(f) >> 16)};
  if (to_float(v) != f) throw InternalError("not a bf16 value");
  return v;
}

struct Weights {
  int matrices, rows, cols;
  std::vector<bf16> w;
  std::vector<int> exponent;  // per block: the scale exponent its kind was built for, or INT32_MIN

  Weights(int m, int r, int c) : matrices(m), rows(r), cols(c), w(size_t(m) * r * c) {}
  size_t blocks() const { return size_t(matrices) * (rows / kB) * (cols / kB); }
  bf16& at(size_t block, int r, int c) {
    const size_t across = cols / kB, down = rows / kB, m = block / (across * down);
    const size_t br = block / across % down, bc = block % across;
    return w[m * rows * cols + (br * kB + r) * cols + bc * kB + c];
  }
};

// Fills block `b` with a block of `kind`; `top`: the binade of a spread block's largest values.
void fill_block(Weights& W, size_t b, Kind kind, int top, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const auto coin = [&](double p) { return unit(rng) < p; };
  for (int r = 0; r < kB; ++r)
    for (int c = 0; c < kB; ++c) {
      uint16_t bits = 0;
      switch (kind) {
        case Kind::zero:
          break;
        case Kind::signed_zero:
          bits = coin(0.5) ? 0x8000 : 0;
          break;
        case Kind::spread:
        case Kind::inf:
        case Kind::nan:
        case Kind::outlier:
        case Kind::negative_outlier: {
          // 2^(top - u), u in [0, 14): the mantissa from the fraction of u, truncated to bf16 bits.
          const double v = std::ldexp(1.0, top) * std::exp2(-14.0 * unit(rng));
          bits = uint16_t(bits_of(float(v)) >> 16);
          break;
        }
        case Kind::tiny:
          // bf16 magnitudes from 1 (2^-133, the smallest subnormal) up to 2^-119 and a bit (0x0440).
          bits = uint16_t(std::uniform_int_distribution<int>(1, 0x0440)(rng));
          break;
        case Kind::ties: {
          // The midpoint between E4M3 codes k and k + 1 (k < 0x7e: both finite), or between 0 and the
          // smallest subnormal; exact in bf16 (E4M3's 3 fraction bits and one more).
          const int k = std::uniform_int_distribution<int>(-1, 0x7d)(rng);
          const float lo = k < 0 ? 0.0f : to_float(fp8_e4m3{uint8_t(k)}), hi = to_float(fp8_e4m3{uint8_t(k + 1)});
          const float mid = k < 0 ? 0x1p-10f : (lo + hi) / 2;
          bits = bf16_exact(std::ldexp(mid, top)).bits;
          break;
        }
      }
      if (kind != Kind::zero && kind != Kind::signed_zero && bits != 0 && coin(0.5)) bits |= 0x8000;
      if (kind != Kind::zero && kind != Kind::signed_zero && coin(0.04)) bits = coin(0.5) ? 0x8000 : 0;  // zeros
      W.at(b, r, c) = bf16{bits};
    }
  // The block's largest magnitude alone, at a place of its own: so it decides the scale.
  if (kind == Kind::outlier) W.at(b, 77, 41) = bf16_exact(std::ldexp(1.3125f, top + 6));
  if (kind == Kind::negative_outlier) W.at(b, 126, 1) = bf16_exact(-std::ldexp(1.875f, top + 6));
  if (kind == Kind::ties) W.at(b, 17, 93) = bf16_exact(std::ldexp(448.0f, top));  // the largest: 448 2^e
  if (kind == Kind::inf) W.at(b, 5, 7) = bf16{0x7f80}, W.at(b, 100, 3) = bf16{0xff80};
  if (kind == Kind::nan) W.at(b, 64, 64) = bf16{0x7fc1}, W.at(b, 3, 127) = bf16{0xffc0};
  // The scale each kind was built for (1.3125 2^k: k - 8; 1.875 2^k: k - 7, past 1.75).
  switch (kind) {
    case Kind::zero:
    case Kind::signed_zero:
      W.exponent[b] = 0;
      break;
    case Kind::tiny:
      W.exponent[b] = -126;
      break;
    case Kind::ties:
      W.exponent[b] = top;
      break;
    case Kind::outlier:
      W.exponent[b] = top + 6 - 8;
      break;
    case Kind::negative_outlier:
      W.exponent[b] = top + 6 - 7;
      break;
    case Kind::inf:
    case Kind::nan:
      W.exponent[b] = 120;
      break;
    case Kind::spread:
      break;
  }
}

// `specials` first, then random kinds and magnitudes, the whole shuffled over the blocks.
Weights make_weights(int matrices, int rows, int cols, std::vector<std::pair<Kind, int>> specials, uint64_t seed,
                     bool non_finite = false) {
  Weights W(matrices, rows, cols);
  W.exponent.assign(W.blocks(), INT32_MIN);
  std::mt19937_64 rng(seed);
  while (specials.size() < W.blocks()) {
    const int pick = std::uniform_int_distribution<int>(0, 9)(rng);
    const int top = std::uniform_int_distribution<int>(-100, 127)(rng);
    if (pick == 0)
      specials.emplace_back(Kind::zero, 0);
    else if (pick == 1)
      specials.emplace_back(Kind::tiny, 0);
    else if (pick == 2)
      specials.emplace_back(Kind::ties, std::uniform_int_distribution<int>(-100, 100)(rng));
    else if (pick == 3)
      specials.emplace_back(rng() % 2 ? Kind::outlier : Kind::negative_outlier, std::min(top, 120));
    else if (pick == 4 && non_finite)
      specials.emplace_back(rng() % 2 ? Kind::inf : Kind::nan, top);
    else
      specials.emplace_back(Kind::spread, top);
  }
  if (specials.size() > W.blocks()) throw InternalError("more special blocks than blocks");
  std::shuffle(specials.begin(), specials.end(), rng);
  for (size_t b = 0; b < W.blocks(); ++b) fill_block(W, b, specials[b].first, specials[b].second, rng);
  return W;
}

struct Quantized {
  std::vector<uint8_t> q, q_t;
  std::vector<int32_t> exps;
};

std::vector<uint8_t> bytes_of(const std::vector<fp8_e4m3>& v) {
  std::vector<uint8_t> b(v.size());
  std::transform(v.begin(), v.end(), b.begin(), [](fp8_e4m3 x) { return x.bits; });
  return b;
}

// The core's quantize_block on each block of W (q, exps) and of W^T transposed on the host (q_t),
// checking that both give each square the same exponent.
Quantized host_quantize(const Weights& W) {
  const int R = W.rows, C = W.cols;
  const size_t size = size_t(R) * C;
  std::vector<fp8_e4m3> q(W.w.size()), q_t(W.w.size());
  std::vector<bf16> wt(W.w.size());
  Quantized out;
  out.exps.resize(W.blocks());
  for (int m = 0; m < W.matrices; ++m) {
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) wt[m * size + size_t(c) * R + r] = W.w[m * size + size_t(r) * C + c];
    for (int br = 0; br < R / kB; ++br)
      for (int bc = 0; bc < C / kB; ++bc) {
        const size_t at = m * size + size_t(br) * kB * C + bc * kB, at_t = m * size + size_t(bc) * kB * R + br * kB;
        const int e = quantize_block(&W.w[at], kB, kB, C, &q[at], C);
        const int e_t = quantize_block(&wt[at_t], kB, kB, R, &q_t[at_t], R);
        EXPECT_EQ(e, e_t) << "matrix " << m << " block " << br << ", " << bc;
        out.exps[(size_t(m) * (R / kB) + br) * (C / kB) + bc] = e;
      }
  }
  out.q = bytes_of(q);
  out.q_t = bytes_of(q_t);
  return out;
}

// "" where equal, else the count of differing elements and the first of them, [matrix, row, col] of a
// [matrices, rows, cols] array (bytes in hex).
template <class T>
std::string first_mismatch(const char* name, const std::vector<T>& got, const std::vector<T>& want, int rows,
                           int cols) {
  if (got.size() != want.size()) return std::string(name) + ": sizes differ";
  size_t differing = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && differing++ == 0) first = i;
  if (!differing) return "";
  std::ostringstream s;
  const size_t size = size_t(rows) * cols;
  s << name << ": " << differing << " elements differ, the first [" << first / size << ", " << first % size / cols
    << ", " << first % cols << "]: got " << std::showbase << (sizeof(T) == 1 ? std::hex : std::dec)
    << int64_t(got[first]) << ", want " << int64_t(want[first]);
  return s.str();
}

class QuantizeFp8 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_available()) GTEST_SKIP() << "no Hopper GPU";
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }

  // Quantizes W on the GPU (on a non-blocking stream, the outputs poisoned first) and compares with
  // the host, byte for byte.
  void check(const Weights& W, bool transposed = true) {
    const int M = W.matrices, R = W.rows, C = W.cols;
    const Quantized want = host_quantize(W);
    DeviceTensor w(DType::bf16, {M, R, C}, W.w), q(DType::u8, {M, R, C}), q_t(DType::u8, {M, C, R}),
        exps(DType::i32, {M, R / kB, C / kB}), exps_t(DType::i32, {M, C / kB, R / kB});
    q.poison();
    q_t.poison();
    exps.poison();
    exps_t.poison();
    quantize_weights_fp8(
        stream_, static_cast<const bf16*>(w.view().data), M, R, C, static_cast<fp8_e4m3*>(q.view().data),
        transposed ? static_cast<fp8_e4m3*>(q_t.view().data) : nullptr, static_cast<int32_t*>(exps.view().data),
        transposed ? static_cast<int32_t*>(exps_t.view().data) : nullptr);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_EQ(first_mismatch("exps", exps.download<int32_t>(), want.exps, R / kB, C / kB), "");
    EXPECT_EQ(first_mismatch("q", q.download<uint8_t>(), want.q, R, C), "");
    if (transposed) {
      EXPECT_EQ(first_mismatch("q_t", q_t.download<uint8_t>(), want.q_t, C, R), "");
      std::vector<int32_t> want_t(want.exps.size());  // each matrix's table transposed
      for (int m = 0; m < M; ++m)
        for (int r = 0; r < R / kB; ++r)
          for (int c = 0; c < C / kB; ++c)
            want_t[(size_t(m) * (C / kB) + c) * (R / kB) + r] = want.exps[(size_t(m) * (R / kB) + r) * (C / kB) + c];
      EXPECT_EQ(first_mismatch("exps_t", exps_t.download<int32_t>(), want_t, C / kB, R / kB), "");
    } else {
      EXPECT_EQ(q_t.download<uint8_t>(), std::vector<uint8_t>(q_t.bytes(), 0xff)) << "q_t is null: untouched";
      EXPECT_EQ(exps_t.download<int32_t>(), std::vector<int32_t>(exps_t.bytes() / 4, -1))
          << "exps_t is null: untouched";
    }
    for (size_t b = 0; b < W.blocks(); ++b) {  // each block is what it was built to be
      if (W.exponent[b] != INT32_MIN) {
        EXPECT_EQ(want.exps[b], W.exponent[b]) << "block " << b;
      }
    }
  }

  cudaStream_t stream_ = nullptr;
};

// Every kind of finite block at least once, several matrices, rows != cols.
TEST_F(QuantizeFp8, EqualsTheHostOnFiniteBlocksOfEveryKind) {
  const Weights W = make_weights(3, 384, 256,
                                 {{Kind::zero, 0},
                                  {Kind::signed_zero, 0},
                                  {Kind::tiny, 0},
                                  {Kind::ties, 0},
                                  {Kind::ties, -60},
                                  {Kind::ties, 37},
                                  {Kind::spread, -100},
                                  {Kind::spread, -20},
                                  {Kind::spread, 0},
                                  {Kind::spread, 8},
                                  {Kind::spread, 60},
                                  {Kind::spread, 127},
                                  {Kind::outlier, -3},
                                  {Kind::negative_outlier, 50}},
                                 20261201);
  check(W);
}

// Many blocks (2 x 4 x 9), each of a random kind and magnitude; cols > rows; and a lone block.
TEST_F(QuantizeFp8, EqualsTheHostOnRandomBlocks) {
  check(make_weights(2, 512, 1152, {}, 7));
  check(make_weights(1, 128, 128, {{Kind::ties, 5}}, 8));  // one block
}

// Without q_t: q and exps alone, q_t's memory untouched.
TEST_F(QuantizeFp8, WithoutTheTransposedCopy) { check(make_weights(2, 256, 384, {}, 9), false); }

// Inf and NaN as quantize_block takes them: an Inf makes e = 120, a NaN stays a NaN.
TEST_F(QuantizeFp8, NonFiniteValuesAsOnTheHost) {
  check(make_weights(2, 256, 384, {{Kind::inf, 3}, {Kind::nan, -4}, {Kind::inf, 127}, {Kind::nan, 120}}, 10, true));
}

// The argument checks come before any CUDA call: no GPU needed.
std::string refusal(const bf16* w, int matrices, int rows, int cols, fp8_e4m3* q, fp8_e4m3* q_t, int32_t* exps) {
  try {
    quantize_weights_fp8(nullptr, w, matrices, rows, cols, q, q_t, exps);
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(QuantizeFp8Arguments, BadArgumentsAreRefused) {
  alignas(16) static unsigned char host[64];  // never read: each call is refused before anything runs
  const auto* w = reinterpret_cast<const bf16*>(host);
  auto* q = reinterpret_cast<fp8_e4m3*>(host + 16);
  auto* q_t = reinterpret_cast<fp8_e4m3*>(host + 32);
  auto* exps = reinterpret_cast<int32_t*>(host + 48);
  const auto expect = [](const std::string& got, const std::string& want) {
    EXPECT_EQ(got, "mok: invalid input: quantize_weights_fp8: " + want);
  };
  expect(refusal(w, 2, 256, 200, q, q_t, exps),
         "cols = 200 is not a positive multiple of 128, the fp8 mode's block size");
  expect(refusal(w, 2, 64, 256, q, q_t, exps),
         "rows = 64 is not a positive multiple of 128, the fp8 mode's block size");
  expect(refusal(w, 2, 0, 256, q, q_t, exps), "rows = 0 is not a positive multiple of 128, the fp8 mode's block size");
  expect(refusal(w, 0, 128, 128, q, q_t, exps), "matrices = 0 (need >= 1)");
  expect(refusal(nullptr, 1, 128, 128, q, q_t, exps), "w is missing");
  expect(refusal(w, 1, 128, 128, nullptr, q_t, exps), "q is missing");
  expect(refusal(w, 1, 128, 128, q, q_t, nullptr), "exps is missing");
  expect(refusal(w, 1, 128, 128, q + 8, q_t, exps), "q is not 16-byte aligned");
  expect(refusal(w, 1, 128, 128, q, q_t + 1, exps), "q_t is not 16-byte aligned");
  expect(refusal(w, 65536, 65536, 65536, q, q_t, exps), "17179869184 blocks of 128 x 128 are more than 2^31 - 1");
}

}  // namespace
}  // namespace mok::gpu
