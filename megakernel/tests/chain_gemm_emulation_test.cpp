// chain_gemm.cuh run on the host, a block's threads as std::threads (block_emulation/tile_gemm.cuh): every
// output is fma_chain's bits for its terms and is written once, over partial tiles and chunks, ±0 terms,
// no terms, each operand order, both finishes (an output at a time, and the tile stashed in the stages for
// the block to read, as combine_dx does), and blocks taking several tiles each. No GPU needed; the GPU's
// memory model and the TMA around the phases are the GPU tests' to check.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <type_traits>
#include <vector>

#include "chain_gemm.cuh"  // the build's copy, beside the stand-in for tile_gemm.cuh
#include "mok/core/fma_chain.h"

namespace mok::gpu {
namespace {

// A term as fma_chain takes it, from an operand's element.
float term_value(float v) { return v; }
float term_value(bf16 v) { return to_float(v); }

struct Shape {
  long M, N, K;
  int blocks;
};

enum class Finish { each_output, stashed_tile };

// A term of the chain over [0, K): random, a seventh of them ±0; or +0 but for the last, ±1e-30, whose
// product with the other operand's underflows: the chain ends at -0 for half the outputs, which an fma
// of the zero padding after it (a partial chunk's) would turn to +0.
using Term = float (*)(long k, long K, std::mt19937& rng);
float random_term(long, long, std::mt19937& rng) {
  if (rng() % 7 == 0) return rng() % 2 ? -0.0f : 0.0f;
  return std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
}
float underflowing_last_term(long k, long K, std::mt19937& rng) {
  return k + 1 < K ? 0.0f : rng() % 2 ? -1e-30f : 1e-30f;
}

// An operand's terms in its order: value(mn, k) at mn * K + k along k, at k * width + mn along M (or N).
template <Contiguous kOrder>
std::vector<float> operand(long width, long K, Term term, std::mt19937& rng) {
  std::vector<float> v(width * K);
  for (long mn = 0; mn < width; ++mn)
    for (long k = 0; k < K; ++k) v[kOrder == Contiguous::along_k ? mn * K + k : k * width + mn] = term(k, K, rng);
  return v;
}

// An operand's terms as its element type (x is bf16, the rest float).
template <class T>
std::vector<T> as(const std::vector<float>& terms) {
  std::vector<T> v(terms.size());
  for (size_t i = 0; i < terms.size(); ++i) {
    if constexpr (std::is_same_v<T, bf16>)
      v[i] = to_bf16(terms[i]);
    else
      v[i] = terms[i];
  }
  return v;
}

// Each product's terms of types TA and TB, read through addresses that are checked: an index outside an
// operand (a load's or a prefetch's) throws, which ends the test.
template <Contiguous kA, Contiguous kB, class TA = float, class TB = float, Streamed kStreamed = Streamed::none>
void expect_chains(const Shape& s, Finish how, Term term = random_term) {
  SCOPED_TRACE(testing::Message() << "M " << s.M << " N " << s.N << " K " << s.K << " blocks " << s.blocks);
  std::mt19937 rng(unsigned(s.M * 1000003 + s.N * 1009 + s.K));
  const std::vector<TA> a_terms = as<TA>(operand<kA>(s.M, s.K, term, rng));
  const std::vector<TB> b_terms = as<TB>(operand<kB>(s.N, s.K, term, rng));
  const auto a = [&](long m, long k) { return &a_terms.at(kA == Contiguous::along_k ? m * s.K + k : k * s.M + m); };
  const auto b = [&](long k, long n) { return &b_terms.at(kB == Contiguous::along_k ? n * s.K + k : k * s.N + n); };
  std::vector<float> out(s.M * s.N, std::numeric_limits<float>::quiet_NaN());
  std::vector<std::atomic<int>> writes(s.M * s.N);
  const auto store = [&](long m, long n, float v) {
    out[m * s.N + n] = v;
    ++writes[m * s.N + n];
  };
  auto smem = std::make_unique<GemmSmem>();
  std::memset(smem.get(), 0xff, sizeof(GemmSmem));  // NaN: a read of what no thread staged shows
  unsigned int claimed = 0;                         // the stashed tiles are claimed, as combine_dx's
  emulation::run_blocks(s.blocks, [&] {
    Pipeline pipe{smem.get()};
    if (how == Finish::each_output) {
      chain_gemm<kA, kB, kStreamed>(pipe, s.M, s.N, s.K, a, b, FromZero{}, store_each_output(s.M, s.N, store));
      return;
    }
    chain_gemm<kA, kB, Streamed::none>(
        pipe, s.M, s.N, s.K, a, b, FromZero{},
        [&](const ChainTile& tile, const ChainAcc& acc) {
          const float* const rows = stash_chain_tile(pipe, acc);
          for (int i = int(threadIdx.x); i < kChainM * kChainN; i += kThreads)
            if (tile.m0 + i / kChainN < s.M && tile.n0 + i % kChainN < s.N)
              store(tile.m0 + i / kChainN, tile.n0 + i % kChainN, rows[i / kChainN * kChainRowB + i % kChainN]);
          __syncthreads();
        },
        ClaimedTiles{&claimed});
  });
  for (long m = 0; m < s.M; ++m)
    for (long n = 0; n < s.N; ++n) {
      const float chain = fma_chain(
          int(s.K), [&](int k) { return term_value(*a(m, k)); }, [&](int k) { return term_value(*b(k, n)); });
      ASSERT_EQ(writes[m * s.N + n], 1) << "output " << m << ", " << n;
      ASSERT_EQ(bits_of(out[m * s.N + n]), bits_of(chain)) << "output " << m << ", " << n;
    }
}

// Partial tiles along M (96) and N (64), partial K-chunks (32), no terms, no rows, a tile per block and
// several, and the logits' E = 32 rows by tokens.
const Shape kShapes[] = {{37, 8, 64, 2}, {200, 70, 100, 3}, {1, 6, 33, 1},   {0, 6, 64, 2},
                         {96, 64, 1, 1}, {97, 384, 31, 5},  {8, 64, 37, 2},  {100, 136, 1, 3},
                         {6, 64, 0, 2},  {191, 128, 65, 2}, {32, 130, 70, 2}};

// Both operands along k, x (bf16) streamed: experts by tokens (rows past M are idle warps'), and tokens by
// experts (E > 96).
TEST(ChainGemm, LogitsOrderGivesEachOutputItsChain) {
  for (const Shape& s : kShapes) {
    expect_chains<Contiguous::along_k, Contiguous::along_k, float, bf16, Streamed::b>(s, Finish::each_output);
    expect_chains<Contiguous::along_k, Contiguous::along_k, bf16, float, Streamed::a>(s, Finish::each_output);
  }
}

TEST(ChainGemm, WeightGradientOrderGivesEachOutputItsChain) {  // both along M / N (d logits, x by token, bf16)
  for (const Shape& s : kShapes)
    expect_chains<Contiguous::along_mn, Contiguous::along_mn, float, bf16>(s, Finish::each_output);
}

TEST(ChainGemm, AChainEndingAtMinusZeroKeepsItsSignInAPartialChunk) {
  for (const Shape& s : {Shape{5, 9, 33, 1}, Shape{97, 65, 1, 2}}) {
    expect_chains<Contiguous::along_k, Contiguous::along_k>(s, Finish::each_output, underflowing_last_term);
    expect_chains<Contiguous::along_mn, Contiguous::along_mn>(s, Finish::each_output, underflowing_last_term);
  }
}

// The relay's use across GPUs: a second product continues the first's outputs (start) over the next
// terms, as GPU 1 continues GPU 0's partial sums over its tokens: fma_chain's bits over all the terms;
// a block whose start says stop takes no more tiles.
TEST(ChainGemm, AStartContinuesChainsAndCanStopTheBlock) {
  constexpr Contiguous kMn = Contiguous::along_mn;
  const long M = 100, N = 70, K0 = 40, K1 = 33, K = K0 + K1;
  std::mt19937 rng(7);
  const std::vector<float> a_terms = operand<kMn>(M, K, random_term, rng),
                           b_terms = operand<kMn>(N, K, random_term, rng);
  std::vector<float> partial(M * N), out(M * N, std::numeric_limits<float>::quiet_NaN());
  std::atomic<int> stops = 0, finishes_after_a_stop = 0;
  const float one = 1.0f;
  auto smem = std::make_unique<GemmSmem>();
  emulation::run_blocks(3, [&] {
    Pipeline pipe{smem.get()};
    const auto product = [&](long k_begin, long k_end, auto start, std::vector<float>& to) {
      chain_gemm<kMn, kMn, Streamed::none>(
          pipe, M, N, k_end - k_begin, [&](long m, long k) { return &a_terms.at((k_begin + k) * M + m); },
          [&](long k, long n) { return &b_terms.at((k_begin + k) * N + n); }, start,
          store_each_output(M, N, [&](long m, long n, float v) { to[m * N + n] = v; }));
    };
    product(0, K0, FromZero{}, partial);
    product(
        K0, K,
        [&](const ChainTile& tile, ChainAcc& acc) {
          for_each_chain_output(M, N, tile, [&](long m, long n, int i, int j) { acc[i][j] = partial[m * N + n]; });
          return true;
        },
        out);
    chain_gemm<kMn, kMn, Streamed::none>(
        pipe, M, N, K, [&](long, long) { return &one; }, [&](long, long) { return &one; },
        [&](const ChainTile&, ChainAcc&) {
          if (threadIdx.x == 0) ++stops;
          return false;
        },
        [&](const ChainTile&, const ChainAcc&) { ++finishes_after_a_stop; });
  });
  EXPECT_EQ(stops, 3) << "a block went on after its start said stop";
  EXPECT_EQ(finishes_after_a_stop, 0);
  for (long m = 0; m < M; ++m)
    for (long n = 0; n < N; ++n)
      ASSERT_EQ(bits_of(out[m * N + n]),
                bits_of(fma_chain(
                    int(K), [&](int k) { return a_terms[k * M + m]; }, [&](int k) { return b_terms[k * N + n]; })))
          << "output " << m << ", " << n;
}

// combine_dx's: d logits along k, router rows along N, the tiles claimed (here block 0 claims them all:
// the blocks run one after another).
TEST(ChainGemm, StashedTilesGiveEachOutputItsChain) {
  for (const Shape& s : kShapes) expect_chains<Contiguous::along_k, Contiguous::along_mn>(s, Finish::stashed_tile);
}

}  // namespace
}  // namespace mok::gpu
