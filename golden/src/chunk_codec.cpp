#include "chunk_codec.h"

#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "mok/core/config.h"

namespace mok::golden {

std::vector<uint8_t> inflate_exactly(const std::vector<uint8_t>& stream, size_t bytes, const std::string& what) {
  std::vector<uint8_t> out(bytes + 1);  // one byte more: a stream that fills it inflates to too much
  z_stream z{};
  if (inflateInit(&z) != Z_OK) throw Error(what + ": cannot initialise zlib");
  size_t in_at = 0, out_at = 0;
  int rc = Z_OK;
  while (rc == Z_OK && out_at < out.size()) {  // zlib counts in uInt: at most 4 GiB a call
    const size_t in_n = std::min<size_t>(stream.size() - in_at, UINT_MAX);
    const size_t out_n = std::min<size_t>(out.size() - out_at, UINT_MAX);
    z.next_in = const_cast<Bytef*>(stream.data() + in_at);
    z.avail_in = uInt(in_n);
    z.next_out = out.data() + out_at;
    z.avail_out = uInt(out_n);
    rc = inflate(&z, Z_NO_FLUSH);
    in_at += in_n - z.avail_in;
    out_at += out_n - z.avail_out;
  }
  const std::string zlib_message = z.msg ? z.msg : "";
  inflateEnd(&z);
  const std::string bad = what + ": its deflate stream of " + std::to_string(stream.size()) + " bytes ";
  if (out_at > bytes) throw Error(bad + "inflates to more than the chunk's " + std::to_string(bytes) + " bytes");
  if (rc == Z_STREAM_END && out_at < bytes)
    throw Error(bad + "inflates to " + std::to_string(out_at) + " bytes, the chunk has " + std::to_string(bytes));
  if (rc != Z_STREAM_END)
    throw Error(bad + (rc == Z_BUF_ERROR ? "ends early" : "is corrupt") +
                (zlib_message.empty() ? "" : " (zlib: " + zlib_message + ")"));
  // The writer stores the stream and nothing after it: bytes past its end are no chunk it wrote.
  if (in_at < stream.size())
    throw Error(bad + "ends after " + std::to_string(in_at) + " of them: the chunk stores bytes past its stream");
  out.pop_back();
  return out;
}

void unshuffle(std::vector<uint8_t>& bytes, size_t element) {
  const size_t n = bytes.size() / std::max<size_t>(element, 1);
  if (element <= 1 || n <= 1) return;
  std::vector<uint8_t> out(bytes);  // the tail shorter than an element stays
  for (size_t j = 0; j < element; ++j)
    for (size_t i = 0; i < n; ++i) out[i * element + j] = bytes[j * n + i];
  bytes.swap(out);
}

void copy_chunk(const uint8_t* chunk, const std::vector<uint64_t>& chunk_dims, const std::vector<uint64_t>& origin,
                const std::vector<int64_t>& shape, size_t element, uint8_t* out) {
  const size_t rank = shape.size();
  std::vector<uint64_t> extent(rank), chunk_stride(rank, 1), out_stride(rank, 1);
  for (size_t i = rank; i-- > 0;) {
    extent[i] = std::min<uint64_t>(chunk_dims[i], uint64_t(shape[i]) - origin[i]);
    if (i + 1 < rank) {
      chunk_stride[i] = chunk_stride[i + 1] * chunk_dims[i + 1];
      out_stride[i] = out_stride[i + 1] * uint64_t(shape[i + 1]);
    }
  }
  // One contiguous run of the last axis per index of the others (an odometer over them).
  std::vector<uint64_t> at(rank, 0);
  while (true) {
    uint64_t from = 0, to = 0;
    for (size_t i = 0; i < rank; ++i) {
      from += at[i] * chunk_stride[i];
      to += (origin[i] + at[i]) * out_stride[i];
    }
    std::memcpy(out + to * element, chunk + from * element, extent[rank - 1] * element);
    size_t axis = rank - 1;
    while (axis-- > 0 && ++at[axis] == extent[axis]) at[axis] = 0;
    if (axis == SIZE_MAX) return;
  }
}

}  // namespace mok::golden
