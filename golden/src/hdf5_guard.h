// Private: checks, on a golden's own bytes, of the HDF5 metadata that libhdf5 1.10 decodes without
// bounds checks. A file edited and sealed again passes the seal; a size in an attribute message, a chunk
// size in a layout message or an object of the global heap (where variable-length strings live) that
// disagrees with the bytes around it made the library read or copy past its buffers (SIGSEGV, heap
// corruption found by free(), SIGFPE) or loop forever; so did a group's symbol table (its local heap,
// B-tree and symbol table nodes) with an address past the file or a local heap whose free list loops
// (memory grew until the allocator failed), and two structures at one address (the library's cache
// took one for the other). Each check runs before the library first decodes the structure, and throws
// mok::Error naming the object and the problem.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace mok::golden {

// A group's local heap data (its names) and how many of its bytes lie up to its last NUL, inclusive: a
// name starting below that ends inside the heap.
struct HeapNames {
  std::vector<uint8_t> bytes;
  uint64_t terminated;
};

// A chunked dataset's chunk B-tree as it is walked: the chunk grid its leaves' keys must name, each chunk
// once, in increasing order.
struct ChunkWalk {
  std::vector<uint64_t> shape, chunk;  // the dataspace's dimensions and the chunk's, the element's left out
  std::set<uint64_t> nodes;            // the nodes reached
  std::vector<uint64_t> last;          // the last chunk's offsets
  uint64_t chunks = 0;
};

class RawHdf5 {
 public:
  // base: HDF5's base address (the user block, the seal's 512 bytes), which addresses are relative to.
  RawHdf5(const std::filesystem::path& file, uint64_t base);

  uintmax_t file_bytes() const { return size_; }

  // The address of the root group's object header, from the superblock: of version 0, 8-byte addresses
  // and lengths, symbol table nodes and group B-tree nodes of rank at least 1 (their sizes, below).
  uint64_t root_address();

  // The version 1 object header at `address` of the object at path `where` ("/config"): its messages fit
  // their blocks; every attribute message's name, datatype, dataspace and data fit the message, its
  // datatype is one a golden holds (integer, float, string, variable-length string of 1-byte
  // characters), unshared; a layout message is version 3, a chunked one with chunk sizes of at least 1,
  // the last the element size of the datatype message; its chunk B-tree's inner nodes each one level above
  // their children and each node reached once (a node its own descendant recursed the library's lookup
  // until its stack overflowed). Keeps the messages for the check below.
  void check_object_header(const std::string& where, uint64_t address);

  // The symbol table of the group at `where` (its object header checked above), which the library walks
  // to look a name up in the group: its local heap (the names) with its free list inside it and free of
  // loops, its B-tree (group nodes, each level one below its parent's, each node reached once, no more
  // children than the superblock's rank allows) and the symbol table nodes at its leaves; every name
  // offset inside the heap, its name ending there; every address inside the file. Call it before the
  // library first looks a name up in the group. A group without a symbol table message is left to the
  // library (every group the writer makes has one).
  void check_symbol_table(const std::string& where);

  // The global heap object that the variable-length string attribute `name` of the object at `where`
  // (checked above) points at: a well-formed collection (its objects tile it) holds it, of the string's
  // length. Call it before the library reads the attribute.
  void check_string_attribute(const std::string& where, const std::string& name);

 private:
  struct Message {
    uint16_t type;
    uint8_t flags;
    std::vector<uint8_t> data;
  };

  struct Region {
    uint64_t end;
    std::string kind, what;
  };

  std::vector<uint8_t> read(uint64_t address, uint64_t bytes, const std::string& what);
  // Records that the structure `what` of type `kind` takes `bytes` at `address`: one that overlaps
  // another (unless it is the same one, seen again) is refused.
  void claim(uint64_t address, uint64_t bytes, const std::string& kind, const std::string& what);
  void check_group_node(uint64_t address, int level, const HeapNames& names, std::set<uint64_t>& seen,
                        const std::string& what);
  std::vector<Message> messages(uint64_t address, const std::string& what);
  void check_heap_object(uint64_t address, uint32_t index, uint32_t length, const std::string& what);
  void check_chunk_node(uint64_t address, int level, ChunkWalk& walk, const std::string& what);
  void check_chunk_entry(const uint8_t* key, uint64_t address, ChunkWalk& walk, const std::string& what);
  void check_siblings(const std::vector<uint8_t>& node_bytes, const std::string& node) const;

  std::map<std::string, std::vector<Message>> headers_;  // object path -> its header's messages, once checked
  std::map<uint64_t, Region> regions_;                   // the structures checked, by address
  std::ifstream in_;
  uint64_t size_ = 0;
  uint64_t base_ = 0;
  uint64_t leaf_k_ = 0, internal_k_ = 0;  // the superblock's ranks of symbol table nodes and group B-tree nodes
};

}  // namespace mok::golden
