// layout_scan.cuh run on the host, a block's threads as std::threads (block_emulation/tile_gemm.cuh):
// for E from 1 to kMaxExperts (one lane group to more groups than warps, partial last groups) and chunk
// counts below, at and above the runs, on random counts, the offsets, tile offsets and chunk_base that
// core's scan_chunks and the saved layout's tile_offsets give. No GPU needed; the GPU tests run it in
// the kernel (the E 72 and E 400 cases among them).
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "layout_scan.cuh"  // the build's copy, beside the stand-in for tile_gemm.cuh
#include "mok/core/saved_layout.h"

namespace mok::gpu {
namespace {

struct Scan {
  std::vector<int32_t> offsets, tile_offsets, chunk_base;
};

Scan block_scan(int E, int chunks, const std::vector<int32_t>& counts) {
  const auto smem = std::make_unique<GemmSmem>();
  Pipeline pipe{smem.get()};
  Scan s{std::vector<int32_t>(E + 1, -1), std::vector<int32_t>(E + 1, -1), std::vector<int32_t>(counts.size(), -1)};
  emulation::run_blocks(1, [&] {
    scan_layout_block(pipe, E, chunks, counts.data(), s.offsets.data(), s.tile_offsets.data(), s.chunk_base.data());
  });
  return s;
}

TEST(LayoutScanEmulation, GivesScanChunks) {
  std::mt19937 rng(39);
  for (int E : {1, 8, 31, 32, 33, 72, 128, 383, 384, 385, 400, kMaxExperts})
    for (int chunks : {1, 5, 12, 19, 100}) {
      SCOPED_TRACE("E " + std::to_string(E) + ", " + std::to_string(chunks) + " chunks");
      std::vector<int32_t> counts(size_t(chunks) * E);
      for (int32_t& c : counts) c = int32_t(rng() % (kLayoutChunk + 1));  // an expert's rows in a chunk
      DispatchLayout want;
      want.offsets.resize(E + 1);
      std::vector<int32_t> want_base(counts.size());
      scan_chunks(counts.data(), chunks, E, want_base.data(), want.offsets.data());
      const Scan got = block_scan(E, chunks, counts);
      EXPECT_EQ(got.offsets, want.offsets);
      EXPECT_EQ(got.tile_offsets, saved_detail::tile_offsets(want));
      EXPECT_EQ(got.chunk_base, want_base);
    }
}

}  // namespace
}  // namespace mok::gpu
