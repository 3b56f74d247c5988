#include "mok/golden/seal.h"

#include <cstdint>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "mok/core/config.h"
#include "mok/golden/golden.h"
#include "mok/golden/sha256.h"

namespace mok::golden {
namespace {

constexpr char kMagic[] = "mok-golden ";
constexpr char kHdf5Signature[] = "\x89HDF\r\n\x1a\n";

std::string digest_after_block(std::istream& in) {
  in.seekg(std::streamoff(kSealBytes));
  Sha256 sha;
  std::vector<char> buf(size_t(1) << 20);
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    sha.update(buf.data(), size_t(in.gcount()));
  }
  return to_hex(sha.finish());
}

// The seal block of a file of `size` bytes whose bytes after the block have SHA-256 `sha` (hex), NUL-padded.
std::string seal_block(uintmax_t size, const std::string& sha) {
  std::string seal =
      kMagic + std::to_string(kFormatVersion) + "\nsize " + std::to_string(size) + "\nsha256 " + sha + "\n";
  seal.resize(kSealBytes, '\0');
  return seal;
}

}  // namespace

void seal_image(std::string& image) {
  if (image.size() < kSealBytes) throw Error("the file image is shorter than its seal block");
  Sha256 sha;  // of the bytes after the block, read in place (no copy of a large capture's image)
  sha.update(image.data() + kSealBytes, image.size() - kSealBytes);
  image.replace(0, kSealBytes, seal_block(image.size(), to_hex(sha.finish())));
}

void seal_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot reopen the file to seal it");
  std::string image((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  seal_image(image);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(image.data(), std::streamsize(image.size()));
  out.flush();
  if (!out) throw Error("cannot write the seal");
}

void check_seal(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot open the file");
  std::string block(kSealBytes, '\0');
  f.read(block.data(), std::streamsize(block.size()));
  const size_t got = size_t(f.gcount());
  if (block.rfind(kMagic, 0) != 0) {
    if (block.rfind(kHdf5Signature, 0) == 0)
      throw Error("an HDF5 file, but no mok golden: it has no mok-golden seal block");
    throw Error("not a mok golden file (no mok-golden seal block: corrupt, truncated or another format)");
  }
  if (got < kSealBytes) throw Error("truncated: " + std::to_string(got) + " bytes, less than the seal block");
  std::istringstream header(block.substr(0, block.find('\0')));
  std::string magic, size_key, sha_key, sha;
  int version = 0;
  uintmax_t size = 0;
  // The version first: another format version may lay out the rest of its seal otherwise, and is to be
  // named as such, not as a damaged seal.
  header >> magic >> version;
  if (header && version != kFormatVersion)
    throw Error("format version " + std::to_string(version) + ", this build reads version " +
                std::to_string(kFormatVersion));
  header >> size_key >> std::ws;
  // A size is digits only: operator>> would take "-5" for 2^64 - 5.
  if (header.peek() < '0' || header.peek() > '9') header.setstate(std::ios::failbit);
  header >> size >> sha_key >> sha;
  // The block is the one seal_image writes, byte for byte: a changed byte in its padding was taken.
  if (!header || size_key != "size" || sha_key != "sha256" || sha.size() != 64 || block != seal_block(size, sha))
    throw Error("the seal block is damaged: the file is corrupt");
  const uintmax_t actual = std::filesystem::file_size(path);
  if (actual != size)
    throw Error((actual < size ? "truncated: " : "longer than written: ") + std::to_string(actual) +
                " bytes, the seal says " + std::to_string(size));
  f.clear();
  if (digest_after_block(f) != sha)
    throw Error("the file's SHA-256 does not match its seal: the file is corrupt or was edited");
}

}  // namespace mok::golden
