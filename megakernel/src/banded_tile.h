// The order of a GEMM phase's tiles over its grid of output tiles (tile_schedules.cuh), kept apart so
// that the host tests check it.
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

}  // namespace mok::gpu
