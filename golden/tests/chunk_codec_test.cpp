// The chunk decoding of golden/src/chunk_codec.h against HDF5's encoding as its filters write it (the
// chunk's elements in C order, edge chunks stored whole, shuffled, then deflated): every dataset shape of
// rank 1 to 3 and 2- or 4-byte elements, edge chunks on every axis, decoded into the dataset's elements
// bit for bit; and deflate streams that inflate to other than the chunk's size refused.
#include "chunk_codec.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <random>
#include <stdexcept>

#include "mok/core/config.h"

namespace mok::golden {
namespace {

// HDF5's shuffle filter: byte j of element i goes to j * n + i (a tail shorter than an element stays).
std::vector<uint8_t> shuffled(const std::vector<uint8_t>& bytes, size_t element) {
  const size_t n = bytes.size() / element;
  std::vector<uint8_t> out(bytes);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < element; ++j) out[j * n + i] = bytes[i * element + j];
  return out;
}

std::vector<uint8_t> deflated(const std::vector<uint8_t>& bytes) {
  uLongf size = compressBound(uLong(bytes.size()));
  std::vector<uint8_t> out(size);
  if (compress2(out.data(), &size, bytes.data(), uLong(bytes.size()), 6) != Z_OK) throw std::runtime_error("compress2");
  out.resize(size);
  return out;
}

// The chunk at `origin` of a dataset `data` (C order), as HDF5 stores it: whole, its part past the
// dataset's edge zero.
std::vector<uint8_t> chunk_of(const std::vector<uint8_t>& data, const std::vector<int64_t>& shape,
                              const std::vector<uint64_t>& chunk, const std::vector<uint64_t>& origin, size_t element) {
  size_t elements = 1;
  for (const uint64_t c : chunk) elements *= c;
  std::vector<uint8_t> out(elements * element, 0);
  for (size_t e = 0; e < elements; ++e) {
    size_t rest = e, at = 0;
    bool inside = true;
    std::vector<uint64_t> index(shape.size());
    for (size_t axis = shape.size(); axis-- > 0; rest /= chunk[axis]) index[axis] = rest % chunk[axis];
    for (size_t axis = 0; axis < shape.size(); ++axis) {
      inside = inside && origin[axis] + index[axis] < uint64_t(shape[axis]);
      at = at * size_t(shape[axis]) + origin[axis] + index[axis];
    }
    if (inside) std::memcpy(&out[e * element], &data[at * element], element);
  }
  return out;
}

TEST(ChunkCodec, EveryChunkOfEveryShapeDecodesToItsElements) {
  std::mt19937 rng(20261205);
  int edge_chunks = 0;
  for (int trial = 0; trial < 500; ++trial) {
    const size_t rank = 1 + rng() % 3, element = rng() % 2 ? 2 : 4;
    std::vector<int64_t> shape(rank);
    std::vector<uint64_t> chunk(rank);
    size_t bytes = element;
    for (size_t axis = 0; axis < rank; ++axis) {
      shape[axis] = 1 + rng() % 7;
      chunk[axis] = 1 + rng() % uint64_t(shape[axis]);
      bytes *= size_t(shape[axis]);
      edge_chunks += shape[axis] % int64_t(chunk[axis]) != 0;
    }
    std::vector<uint8_t> data(bytes), decoded(bytes, 0xaa);
    for (uint8_t& b : data) b = uint8_t(rng());
    std::vector<uint64_t> origin(rank, 0);
    do {
      const std::vector<uint8_t> stored = chunk_of(data, shape, chunk, origin, element);
      std::vector<uint8_t> inflated = inflate_exactly(deflated(shuffled(stored, element)), stored.size(), "chunk");
      unshuffle(inflated, element);
      ASSERT_EQ(inflated, stored);
      copy_chunk(inflated.data(), chunk, origin, shape, element, decoded.data());
    } while (next_chunk(origin, chunk, shape));
    ASSERT_EQ(decoded, data) << "rank " << rank << ", " << element << "-byte elements, trial " << trial;
  }
  EXPECT_GT(edge_chunks, 100) << "the shapes must have partial chunks at their edges";
}

TEST(ChunkCodec, UnshuffleKeepsATailShorterThanAnElement) {
  std::vector<uint8_t> bytes(11);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i);
  std::vector<uint8_t> stored = shuffled(bytes, 4);
  ASSERT_NE(stored, bytes);
  unshuffle(stored, 4);
  EXPECT_EQ(stored, bytes);
}

std::string inflate_error(const std::vector<uint8_t>& stream, size_t bytes) {
  try {
    inflate_exactly(stream, bytes, "chunk");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ChunkCodec, AStreamInflatesToTheChunksSizeAndNoMore) {
  const std::vector<uint8_t> sevens(1000, 7), stream = deflated(sevens);
  EXPECT_EQ(inflate_exactly(stream, 1000, "chunk"), sevens);
  EXPECT_NE(inflate_error(stream, 999).find("inflates to more than the chunk's 999 bytes"), std::string::npos);
  EXPECT_NE(inflate_error(stream, 1001).find("inflates to 1000 bytes, the chunk has 1001"), std::string::npos);
  std::vector<uint8_t> cut(stream.begin(), stream.end() - 3);
  EXPECT_NE(inflate_error(cut, 1000).find("ends early"), std::string::npos);
  EXPECT_NE(inflate_error({}, 1000).find("ends early"), std::string::npos);
  std::vector<uint8_t> trailed = stream;
  trailed.push_back(0);
  EXPECT_NE(inflate_error(trailed, 1000).find("ends after " + std::to_string(stream.size()) + " of them"),
            std::string::npos);
  std::vector<uint8_t> corrupt = stream;
  corrupt[3] ^= 0xff;
  EXPECT_NE(inflate_error(corrupt, 1000).find("is corrupt"), std::string::npos);
}

}  // namespace
}  // namespace mok::golden
