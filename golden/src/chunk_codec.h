// Private: a golden dataset's chunks decoded here (format v1 writes them through the shuffle filter, then
// deflate) rather than by libhdf5, so that no size is taken from the file unbounded: the library's
// deflate filter grows its buffer until the stream ends, and a 4.5 MB golden whose 4 KB chunk inflated
// to 4 GiB made a reader take 8 GB of memory and 110 s before the dataset's SHA-256 refused it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mok::golden {

// The zlib stream's contents, which must be exactly `bytes` long; throws mok::Error, `what` naming the
// chunk, where it inflates to more (without inflating more than one byte past `bytes`), to less, or is
// no valid stream.
std::vector<uint8_t> inflate_exactly(const std::vector<uint8_t>& stream, size_t bytes, const std::string& what);

// HDF5's shuffle filter undone: byte j of element i was stored at j * n + i (n elements of `element`
// bytes; a tail shorter than an element as it was).
void unshuffle(std::vector<uint8_t>& bytes, size_t element);

// The part of a chunk (C order, `chunk` elements per axis, first element at `origin`) inside `shape`,
// copied to its place in `out`, the C-order elements of `shape`.
void copy_chunk(const uint8_t* chunk, const std::vector<uint64_t>& chunk_dims, const std::vector<uint64_t>& origin,
                const std::vector<int64_t>& shape, size_t element, uint8_t* out);

// The next chunk's first element in C order (`chunk` elements per axis, inside `shape`), in place; false
// after the last chunk, `origin` then back at the first. Index: HDF5's hsize_t, or uint64_t.
template <class Index>
bool next_chunk(std::vector<Index>& origin, const std::vector<Index>& chunk, const std::vector<int64_t>& shape) {
  for (size_t axis = shape.size(); axis-- > 0;) {
    origin[axis] += chunk[axis];
    if (origin[axis] < Index(shape[axis])) return true;
    origin[axis] = 0;
  }
  return false;
}

}  // namespace mok::golden
