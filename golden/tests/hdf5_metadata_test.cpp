// Goldens edited below what their reader reads (bytes of HDF5 metadata, HDF5 objects the writer never
// makes) and sealed again, as someone who recomputes the seal can: libhdf5 1.10 trusts a file's metadata,
// and each of these made a reader crash (SIGSEGV, SIGFPE, an abort from free()), hang, allocate
// gigabytes or read data from outside the sealed file. Each is now refused with a mok::Error naming the
// object and the problem (golden/src/hdf5_guard.h, chunk_codec.h). The reads run in a child process, so
// that a crash or a hang fails its test instead of ending the test program.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <functional>

#include "mok/golden/catalogue.h"
#include "mok/golden/golden.h"
#include "mok/golden/seal.h"
#include "test_files.h"

namespace mok::golden {
namespace {

using testing::RawGolden;
using testing::TempDir;

constexpr int kReadSeconds = 20;                // a read past this hangs: the child is killed
constexpr rlim_t kReadBytes = rlim_t(4) << 30;  // a read past this much memory fails (not under ASan)

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;  // which maps terabytes of shadow memory
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

// What reading `file` in a child process gives: the mok::Error's message, "read without error", or how
// the child ended (a crash, or a hang that kReadSeconds ended). A read that allocates past kReadBytes
// gives std::bad_alloc's message.
std::string read_in_child(const std::filesystem::path& file) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return "no pipe";
  const pid_t child = fork();
  if (child == 0) {
    close(pipe_fds[0]);
    alarm(kReadSeconds);
    const rlimit memory{kReadBytes, kReadBytes};
    if (!kAddressSanitizer) setrlimit(RLIMIT_AS, &memory);
    std::string message = "read without error";
    try {
      read_golden(file);
    } catch (const std::exception& e) {
      message = e.what();
    }
    (void)!write(pipe_fds[1], message.data(), message.size());
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string message;
  char buf[4096];
  for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof buf)) > 0;) message.append(buf, size_t(n));
  close(pipe_fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  if (WIFSIGNALED(status))
    return WTERMSIG(status) == SIGALRM ? "hung: killed after " + std::to_string(kReadSeconds) + " s"
                                       : std::string("crashed: ") + strsignal(WTERMSIG(status));
  return message;
}

uint64_t get(const std::vector<char>& bytes, size_t at, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = v << 8 | uint8_t(bytes.at(at + size_t(i)));
  return v;
}

void put(std::vector<char>& bytes, size_t at, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) bytes.at(at + size_t(i)) = char(v >> (8 * i));
}

uint64_t align8(uint64_t n) { return (n + 7) / 8 * 8; }

// Where `needle` first occurs after the seal block.
size_t offset_of(const std::vector<char>& bytes, const std::string& needle) {
  const auto at = std::search(bytes.begin() + kSealBytes, bytes.end(), needle.begin(), needle.end());
  if (at == bytes.end())
    throw std::runtime_error("the file holds no " + std::to_string(needle.size()) + "-byte needle");
  return size_t(at - bytes.begin());
}

// The version 1 attribute message of the attribute `name` (the first so named): name, datatype and
// dataspace sizes at 2, 4 and 6, the name at 8, each part padded to 8 bytes.
size_t attribute_message(const std::vector<char>& bytes, const std::string& name) {
  const size_t m = offset_of(bytes, name + std::string(1, '\0')) - 8;
  if (get(bytes, m, 1) != 1 || get(bytes, m + 2, 2) != name.size() + 1)
    throw std::runtime_error("no version 1 attribute message of " + name);
  return m;
}

size_t attribute_data(const std::vector<char>& bytes, size_t m) {
  return m + 8 + align8(get(bytes, m + 2, 2)) + align8(get(bytes, m + 4, 2)) + align8(get(bytes, m + 6, 2));
}

// The data layout message (version 3, chunked: version, class, rank + 1, B-tree address, chunk sizes
// with the element size last) of the first dataset of chunks `chunk`: in the builtin case, [32, 64, 2]
// is /inputs/x's, [5, 4] /routing/offsets'.
size_t layout_message(const std::vector<char>& bytes, const std::vector<uint32_t>& chunk) {
  std::string sizes;
  for (const uint32_t c : chunk) sizes += std::string{char(c), char(c >> 8), char(c >> 16), char(c >> 24)};
  const size_t m = offset_of(bytes, sizes) - 11;
  if (get(bytes, m, 1) != 3 || get(bytes, m + 1, 1) != 2 || get(bytes, m + 2, 1) != chunk.size())
    throw std::runtime_error("the first such chunk shape is no layout message's");
  return m;
}

// The local heap (signature, version, data size at 8, free list head at 16, data address at 24) whose
// data holds the name `name`: the names of the group that holds an object so named.
size_t local_heap_of(const std::vector<char>& bytes, const std::string& name) {
  const std::string signature = "HEAP", needle = std::string(1, '\0') + name + std::string(1, '\0');
  for (auto at = bytes.begin() + kSealBytes;
       (at = std::search(at, bytes.end(), signature.begin(), signature.end())) != bytes.end(); ++at) {
    const size_t heap = size_t(at - bytes.begin()), data = kSealBytes + get(bytes, heap + 24, 8);
    const size_t size = get(bytes, heap + 8, 8);
    if (data > bytes.size() || size > bytes.size() - data) continue;
    if (std::search(bytes.begin() + data, bytes.begin() + data + size, needle.begin(), needle.end()) !=
        bytes.begin() + data + size)
      return heap;
  }
  throw std::runtime_error("no local heap holds the name " + name);
}

class ResealedGolden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { smoke_ = new GoldenCase(make_case(builtin_case())); }
  static void TearDownTestSuite() { delete smoke_; }

  void SetUp() override {
    write_golden(dir_ / "g.h5", *smoke_);
    original_ = testing::read_bytes(dir_ / "g.h5");
  }

  // What reading the golden gives once `edit` changed its bytes and it was sealed again.
  std::string read_edited(const std::function<void(std::vector<char>&)>& edit) {
    std::vector<char> bytes = original_;
    edit(bytes);
    testing::write_bytes(dir_ / "e.h5", bytes);
    seal_file(dir_ / "e.h5");
    return read_in_child(dir_ / "e.h5");
  }

  // What reading the golden gives once `edit` changed it through HDF5 (RawGolden seals it again).
  std::string read_after(const std::function<void(RawGolden&)>& edit) {
    {
      RawGolden raw(dir_ / "g.h5");
      edit(raw);
    }
    return read_in_child(dir_ / "g.h5");
  }

  static GoldenCase* smoke_;
  TempDir dir_{"hdf5-metadata-test"};
  std::vector<char> original_;
};

GoldenCase* ResealedGolden::smoke_ = nullptr;

// The outcome of a read holds `message`, the words of the refusal expected.
void expect_refused(const std::string& outcome, const std::string& message) {
  EXPECT_NE(outcome.find(message), std::string::npos) << "expected: " << message << "\ngot: " << outcome;
}

TEST_F(ResealedGolden, ReadsAsWritten) { EXPECT_EQ(read_in_child(dir_ / "g.h5"), "read without error"); }

// The global heap collection that holds every string attribute: the library stepped from object to
// object by their stored sizes unchecked (a huge size: SIGSEGV in H5HG_read's memcpy; a free-space object
// of size 0: an endless loop), took any object index (SIGSEGV) and allocated the attribute's length but
// copied the object's size (a heap overflow that free() aborted on).
TEST_F(ResealedGolden, GlobalHeapObjectsAreCheckedBeforeAStringIsRead) {
  const size_t heap = offset_of(original_, "GCOL");
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, heap + 24, uint64_t(1) << 37, 8); }),
                 "(137438953472 bytes) does not fit the collection (malformed HDF5 metadata");
  expect_refused(read_edited([&](std::vector<char>& b) {
                   size_t p = heap + 16;  // the objects, up to the free-space one (id 0)
                   while (get(b, p, 2) != 0) p += 16 + align8(get(b, p + 8, 8));
                   put(b, p + 8, 0, 8);
                 }),
                 " (0 bytes) does not fit the collection");
  const size_t format = attribute_data(original_, attribute_message(original_, "format"));
  ASSERT_EQ(get(original_, format, 4), 10u) << "the string 'mok-golden'";
  const std::string no_object = read_edited([&](std::vector<char>& b) { put(b, format + 12, 1000, 4); });
  expect_refused(no_object, "attribute /@format: the global heap collection at address ");
  expect_refused(no_object, " holds no object 1000 (malformed HDF5 metadata: the file is corrupt or was edited)");
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, format, 2, 4); }),
                 " holds 10 bytes, the string's length is 2");
}

// An attribute message's sizes of its parts: the library skipped by them unchecked and copied the data
// from wherever they led, past the message (a SIGSEGV in H5Aexists on the committed smoke.h5; here
// format_version read from other bytes, as 1 or 0, and /inputs/x@dtype as ''), or looped; a
// variable-length string of 0xff000001-byte characters hung it.
TEST_F(ResealedGolden, AttributeMessagesAreCheckedBeforeTheLibraryDecodesThem) {
  const size_t version = attribute_message(original_, "format_version");
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, version + 6, 0xff08, 2); }),
                 "object /: an attribute message gives its name, datatype and dataspace 65328 bytes, more than its 56");
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, version + 4, 0x2c, 2); }),
                 "object /: an attribute message gives its name, datatype and dataspace");
  const size_t dtype = attribute_message(original_, "dtype");
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, dtype + 7, 0xff, 1); }),
                 "object /inputs/x: an attribute message gives its name, datatype and dataspace");
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, dtype + 16 + 12, 0xff000001, 4); }),
                 "object /inputs/x: attribute 'dtype' is variable-length but no string of 1-byte characters");
}

// A dataset's fill value and filter pipeline messages, which the library decodes as it opens the dataset
// (a helper's sweep of eleven goldens, 74,790 edits): a version 3 fill value of 2^31 - 1 bytes made it copy
// past the message (SIGSEGV in H5O_fill_new_decode), a filter name of 65,528 bytes with no client data made
// it decode the next filter 64 KB on (SIGSEGV in H5O__pline_decode). A variable-length string datatype of 1
// byte made it read past the attribute's data (valgrind) before it refused the file.
TEST_F(ResealedGolden, FillValueAndFilterPipelineMessagesAreCheckedBeforeTheLibraryDecodesThem) {
  // /inputs/x's fill value message (version 2: allocation and write times, value defined, size 0) after its
  // message header (type 5, 8 bytes, constant), and its pipeline (version 1: shuffle, then deflate).
  const size_t fill = offset_of(original_, std::string("\x05\0\x08\0\x01\0\0\0\x02\x03\x02\x01", 12)) + 8;
  expect_refused(
      read_edited([&](std::vector<char>& b) {
        put(b, fill, 3, 1);  // version 3, whose value's size the library did not check
        put(b, fill + 1, 0x20, 1);
        put(b, fill + 2, 0x7fffffff, 4);
      }),
      "object /inputs/x: its fill value message gives a value of 2147483647 bytes, more than the 2 after it");
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, fill + 4, 1, 4); }),
                 "object /inputs/x: its fill value message gives a value of 1 bytes, more than the 0 after it");
  const size_t pipeline = offset_of(original_, std::string("shuffle\0", 8)) - 16;
  expect_refused(read_edited([&](std::vector<char>& b) {
                   put(b, pipeline + 10, 0xfff8, 2);  // the first filter's name length
                   put(b, pipeline + 14, 0, 2);       // and its client data count
                 }),
                 "object /inputs/x: its filter pipeline message runs past its 56 bytes in filter 0");
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, pipeline + 1, 33, 1); }),
                 "object /inputs/x: its filter pipeline message holds 33 filters, more than 32");
  const size_t dtype = attribute_message(original_, "dtype");
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, dtype + 16 + 4, 1, 4); }),
                 "object /inputs/x: attribute 'dtype' is variable-length of 1 bytes, not 16");
}

// A chunked layout's version and chunk shape: layout version 2's decoding of version 3's bytes divided by
// zero (SIGFPE in H5Dopen2), a chunk wider than the dataset made H5Dread copy past its buffer (SIGSEGV),
// a chunk element of 4 bytes for 2-byte elements read without error. (A chunk size of 0 the library
// refuses itself.) A compact layout's size past its message made the library copy past it.
TEST_F(ResealedGolden, LayoutMessagesAreCheckedBeforeTheLibraryOpensADataset) {
  const size_t offsets = layout_message(original_, {5, 4});
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, offsets, 2, 1); }),
                 "object /routing/offsets: its data layout message is not of version 3");
  const size_t layout = layout_message(original_, {32, 64, 2});
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, layout + 11, 0, 4); }),
                 "object /inputs/x: its data layout message has a chunk dimension of 0");
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, layout + 19, 4, 4); }),
                 "object /inputs/x: its data layout message gives a chunk element 4 bytes, its datatype 2");
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, layout + 15, 64 + (1 << 24), 4); }),
                 "dataset /inputs/x has chunks of [32, 16777280], not inside its shape [32, 64]");
  // Compact: the data's 2-byte size at byte 2 (255, past the message), the data from byte 4.
  expect_refused(read_edited([&](std::vector<char>& b) {
                   put(b, layout + 1, 0, 1);
                   put(b, layout + 2, 0xff, 3);
                 }),
                 "object /inputs/x: its data layout message holds less compact data than it says");
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, layout + 2, 2, 1); }),
                 "object /inputs/x: its data layout message gives chunks of rank 1, its dataspace rank 2");
}

// A group's symbol table, which the library walks to look a name up in the group (H5Lexists), and the
// root group's object header, which H5Fopen decodes: a local heap's data past the end of the file or of
// 2^64 - 1 bytes (SIGSEGV; an abort in malloc), its free list looping (memory grew until the allocator
// failed), a B-tree's child or an object header's continuation past the end of the file (SIGSEGV), one
// group's names where another's are (SIGSEGV: the library's cache took one local heap for the other), a
// second symbol table message.
TEST_F(ResealedGolden, SymbolTablesAreCheckedBeforeTheLibraryLooksANameUp) {
  constexpr uint64_t kUndefined = ~uint64_t(0);
  const size_t root_heap = local_heap_of(original_, "config");
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, root_heap + 8, kUndefined, 8); }),
                 "group /: its local heap's data: 18446744073709551615 bytes at address ");
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, root_heap + 24, kUndefined, 8); }),
                 " bytes at address 18446744073709551615 run past the end of the file (malformed HDF5 metadata");
  const uint64_t free_block = get(original_, root_heap + 16, 8);
  ASSERT_NE(free_block, 1u) << "the root group's local heap has a free block";
  expect_refused(read_edited([&](std::vector<char>& b) {
                   put(b, kSealBytes + get(b, root_heap + 24, 8) + free_block, free_block, 8);  // next: itself
                 }),
                 "group /: its local heap's free list loops (offset " + std::to_string(free_block) + ")");
  const size_t tree = offset_of(original_, "TREE");  // the root group's B-tree, a leaf: its first child at 32
  ASSERT_EQ(get(original_, tree + 4, 2), 0u) << "a group B-tree node of level 0";
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, tree + 32, kUndefined, 8); }),
                 "group /: its B-tree: its symbol table node at address 18446744073709551615: 328 bytes at address "
                 "18446744073709551615 run past the end of the file");
  // The root object header's first block: its messages (type, size, flags, reserved, data) from byte 16.
  const size_t root = kSealBytes + get(original_, kSealBytes + 64, 8);
  size_t continuation = root + 16;
  while (get(original_, continuation, 2) != 0x10) continuation += 8 + get(original_, continuation + 2, 2);
  ASSERT_LT(continuation, root + 16 + get(original_, root + 8, 4)) << "the root group's header continues";
  const std::string continued = read_edited([&](std::vector<char>& b) { put(b, continuation + 8, kUndefined, 8); });
  expect_refused(continued, "object /: its object header: ");
  expect_refused(continued, " bytes at address 18446744073709551615 run past the end of the file");
  const size_t inputs = local_heap_of(original_, "dy"), routing = local_heap_of(original_, "topk_idx");
  const std::string overlap =
      read_edited([&](std::vector<char>& b) { put(b, routing + 24, get(b, inputs + 24, 8), 8); });
  expect_refused(overlap, "group /routing: its local heap's data (bytes ");
  expect_refused(overlap, ") overlaps group /inputs: its local heap's data (bytes ");
  // A second symbol table message (an attribute's made one): the library walks the first, the checks saw the
  // last, so one that pointed at a looping free list ran the reader out of memory past the checks.
  size_t attribute = kSealBytes + get(original_, continuation + 8, 8);  // the root header's continuation block
  while (get(original_, attribute, 2) != 0x0C) attribute += 8 + get(original_, attribute + 2, 2);
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, attribute, 0x11, 2); }),
                 "object /: its object header holds message type 17 more than once");
}

// A dataset's chunk B-tree (version 1, type 1: keys of a chunk's size, filter mask and offsets, one per
// dimension and the element's; children at 24 + key bytes, after the first key): an inner node whose child
// is itself recursed the library's lookup until its stack overflowed (SIGSEGV).
TEST_F(ResealedGolden, ChunkBtreesAreCheckedBeforeTheLibraryLooksAChunkUp) {
  const size_t layout = layout_message(original_, {32, 64, 2});
  const uint64_t root = get(original_, layout + 3, 8);
  const size_t node = kSealBytes + root;
  ASSERT_EQ(std::string(&original_.at(node), 4), "TREE");
  ASSERT_EQ(get(original_, node + 4, 2), 1u) << "a chunk B-tree leaf";
  expect_refused(read_edited([&](std::vector<char>& b) {
                   put(b, node + 5, 1, 1);
                   put(b, node + 24 + 32, root, 8);
                 }),
                 "object /inputs/x: its chunk B-tree reaches its node at address " + std::to_string(root) + " twice");
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, layout + 3, get(b, layout + 3, 8) + 1, 8); }),
                 "object /inputs/x: its chunk B-tree node at address " + std::to_string(root + 1) +
                     " is no B-tree node of a dataset's chunks");
}

// A chunk B-tree's leaves name the chunks the writer made: each node is claimed whole (a tree two datasets
// share was read with the first one's key size for the second: libhdf5 read uninitialised keys), holds 1
// to 64 entries, and each entry names a chunk on the grid, after the last, with every filter applied.
// /inputs/x's tree is one leaf of one entry: its key at 24 (size, filter mask, offsets at 32, 40, 48), its
// chunk's address at 56.
TEST_F(ResealedGolden, ChunkBtreeLeavesNameTheWritersChunks) {
  const size_t layout = layout_message(original_, {32, 64, 2});
  const uint64_t root = get(original_, layout + 3, 8);
  const size_t node = kSealBytes + root;
  const std::string leaf = "object /inputs/x: its chunk B-tree node at address " + std::to_string(root);
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, node + 6, 0, 2); }),
                 leaf + " holds 0 entries, a chunk B-tree node holds 1 to 64");
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, node + 16, 0, 8); }),
                 leaf + " is the tree's root, which has no sibling, but names one");
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, node + 28, 4, 4); }),
                 leaf + ": its entry 0, the chunk at [0, 0], skips filters (mask 4)");
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, node + 40, 1, 8); }),
                 leaf + ": its entry 0, the chunk at [0, 1], is not on the dataset's chunk grid");
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, node + 56, get(b, layout + 3, 8), 8); }), "overlaps");
  // x's dataspace (in its object header before the layout message: version 1, rank 2, dims at 8) of
  // 2^63 + 1 rows and columns: the chunk count, 2^126, wrapped to 1 before it was bounded by the file.
  std::string dims(16, '\0');
  dims[0] = 32, dims[8] = 64;
  const std::string header(original_.begin(), original_.begin() + layout);
  size_t space = header.rfind(dims);
  while (space != std::string::npos && space >= 8 && get(original_, space - 8, 2) != 0x0201u)
    space = header.rfind(dims, space - 1);  // the maximum dimensions follow the dimensions
  ASSERT_NE(space, std::string::npos) << "no dataspace message of version 1, rank 2, of x's shape";
  space -= 8;
  expect_refused(read_edited([&](std::vector<char>& b) {
                   put(b, space + 8, (uint64_t(1) << 63) + 1, 8);
                   put(b, space + 16, (uint64_t(1) << 63) + 1, 8);
                 }),
                 "object /inputs/x: its shape needs more chunks than the file has bytes");
  const size_t offsets = layout_message(original_, {5, 4});  // /routing/offsets, of rank 1, on x's tree
  expect_refused(read_edited([&](std::vector<char>& b) { put(b, offsets + 3, root, 8); }), "overlaps");
}

std::vector<unsigned char> deflated_zeros(size_t bytes) {
  const std::vector<unsigned char> zeros(bytes);
  uLongf size = compressBound(uLong(bytes));
  std::vector<unsigned char> out(size);
  if (compress2(out.data(), &size, zeros.data(), uLong(bytes), 9) != Z_OK) throw std::runtime_error("compress2");
  out.resize(size);
  return out;
}

// A chunk's deflate stream that inflates past the chunk: the library's filter grew its buffer until the
// stream ended (a 4.5 MB golden whose chunk inflated to 4 GiB took 8 GB and 110 s), then the reader
// refused the dataset's hash. Now no chunk inflates past its size, and a chunk too small for its
// shape is refused before anything is allocated.
TEST_F(ResealedGolden, AChunkInflatesToItsSizeAndNoMore) {
  const std::string bomb = read_after([](RawGolden& raw) {
    raw.write_raw_chunk("/inputs/x", {0, 0}, deflated_zeros(16 << 20));
  });
  expect_refused(bomb, "dataset /inputs/x: the chunk at [0, 0]: its deflate stream of ");
  expect_refused(bomb, " bytes inflates to more than the chunk's 4096 bytes");
  expect_refused(read_after([](RawGolden& raw) {
                   raw.write_raw_chunk("/inputs/x", {0, 0}, {0x78, 0x9c});
                 }),
                 "dataset /inputs/x: the chunk at [0, 0] stores 2 bytes, which no deflate stream inflates to its 4096");
}

// Data the seal does not cover, or that this reader does not decode: an external link (read from the
// other file as if it were this one's), a soft link, elements in an external file (a FIFO hung the
// reader), another filter pipeline.
TEST_F(ResealedGolden, DataOutsideTheSealedFileOrOtherStorageIsRefused) {
  write_golden(dir_ / "other.h5", *smoke_);
  expect_refused(read_after([&](RawGolden& raw) { raw.link_to_file("/inputs/x", dir_ / "other.h5"); }),
                 "/inputs/x is an external link, no object of this file: the file is corrupt or was edited");
  write_golden(dir_ / "g.h5", *smoke_);
  expect_refused(read_after([](RawGolden& raw) { raw.link_softly("/inputs/x"); }), "/inputs/x is a soft link");
  write_golden(dir_ / "g.h5", *smoke_);
  ASSERT_EQ(mkfifo((dir_ / "x.fifo").c_str(), 0600), 0);
  expect_refused(read_after([&](RawGolden& raw) { raw.store_externally("/inputs/x", dir_ / "x.fifo"); }),
                 "dataset /inputs/x is stored contiguous, format v1 stores datasets in chunks");
  write_golden(dir_ / "g.h5", *smoke_);
  expect_refused(read_after([](RawGolden& raw) { raw.add_fletcher32("/inputs/x"); }),
                 "dataset /inputs/x is stored through the filters [shuffle, fletcher32, deflate], format v1's are "
                 "[shuffle, deflate]");
}

}  // namespace
}  // namespace mok::golden
