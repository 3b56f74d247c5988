// HDF5 metadata checked on the file's bytes (hdf5_guard.h). Layouts: the HDF5 file format specification
// (version 0 superblock, 8-byte addresses and lengths): object header version 1, its messages dataspace
// (0x0001), datatype (0x0003), fill value (0x0004, and 0x0005 versions 1 to 3), data layout (0x0008,
// version 3), filter pipeline (0x000B, versions 1 and 2), attribute (0x000C, versions 1 to 3),
// continuation (0x0010) and symbol table (0x0011); the local heap, version 1 B-tree group nodes and
// symbol table nodes (a group's symbol table); the global heap collection.
#include "hdf5_guard.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include "mok/core/config.h"

namespace mok::golden {
namespace {

constexpr uint16_t kDataspace = 0x0001, kDatatype = 0x0003, kOldFillValue = 0x0004, kFillValue = 0x0005,
                   kLayout = 0x0008, kFilterPipeline = 0x000B, kAttribute = 0x000C, kContinuation = 0x0010,
                   kSymbolTable = 0x0011;
constexpr uint8_t kFillValueDefined = 0x20;  // a version 3 fill value message's flag: a size and value follow
constexpr uint64_t kMaxFilters = 32;         // the library's limit on a pipeline's filters
constexpr uint16_t kFirstNamedFilter = 256;  // a version 2 pipeline names only filters from this id on
constexpr uint8_t kChunkedLayout = 2;        // a data layout message's class of chunked storage
constexpr uint8_t kSharedMessage = 0x02;     // an object header message flag: the message lives elsewhere
constexpr uint8_t kIntegerClass = 0, kFloatClass = 1, kStringClass = 3, kVlenClass = 9;
constexpr uint64_t kVlenElementBytes = 16;    // a variable-length element on disk: length, heap address, index
constexpr uint64_t kHeapMinBytes = 4096;      // the smallest global heap collection the library reads
constexpr uint64_t kHeapObjectHeader = 16;    // id, reference count, reserved, size
constexpr size_t kMaxHeaderMessages = 65535;  // a version 1 object header counts its messages in 16 bits
constexpr uint64_t kSuperblockBytes = 96;     // version 0, the root group's symbol table entry included
constexpr uint64_t kObjectHeaderPrefix = 16;  // version 1: version, message count, references, size, padding
constexpr uint64_t kLocalHeapPrefix = 32;     // signature, version, data size, free list head, data address
constexpr uint64_t kFreeListEnd = 1;          // a local heap's free list ends at this "offset"
constexpr uint64_t kFreeBlockBytes = 16;      // a free block starts with the next one's offset and its size
constexpr uint64_t kBtreeHeader = 24;         // signature, type, level, entries used, two sibling addresses
constexpr uint64_t kSymbolNodeHeader = 8, kSymbolEntry = 40;  // a symbol table node; each of its entries
constexpr uint64_t kUndefinedAddress = UINT64_MAX;
constexpr uint64_t kChunkTreeK = 32;  // half a chunk B-tree node's entries: a version 0 superblock's fixed rank

uint64_t le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

uint64_t align8(uint64_t n) { return (n + 7) & ~uint64_t(7); }

std::string text(uint64_t v) { return std::to_string(v); }

[[noreturn]] void malformed(const std::string& problem) {
  throw Error(problem + " (malformed HDF5 metadata: the file is corrupt or was edited)");
}

struct Attribute {
  std::string name;
  uint8_t type_class;
  uint64_t data_at, data_bytes;  // the data's place in the message
};

// The element size of an attribute's or a dataset's datatype, whose property bytes (which the library's
// decoder reads without knowing the datatype's size) must fit it: 4 for an integer, 12 for a float, a
// 1-byte integer base type for a variable-length string.
uint64_t datatype_element_bytes(const uint8_t* p, uint64_t bytes, const std::string& bad) {
  const uint8_t type_class = bytes < 8 ? 0xff : p[0] & 0x0f;
  const uint64_t size = bytes < 8 ? 0 : le(p + 4, 4);
  const bool fits = (type_class == kIntegerClass && bytes >= 12 && size > 0) ||
                    (type_class == kFloatClass && bytes >= 20 && size > 0) ||
                    (type_class == kStringClass && size > 0) || (type_class == kVlenClass && bytes >= 20);
  if (!fits)
    malformed(bad + "has a datatype (class " + text(type_class) + ", " + text(bytes) + " bytes) no golden holds");
  if (type_class != kVlenClass) return size;
  // The library sizes an attribute's data by `size`, where this guard (and the library's reads) take 16.
  if (size != kVlenElementBytes) malformed(bad + "is variable-length of " + text(size) + " bytes, not 16");
  const bool string_of_bytes = (p[1] & 0x0f) == 1 && (p[8] & 0x0f) == kIntegerClass && le(p + 12, 4) == 1;
  if (!string_of_bytes) malformed(bad + "is variable-length but no string of 1-byte characters");
  return kVlenElementBytes;
}

// The number of elements of an attribute's or a dataset's dataspace (version 1 or 2), whose dimensions
// must fit it.
uint64_t dataspace_points(const uint8_t* p, uint64_t bytes, const std::string& bad) {
  const int version = bytes < 4 ? 0 : p[0], rank = bytes < 4 ? 0 : p[1], flags = bytes < 4 ? 0 : p[2];
  const uint64_t dims_at = version == 1 ? 8 : 4, dims_bytes = uint64_t(rank) * 8 * ((flags & 1) ? 2 : 1);
  if ((version != 1 && version != 2) || rank > 32 || (flags & ~1) || dims_at + dims_bytes > bytes ||
      (version == 2 && p[3] > 2))
    malformed(bad + "has a malformed dataspace");
  if (version == 2 && p[3] == 2) return 0;  // the null dataspace
  uint64_t points = 1;
  for (int i = 0; i < rank; ++i) {
    const uint64_t d = le(p + dims_at + 8 * i, 8);
    points = d != 0 && points > UINT64_MAX / d ? UINT64_MAX : points * d;
  }
  return points;
}

// An attribute message's parts, each inside the message: the library copies the name with strdup, and
// the data by the size its datatype and dataspace give, wherever the sizes put them.
Attribute parse_attribute(const std::vector<uint8_t>& m, uint8_t flags, const std::string& what) {
  const std::string bad = what + ": an attribute message ";
  const int version = m.size() < 8 ? 0 : m[0];
  if (version < 1 || version > 3) malformed(bad + "of version " + text(version) + " (1 to 3 exist)");
  if ((flags & kSharedMessage) || (version >= 2 && (m[1] & 0x03)))
    malformed(bad + "is shared or has a shared datatype or dataspace, which no golden has");
  const uint64_t name_bytes = le(&m[2], 2), type_bytes = le(&m[4], 2), space_bytes = le(&m[6], 2);
  const auto padded = [&](uint64_t n) { return version == 1 ? align8(n) : n; };
  const uint64_t name_at = version == 3 ? 9 : 8, type_at = name_at + padded(name_bytes);
  const uint64_t space_at = type_at + padded(type_bytes), data_at = space_at + padded(space_bytes);
  if (data_at > m.size())
    malformed(bad + "gives its name, datatype and dataspace " + text(data_at) + " bytes, more than its " +
              text(m.size()));
  if (name_bytes == 0 || m[name_at + name_bytes - 1] != 0 || std::memchr(&m[name_at], 0, name_bytes - 1))
    malformed(bad + "has a name that does not end where its length says");
  Attribute a{reinterpret_cast<const char*>(&m[name_at]), 0, data_at, 0};
  const std::string named = what + ": attribute " + quote_input(a.name) + " ";
  const uint64_t element = datatype_element_bytes(m.data() + type_at, type_bytes, named);  // type_bytes >= 8
  a.type_class = m[type_at] & 0x0f;
  const uint64_t points = dataspace_points(m.data() + space_at, space_bytes, named);
  if (points > m.size() || points * element > m.size() - data_at)
    malformed(named + "says it holds " + text(points) + " elements of " + text(element) + " bytes, more than the " +
              text(m.size() - data_at) + " bytes of its message");
  a.data_bytes = points * element;
  return a;
}

// A version 3 data layout: compact data inside the message; chunks of at least one element on every
// axis of the dataspace (`rank`), their last "dimension" the element size (a chunk size the library
// divides by and copies with).
void check_layout(const std::vector<uint8_t>& m, uint64_t element, int rank, const std::string& what) {
  const std::string bad = what + ": its data layout message ";
  if (m.size() < 3 || m[0] != 3) malformed(bad + "is not of version 3, the one the writer makes");
  if (m[1] == 0 && (m.size() < 4 || 4 + le(&m[2], 2) > m.size()))  // the data's size, then the data
    malformed(bad + "holds less compact data than it says");
  if (m[1] == 1 && m.size() < 18) malformed(bad + "is too short for a contiguous layout");  // address, size
  if (m[1] > 2) malformed(bad + "has layout class " + text(m[1]) + " (0 to 2 exist in version 3)");
  if (m[1] != kChunkedLayout) return;
  const uint64_t ndims = m[2];
  if (ndims < 2 || ndims > 33 || 11 + 4 * ndims > m.size()) malformed(bad + "has a malformed chunk shape");
  if (int(ndims) != rank + 1)
    malformed(bad + "gives chunks of rank " + text(ndims - 1) + ", its dataspace rank " + std::to_string(rank));
  for (uint64_t i = 0; i < ndims; ++i)
    if (le(&m[11 + 4 * i], 4) == 0) malformed(bad + "has a chunk dimension of 0");
  if (le(&m[11 + 4 * (ndims - 1)], 4) != element)
    malformed(bad + "gives a chunk element " + text(le(&m[11 + 4 * (ndims - 1)], 4)) + " bytes, its datatype " +
              text(element));
}

// A fill value message (either type): its value inside the message and, where given, of the datatype's
// size (`element`; the library copies the value by the size the message gives, past the message for a
// version 3 one, and fills chunks with it by the datatype's).
void check_fill_value(const std::vector<uint8_t>& m, uint16_t type, uint64_t element, const std::string& what) {
  const std::string bad = what + ": its fill value message ";
  std::optional<uint64_t> size_at;  // where the value's size lies, if the message holds a value
  if (type == kOldFillValue) {
    size_at = 0;
  } else {
    const uint8_t version = m.empty() ? 0 : m[0];
    if (version < 1 || version > 3) malformed(bad + "is of version " + text(version) + " (1 to 3 exist)");
    const uint64_t header = version == 3 ? 2 : 4;  // version and flags; or version, two times and "defined"
    if (m.size() < header) malformed(bad + "is too short");
    if (version == 1 || (version == 2 ? m[3] != 0 : (m[1] & kFillValueDefined) != 0)) size_at = header;
  }
  if (!size_at) return;
  if (m.size() < *size_at + 4) malformed(bad + "is too short for its value's size");
  const uint64_t size = le(&m[*size_at], 4);
  if (size > m.size() - *size_at - 4)
    malformed(bad + "gives a value of " + text(size) + " bytes, more than the " + text(m.size() - *size_at - 4) +
              " after it");
  if (size != 0 && size != element)
    malformed(bad + "gives a value of " + text(size) + " bytes, its datatype's elements " + text(element));
}

// A filter pipeline message (version 1 or 2): at most the library's 32 filters, each filter's name and
// client data inside the message (the library decodes the next filter wherever the counts put it).
void check_filter_pipeline(const std::vector<uint8_t>& m, const std::string& what) {
  const std::string bad = what + ": its filter pipeline message ";
  const int version = m.size() < 2 ? 0 : m[0];
  if (version != 1 && version != 2) malformed(bad + "is of version " + text(uint64_t(version)) + " (1 and 2 exist)");
  const uint64_t filters = m[1];
  if (filters > kMaxFilters) malformed(bad + "holds " + text(filters) + " filters, more than 32");
  uint64_t at = version == 1 ? 8 : 2;  // version 1: six reserved bytes
  for (uint64_t f = 0; f < filters; ++f) {
    const auto need = [&](uint64_t bytes) {
      if (bytes > m.size() || at > m.size() - bytes)
        malformed(bad + "runs past its " + text(m.size()) + " bytes in filter " + text(f));
    };
    need(2);
    const uint64_t id = le(&m[at], 2);
    const bool named = version == 1 || id >= kFirstNamedFilter;
    need(named ? 8 : 6);
    const uint64_t name_bytes = named ? le(&m[at + 2], 2) : 0;
    const uint64_t values = le(&m[at + (named ? 6 : 4)], 2);
    at += named ? 8 : 6;
    need(name_bytes);
    if (name_bytes > 0 && !std::memchr(&m[at], 0, name_bytes))
      malformed(bad + "has a filter name that does not end where its length says");
    at += name_bytes;
    const uint64_t value_bytes = 4 * values + (version == 1 && values % 2 ? 4 : 0);  // version 1 pads an odd count
    need(value_bytes);
    at += value_bytes;
  }
}

// A name of a group's local heap at `offset`: the library compares and copies it as a C string, so a NUL
// must follow it inside the heap.
void check_name(const HeapNames& names, uint64_t offset, const std::string& what) {
  if (offset >= names.terminated)
    malformed(what + " has its name at offset " + text(offset) + " of the group's local heap, whose " +
              text(names.bytes.size()) + " bytes hold no name there");
}

// A version 1 B-tree node's header (`b` from the node's start): its signature, its node type (0 a group's,
// 1 a dataset's chunks) and its level, one below its parent's (`level`; any for the root node, -1).
void check_btree_header(const std::vector<uint8_t>& b, uint8_t type, int level, const std::string& node) {
  if (std::memcmp(b.data(), "TREE", 4) != 0 || b[4] != type)
    malformed(node + " is no B-tree node of " + (type == 0 ? "a group" : "a dataset's chunks") + " (signature, type " +
              text(type) + ")");
  if (level >= 0 && b[5] != level)
    malformed(node + " is of level " + text(b[5]) + ", its parent's child is of level " + text(uint64_t(level)));
}

}  // namespace

RawHdf5::RawHdf5(const std::filesystem::path& file, uint64_t base) : in_(file, std::ios::binary), base_(base) {
  std::error_code error;
  size_ = std::filesystem::file_size(file, error);
  if (!in_ || error || base_ > size_) throw Error("cannot reopen the file to check its HDF5 metadata");
}

std::vector<uint8_t> RawHdf5::read(uint64_t address, uint64_t bytes, const std::string& what) {
  if (address > size_ - base_ || bytes > size_ - base_ - address)
    malformed(what + ": " + text(bytes) + " bytes at address " + text(address) + " run past the end of the file");
  std::vector<uint8_t> out(bytes);
  in_.clear();
  in_.seekg(std::streamoff(base_ + address));
  in_.read(reinterpret_cast<char*>(out.data()), std::streamsize(bytes));
  if (!in_) throw Error(what + ": cannot read " + text(bytes) + " bytes at address " + text(address));
  return out;
}

// Every message of the object header, its continuation blocks followed (each once: a block that
// continues into one already read is a loop). Bounded by the file: blocks of more bytes in all than it
// holds (overlapping ones, each read anew) or more messages than a version 1 header counts are refused.
std::vector<RawHdf5::Message> RawHdf5::messages(uint64_t address, const std::string& what) {
  const std::vector<uint8_t> prefix = read(address, kObjectHeaderPrefix, what + ": its object header");
  if (prefix[0] != 1) malformed(what + ": object header version " + text(prefix[0]) + ", the writer makes version 1");
  std::vector<std::pair<uint64_t, uint64_t>> blocks{{address + kObjectHeaderPrefix, le(&prefix[8], 4)}};
  std::set<uint64_t> seen{address + kObjectHeaderPrefix};
  std::vector<Message> out;
  uint64_t block_bytes = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    block_bytes += blocks[b].second;  // each at most the file's size (read), so no wrap
    if (block_bytes > size_) malformed(what + ": its object header blocks hold more bytes than the file");
    const std::vector<uint8_t> block = read(blocks[b].first, blocks[b].second, what + ": its object header");
    if (b == 0)
      claim(address, kObjectHeaderPrefix + blocks[0].second, "object header", what + "'s object header");
    else
      claim(blocks[b].first, blocks[b].second, "object header", what + "'s object header continuation block");
    for (size_t p = 0; p + 8 <= block.size();) {
      const uint64_t bytes = le(&block[p + 2], 2);
      if (bytes > block.size() - p - 8) malformed(what + ": a message runs past its object header block");
      Message m{uint16_t(le(&block[p], 2)), block[p + 4], {block.begin() + p + 8, block.begin() + p + 8 + bytes}};
      p += 8 + bytes;
      if (m.type == kContinuation) {
        if (m.data.size() < 16) malformed(what + ": a continuation message of " + text(m.data.size()) + " bytes");
        if (!seen.insert(le(&m.data[0], 8)).second) malformed(what + ": its object header continues in a loop");
        blocks.emplace_back(le(&m.data[0], 8), le(&m.data[8], 8));
      }
      out.push_back(std::move(m));
      if (out.size() > kMaxHeaderMessages) malformed(what + ": its object header holds more than 65,535 messages");
    }
  }
  return out;
}

uint64_t RawHdf5::root_address() {
  const std::vector<uint8_t> superblock = read(0, kSuperblockBytes, "the superblock");
  if (std::memcmp(superblock.data(), "\x89HDF\r\n\x1a\n", 8) != 0 || superblock[8] != 0)
    malformed("the superblock is not one of version 0, the one the writer makes");
  if (superblock[13] != 8 || superblock[14] != 8)
    malformed("the superblock gives addresses of " + text(superblock[13]) + " bytes and lengths of " +
              text(superblock[14]) + ", not the writer's 8 and 8");
  leaf_k_ = le(&superblock[16], 2);
  internal_k_ = le(&superblock[18], 2);
  if (leaf_k_ == 0 || internal_k_ == 0)
    malformed("the superblock gives symbol table nodes of rank " + text(leaf_k_) + " and group B-tree nodes of rank " +
              text(internal_k_) + " (at least 1)");
  claim(0, kSuperblockBytes, "superblock", "the superblock");
  return le(&superblock[64], 8);  // the root group's symbol table entry: name offset, object header address
}

void RawHdf5::claim(uint64_t address, uint64_t bytes, const std::string& kind, const std::string& what) {
  if (bytes == 0) return;
  const uint64_t end = address + bytes;  // both checked against the file by read() first: no wrap
  auto next = regions_.lower_bound(address);
  if (next != regions_.end() && next->first == address && next->second.end == end && next->second.kind == kind)
    return;  // the same structure, seen again (an object two hard links name)
  const auto overlap = [&](const std::pair<const uint64_t, Region>& r) {
    malformed(what + " (bytes " + text(address) + " to " + text(end) + ") overlaps " + r.second.what + " (bytes " +
              text(r.first) + " to " + text(r.second.end) + ")");
  };
  if (next != regions_.end() && next->first < end) overlap(*next);
  if (next != regions_.begin() && std::prev(next)->second.end > address) overlap(*std::prev(next));
  regions_.emplace(address, Region{end, kind, what});
}

void RawHdf5::check_object_header(const std::string& where, uint64_t address) {
  const std::string what = "object " + where;
  std::vector<Message> all = messages(address, what);
  uint64_t element = 0;
  int rank = -1;
  std::vector<uint64_t> shape;
  // The library reads the first of each; the checks below would see the last (a second symbol table let
  // the library walk one these checks never saw).
  for (const uint16_t type : {kDataspace, kDatatype, kOldFillValue, kFillValue, kLayout, kFilterPipeline, kSymbolTable})
    if (std::count_if(all.begin(), all.end(), [&](const Message& m) { return m.type == type; }) > 1)
      malformed(what + ": its object header holds message type " + text(type) + " more than once");
  for (const Message& m : all) {
    const bool decoded_here = m.type == kDatatype || m.type == kDataspace || m.type == kOldFillValue ||
                              m.type == kFillValue || m.type == kFilterPipeline;
    if (decoded_here && (m.flags & kSharedMessage))
      malformed(what + ": its message of type " + text(m.type) + " is shared, which no golden has");
    if (m.type == kDatatype) element = datatype_element_bytes(m.data.data(), m.data.size(), what + ": it ");
    if (m.type == kDataspace) {
      dataspace_points(m.data.data(), m.data.size(), what + ": it ");  // its size checked first
      rank = m.data[1];
      for (int i = 0; i < rank; ++i) shape.push_back(le(&m.data[(m.data[0] == 1 ? 8 : 4) + 8 * i], 8));
    }
  }
  for (const Message& m : all) {
    if (m.type == kAttribute) parse_attribute(m.data, m.flags, what);
    if (m.type == kOldFillValue || m.type == kFillValue) check_fill_value(m.data, m.type, element, what);
    if (m.type == kFilterPipeline) check_filter_pipeline(m.data, what);
    if (m.type != kLayout) continue;
    check_layout(m.data, element, rank, what);
    if (m.data[1] != kChunkedLayout) continue;
    // Chunked (check_layout: the message holds its rank + 1 and its B-tree's address), the tree allocated.
    if (const uint64_t tree = le(&m.data[3], 8); tree != kUndefinedAddress) {
      ChunkWalk walk;
      walk.shape = shape;
      uint64_t needed = 1;  // chunks the shape needs, each at least a byte of the file: bounded by its size
      for (int i = 0; i < rank; ++i) {
        walk.chunk.push_back(le(&m.data[11 + 4 * i], 4));  // check_layout: no chunk dimension of 0
        const uint64_t along = shape[i] / walk.chunk[i] + (shape[i] % walk.chunk[i] != 0);
        if (along != 0 && needed > (size_ - base_) / along)
          malformed(what + ": its shape needs more chunks than the file has bytes");
        needed *= along;
      }
      check_chunk_node(tree, -1, walk, what + ": its chunk B-tree");
      if (walk.chunks != needed)
        malformed(what + ": its chunk B-tree holds " + text(walk.chunks) + " chunks, its shape needs " + text(needed));
    }
  }
  headers_[where] = std::move(all);
}

void RawHdf5::check_symbol_table(const std::string& where) {
  const auto header = headers_.find(where);
  if (header == headers_.end()) fail_internal("the object header of " + where + " was not checked");
  const Message* table = nullptr;
  for (const Message& m : header->second)
    if (m.type == kSymbolTable) table = &m;
  if (table == nullptr) return;
  const std::string what = "group " + where;
  if (table->data.size() < 16)
    malformed(what + ": its symbol table message holds " + text(table->data.size()) + " bytes");
  const uint64_t btree = le(&table->data[0], 8), heap_address = le(&table->data[8], 8);
  // The local heap: its prefix, then its data (the names, and free blocks the free list links).
  const std::string heap_what = what + ": its local heap";
  const std::vector<uint8_t> prefix = read(heap_address, kLocalHeapPrefix, heap_what);
  if (std::memcmp(prefix.data(), "HEAP", 4) != 0 || prefix[4] != 0)
    malformed(heap_what + " at address " + text(heap_address) + " has no local heap prefix (signature, version 0)");
  const uint64_t data_bytes = le(&prefix[8], 8), free_list = le(&prefix[16], 8), data_address = le(&prefix[24], 8);
  claim(heap_address, kLocalHeapPrefix, "local heap", heap_what);
  HeapNames names{read(data_address, data_bytes, heap_what + "'s data"), 0};
  // Found once: a search from each name's offset to the end cost keys x heap bytes.
  const auto last_nul = std::find(names.bytes.rbegin(), names.bytes.rend(), 0);
  names.terminated = uint64_t(names.bytes.rend() - last_nul);
  claim(data_address, data_bytes, "local heap data", heap_what + "'s data");
  std::set<uint64_t> free_blocks;
  for (uint64_t at = free_list; at != kFreeListEnd;) {
    if (at > data_bytes || kFreeBlockBytes > data_bytes - at)
      malformed(heap_what + " has a free block at offset " + text(at) + ", past its " + text(data_bytes) + " bytes");
    if (!free_blocks.insert(at).second) malformed(heap_what + "'s free list loops (offset " + text(at) + ")");
    const uint64_t next = le(&names.bytes[at], 8), bytes = le(&names.bytes[at + 8], 8);
    if (bytes < kFreeBlockBytes || bytes > data_bytes - at)
      malformed(heap_what + " has a free block of " + text(bytes) + " bytes at offset " + text(at) + " of its " +
                text(data_bytes));
    at = next;
  }
  std::set<uint64_t> seen;
  check_group_node(btree, -1, names, seen, what + ": its B-tree");
}

// A group B-tree node (its `level`, or any for the root node, -1): the keys name offsets of the heap, the
// children B-tree nodes one level down or, at level 0, symbol table nodes, whose entries name their
// objects by heap offset and address.
void RawHdf5::check_group_node(uint64_t address, int level, const HeapNames& names, std::set<uint64_t>& seen,
                               const std::string& what) {
  const std::string node = what + " node at address " + text(address);
  if (!seen.insert(address).second) malformed(what + " reaches its node at address " + text(address) + " twice");
  const uint64_t two_k = 2 * internal_k_, node_bytes = kBtreeHeader + two_k * 8 + (two_k + 1) * 8;
  const std::vector<uint8_t> b = read(address, node_bytes, node);
  check_btree_header(b, 0, level, node);
  claim(address, node_bytes, "B-tree node", node);
  const uint64_t used = le(&b[6], 2);
  if (used > two_k) malformed(node + " holds " + text(used) + " children, its rank allows " + text(two_k));
  check_siblings(b, node);
  for (uint64_t i = 0; i <= used; ++i)
    check_name(names, le(&b[kBtreeHeader + 16 * i], 8), node + ": its key " + text(i));
  for (uint64_t i = 0; i < used; ++i) {
    const uint64_t child = le(&b[kBtreeHeader + 16 * i + 8], 8);
    if (b[5] > 0) {
      check_group_node(child, b[5] - 1, names, seen, what);
      continue;
    }
    const std::string symbols = what + ": its symbol table node at address " + text(child);
    if (!seen.insert(child).second)
      malformed(what + " reaches its symbol table node at address " + text(child) + " twice");
    const std::vector<uint8_t> n = read(child, kSymbolNodeHeader + 2 * leaf_k_ * kSymbolEntry, symbols);
    if (std::memcmp(n.data(), "SNOD", 4) != 0 || n[4] != 1)
      malformed(symbols + " is no symbol table node (signature, version 1)");
    claim(child, n.size(), "symbol table node", symbols);
    const uint64_t entries = le(&n[6], 2);
    if (entries > 2 * leaf_k_)
      malformed(symbols + " holds " + text(entries) + " entries, its rank allows " + text(2 * leaf_k_));
    for (uint64_t e = 0; e < entries; ++e) {
      const uint8_t* entry = &n[kSymbolNodeHeader + e * kSymbolEntry];  // name, header address, cache type, scratch
      const std::string named = symbols + ": its entry " + text(e);
      check_name(names, le(entry, 8), named);
      const uint64_t object = le(entry + 8, 8), cache = le(entry + 16, 4);
      if (cache > 2) malformed(named + " has cache type " + text(cache) + " (0 to 2 exist)");
      if (object >= size_ - base_ && !(cache == 2 && object == kUndefinedAddress))  // a soft link has no address
        malformed(named + " names an object at address " + text(object) + ", past the end of the file");
      if (cache == 2) check_name(names, le(entry + 24, 4), named + "'s soft link value");  // its heap offset
    }
  }
}

void RawHdf5::check_siblings(const std::vector<uint8_t>& b, const std::string& node) const {
  for (const uint64_t sibling : {le(&b[8], 8), le(&b[16], 8)})
    if (sibling != kUndefinedAddress && sibling >= size_ - base_)
      malformed(node + " has a sibling at address " + text(sibling) + ", past the end of the file");
}

// A chunk B-tree node (its `level`, or any for the root node, -1), claimed whole (a tree two datasets share
// was decoded with the first one's key size for the second: libhdf5 read uninitialised keys): 1 to 2K
// entries, each a key of a chunk's size, filter mask and offsets, then a child: a B-tree node one level
// down or, at level 0, a chunk.
void RawHdf5::check_chunk_node(uint64_t address, int level, ChunkWalk& walk, const std::string& what) {
  const std::string node = what + " node at address " + text(address);
  if (!walk.nodes.insert(address).second) malformed(what + " reaches its node at address " + text(address) + " twice");
  const uint64_t key = 16 + 8 * walk.shape.size(), two_k = 2 * kChunkTreeK;  // the element's offset last
  const std::vector<uint8_t> b = read(address, kBtreeHeader + two_k * (key + 8) + key, node);
  check_btree_header(b, 1, level, node);
  claim(address, b.size(), "chunk B-tree node", node);
  const uint64_t used = le(&b[6], 2);
  if (used == 0 || used > two_k)
    malformed(node + " holds " + text(used) + " entries, a chunk B-tree node holds 1 to " + text(two_k));
  check_siblings(b, node);
  if (level < 0 && (le(&b[8], 8) != kUndefinedAddress || le(&b[16], 8) != kUndefinedAddress))
    malformed(node + " is the tree's root, which has no sibling, but names one");
  for (uint64_t i = 0; i < used; ++i) {
    const uint8_t* entry = &b[kBtreeHeader + i * (key + 8)];
    const uint64_t child = le(entry + key, 8);
    if (b[5] > 0)
      check_chunk_node(child, b[5] - 1, walk, what);
    else
      check_chunk_entry(entry, child, walk, node + ": its entry " + text(i));
  }
}

// A leaf's entry: a chunk the writer made (every filter applied, stored bytes inside the file and no other
// structure's), at offsets on the chunk grid inside the shape, after the last chunk's (libhdf5 takes any key
// not above the offsets it looks up for theirs).
void RawHdf5::check_chunk_entry(const uint8_t* key, uint64_t address, ChunkWalk& walk, const std::string& what) {
  const uint64_t bytes = le(key, 4), mask = le(key + 4, 4), rank = walk.shape.size();
  std::vector<uint64_t> at(rank);
  bool on_grid = le(key + 8 + 8 * rank, 8) == 0;  // the element's offset
  for (uint64_t i = 0; i < rank; ++i) {
    at[i] = le(key + 8 + 8 * i, 8);
    on_grid = on_grid && at[i] % walk.chunk[i] == 0 && at[i] < walk.shape[i];
  }
  std::string offsets;
  for (const uint64_t o : at) offsets += (offsets.empty() ? "" : ", ") + text(o);
  const std::string chunk = what + ", the chunk at [" + offsets + "]";
  if (!on_grid) malformed(chunk + ", is not on the dataset's chunk grid");
  if (walk.chunks > 0 && !std::lexicographical_compare(walk.last.begin(), walk.last.end(), at.begin(), at.end()))
    malformed(chunk + ", does not follow the chunk before it");
  if (mask != 0) malformed(chunk + ", skips filters (mask " + text(mask) + "): the writer applies every filter");
  if (bytes == 0 || address >= size_ - base_ || bytes > size_ - base_ - address)
    malformed(chunk + ", stores " + text(bytes) + " bytes at address " + text(address) + ", not inside the file");
  claim(address, bytes, "chunk", chunk);
  walk.last = std::move(at);
  ++walk.chunks;
}

void RawHdf5::check_string_attribute(const std::string& where, const std::string& name) {
  const auto header = headers_.find(where);
  if (header == headers_.end()) fail_internal("the object header of " + where + " was not checked");
  for (const Message& m : header->second) {
    if (m.type != kAttribute) continue;
    const Attribute a = parse_attribute(m.data, m.flags, "object " + where);
    if (a.name != name || a.type_class != kVlenClass || a.data_bytes < kVlenElementBytes) continue;
    const uint8_t* d = &m.data[a.data_at];  // sequence length, heap collection address, object index
    check_heap_object(le(d + 4, 8), uint32_t(le(d + 12, 4)), uint32_t(le(d, 4)), "attribute " + where + "@" + name);
  }
}

// The collection's objects must tile it (the library steps from one to the next by their sizes, without
// bounds, and loops forever on a free-space object of size 0), the wanted one among them exactly once,
// of the string's length (the library allocates the length, then copies the object's size).
void RawHdf5::check_heap_object(uint64_t address, uint32_t index, uint32_t length, const std::string& what) {
  if (address == 0) return;  // a null string: nothing is read
  const std::string bad = what + ": the global heap collection at address " + text(address);
  const std::vector<uint8_t> head = read(address, 16, bad);
  const uint64_t size = le(&head[8], 8);
  if (std::memcmp(head.data(), "GCOL", 4) != 0 || head[4] != 1 || size < kHeapMinBytes)
    malformed(bad + " has no collection header (signature, version 1, at least 4096 bytes)");
  const std::vector<uint8_t> heap = read(address, size, bad);
  claim(address, size, "global heap collection", bad.substr(bad.find("the global heap")));
  std::vector<bool> seen(size_t(1) << 16);
  uint64_t found = UINT64_MAX;
  for (uint64_t p = 16; p + kHeapObjectHeader <= size;) {  // a shorter tail is free space
    const uint64_t id = le(&heap[p], 2), bytes = le(&heap[p + 8], 8);
    const uint64_t need = bytes > size ? UINT64_MAX : id == 0 ? bytes : kHeapObjectHeader + align8(bytes);
    if (need > size - p || need < kHeapObjectHeader)
      malformed(bad + ": its object " + text(id) + " at byte " + text(p) + " (" + text(bytes) +
                " bytes) does not fit the collection");
    if (id != 0 && seen[id]) malformed(bad + " holds object " + text(id) + " twice");
    if (id != 0) seen[id] = true;
    if (id != 0 && id == index) found = bytes;
    p += need;
  }
  if (found == UINT64_MAX) malformed(bad + " holds no object " + text(index));
  if (found != length)
    malformed(bad + ": object " + text(index) + " holds " + text(found) + " bytes, the string's length is " +
              text(length));
}

}  // namespace mok::golden
