// Private: checks, on a golden's own bytes, of the HDF5 metadata that libhdf5 1.10 decodes without
// bounds checks. A file edited and sealed again passes the seal; a size in an attribute message, a chunk
// size in a layout message or an object of the global heap (where variable-length strings live) that
// disagrees with the bytes around it made the library read or copy past its buffers (SIGSEGV, heap
// corruption found by free(), SIGFPE) or loop forever. Each check runs before the library first
// decodes the structure, and throws mok::Error naming the object and the problem.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace mok::golden {

class RawHdf5 {
 public:
  // base: HDF5's base address (the user block, the seal's 512 bytes), which addresses are relative to.
  RawHdf5(const std::filesystem::path& file, uint64_t base);

  uintmax_t file_bytes() const { return size_; }

  // The address of the root group's object header, from the (version 0) superblock.
  uint64_t root_address();

  // The version 1 object header at `address` of the object at path `where` ("/config"): its messages fit
  // their blocks; every attribute message's name, datatype, dataspace and data fit the message, its
  // datatype is one a golden holds (integer, float, string, variable-length string of 1-byte
  // characters), unshared; a layout message is version 3, a chunked one with chunk sizes of at least 1,
  // the last the element size of the datatype message. Keeps the messages for the check below.
  void check_object_header(const std::string& where, uint64_t address);

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

  std::vector<uint8_t> read(uint64_t address, uint64_t bytes, const std::string& what);
  std::vector<Message> messages(uint64_t address, const std::string& what);
  void check_heap_object(uint64_t address, uint32_t index, uint32_t length, const std::string& what);

  std::map<std::string, std::vector<Message>> headers_;  // object path -> its header's messages, once checked
  std::ifstream in_;
  uint64_t size_ = 0;
  uint64_t base_ = 0;
};

}  // namespace mok::golden
