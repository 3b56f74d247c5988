// The order of a GEMM phase's tiles over its grid of output tiles, and of a list of tiles over the
// persistent blocks (tile_schedules.cuh), kept apart so that the host tests check them.
#pragma once

#include "mok/core/host_device.h"

namespace mok::gpu {

// The tiles of a grid of `rows` x `cols` output tiles in bands of kBandRows tile rows, column by column
// within a band: the tiles in flight at once (one per block: 132 on an H200) span about kBandRows row
// tiles by 132 / kBandRows column tiles, so that L2 serves each A and B panel to many of them (row by
// row, a few row tiles by every column tile read each B panel of the expert again every few row tiles).
inline constexpr int kBandRows = 16;
struct GridTile {
  int row, col;
};
MOK_HD GridTile banded_tile(int item, int rows, int cols) {
  const int band_items = kBandRows * cols, band = item / band_items, in_band = item % band_items;
  const int left = rows - band * kBandRows, band_rows = left < kBandRows ? left : kBandRows;
  return {band * kBandRows + in_band % band_rows, in_band / band_rows};
}

// A list of tiles (longest first) walked in snake order: gemm_tiles hands its numbers round-robin (block
// b of G takes b, b + G, ...), and every other round of G numbers here runs the list backwards, so the
// block that took a round's last (shortest) tile takes the next round's first. Round-robin alone gave
// the low blocks the long end of every round: their free times drifted apart, and a long gradient's
// tiles, which read the same operands, started scattered in time, each group re-reading them from DRAM
// (Zipf's hot experts; docs/benchmarks.md, session 61). Which block runs a tile changes no bit.
struct SnakeOrder {
  long tiles;
  int blocks;

  // The numbers to walk: whole rounds (tile() of a number in the last round may be past the list).
  MOK_HD long walked() const { return (tiles + blocks - 1) / blocks * blocks; }
  // The list's tile of walked number t, or -1 past the list.
  MOK_HD long tile(long t) const {
    const long round = t / blocks, in_round = round % 2 ? blocks - 1 - t % blocks : t % blocks;
    const long at = round * blocks + in_round;
    return at < tiles ? at : -1;
  }
};

}  // namespace mok::gpu
