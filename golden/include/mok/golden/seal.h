// The seal of a golden file: HDF5's 512-byte user block, which HDF5 itself skips, holds
//   "mok-golden <format version>\nsize <file bytes>\nsha256 <SHA-256 of every byte after the block>\n"
// padded with NULs. A reader checks it before HDF5 parses anything, so a corrupt or truncated file
// is a clear mok::Error, never a crash inside the HDF5 library (which trusts its metadata).
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>

namespace mok::golden {

inline constexpr size_t kSealBytes = 512;

// Writes the seal into the user block of an HDF5 file image made with a 512-byte user block (the
// writer's), or of such a closed file (tests that edit a golden).
void seal_image(std::string& image);
void seal_file(const std::filesystem::path& path);

// Throws mok::Error (without the file name) saying what is wrong: not a golden, another format
// version, truncated, or corrupt.
void check_seal(const std::filesystem::path& path);

}  // namespace mok::golden
