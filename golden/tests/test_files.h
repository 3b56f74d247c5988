// Test helpers shared by golden/ and verify/ tests: a scratch directory, raw file bytes, and HDF5
// edits that make a valid golden invalid in one specific way.
#pragma once

#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "mok/golden/seal.h"
#include "tool_run.h"

namespace mok::golden::testing {

// A fresh directory under the system temp dir, removed with everything in it.
class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : path_(std::filesystem::temp_directory_path() / ("mok-" + tag + "-" + std::to_string(getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
  const std::filesystem::path& path() const { return path_; }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path_)) names.push_back(e.path().filename().string());
    return names;
  }

 private:
  std::filesystem::path path_;
};

inline std::vector<char> read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const std::filesystem::path& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

inline std::string read_text(const std::filesystem::path& p) {
  const std::vector<char> b = read_bytes(p);
  return std::string(b.begin(), b.end());
}

using mok::test::ToolRun;

// Runs a command-line tool with the given arguments, its output captured in a file of `dir`; with a
// timeout, killed after that many seconds (exit status 124), so that a tool that hangs fails the test.
inline ToolRun run_tool(const std::string& tool, const TempDir& dir, const std::string& args, int timeout_s = 0) {
  const std::filesystem::path log = dir / "tool.log";
  const std::string limit = timeout_s > 0 ? "timeout " + std::to_string(timeout_s) + " " : "";
  const int raw = std::system((limit + tool + " " + args + " > " + log.string() + " 2>&1").c_str());
  return ToolRun{mok::test::exit_status_of(raw), read_text(log)};
}

// Runs a command-line tool with its standard output on `out` (/dev/full: a full disk) and its stderr
// captured in a file of `dir`.
inline ToolRun run_tool_with_stdout(const std::string& tool, const TempDir& dir, const std::string& args,
                                    const std::string& out) {
  const std::filesystem::path log = dir / "tool.log";
  const int raw = std::system((tool + " " + args + " >" + out + " 2>" + log.string()).c_str());
  return ToolRun{mok::test::exit_status_of(raw), read_text(log)};
}

// An HDF5 call of the test helpers checked: a negative result throws, naming the call and its object,
// so that an edit that did not land fails the test instead of leaving the file as it was.
template <class R>
R h5(R result, const std::string& what) {
  if (result < 0) throw std::runtime_error("HDF5 failed: " + what);
  return result;
}

// Opens a golden for writing with HDF5 directly, to make it wrong in one way but well-formed: on
// closing, the seal is rewritten as a (hypothetical) other writer would have written it.
class RawGolden {
 public:
  explicit RawGolden(const std::filesystem::path& p) : path_(p), file_(H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)) {
    if (file_ < 0) throw std::runtime_error("cannot open " + p.string());
  }
  // A destructor cannot throw (it may run while an edit's exception unwinds): a failed close or seal
  // is the current test's failure, named, instead of a file silently left unsealed or half-written.
  ~RawGolden() {
    if (H5Fclose(file_) < 0) ADD_FAILURE() << "RawGolden: cannot close " << path_;
    try {
      seal_file(path_);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "RawGolden: cannot seal " << path_ << ": " << e.what();
    }
  }
  RawGolden(const RawGolden&) = delete;
  RawGolden& operator=(const RawGolden&) = delete;

  void set_root_i32(const char* name, int32_t value) { set_i32("/", name, value); }

  // An int32 attribute of `object` (a group or dataset path) replaced.
  void set_i32(const char* object, const char* name, int32_t value) {
    const std::string what = std::string(object) + "@" + name;
    if (H5Adelete_by_name(file_, object, name, H5P_DEFAULT) < 0) throw std::runtime_error("no attribute " + what);
    const Id space(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate for " + what);
    const Id attr(
        H5Acreate_by_name(file_, object, name, H5T_STD_I32LE, space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
        H5Aclose, "H5Acreate_by_name " + what);
    h5(H5Awrite(attr.id, H5T_NATIVE_INT32, &value), "H5Awrite " + what);
  }

  void set_root_string(const char* name, const std::string& value) { set_string("/", name, value); }

  // A string attribute of `object` (a group or dataset path) replaced; any bytes, as an editor might write.
  void set_string(const char* object, const char* name, const std::string& value) {
    const std::string what = std::string(object) + "@" + name;
    if (H5Adelete_by_name(file_, object, name, H5P_DEFAULT) < 0) throw std::runtime_error("no attribute " + what);
    add_string(object, name, value);
  }

  void remove(const char* path) {
    if (H5Ldelete(file_, path, H5P_DEFAULT) < 0) throw std::runtime_error(std::string("no object ") + path);
  }

  void remove_attribute(const char* object, const char* name) {
    if (H5Adelete_by_name(file_, object, name, H5P_DEFAULT) < 0)
      throw std::runtime_error(std::string("no attribute ") + object + "@" + name);
  }

  // Flips one bit of a dataset's data, leaving its attributes (and so its stored SHA-256) as they are.
  void flip_bit(const char* path, size_t byte, int bit) {
    const Id ds(H5Dopen2(file_, path, H5P_DEFAULT), H5Dclose, std::string("H5Dopen2 ") + path);
    const Id type(H5Dget_type(ds.id), H5Tclose, std::string("H5Dget_type ") + path);
    const Id space(H5Dget_space(ds.id), H5Sclose, std::string("H5Dget_space ") + path);
    const size_t element = H5Tget_size(type.id);  // 0 on failure
    if (element == 0) throw std::runtime_error(std::string("HDF5 failed: H5Tget_size ") + path);
    std::vector<unsigned char> data(
        size_t(h5(H5Sget_simple_extent_npoints(space.id), std::string("H5Sget_simple_extent_npoints ") + path)) *
        element);
    h5(H5Dread(ds.id, type.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), std::string("H5Dread ") + path);
    data.at(byte) ^= (unsigned char)(1u << bit);
    h5(H5Dwrite(ds.id, type.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), std::string("H5Dwrite ") + path);
  }

  // Replaces a dataset by an external link to the object of the same path in `other` (a golden too).
  void link_to_file(const char* path, const std::filesystem::path& other) {
    remove(path);
    h5(H5Lcreate_external(other.c_str(), path, file_, path, H5P_DEFAULT, H5P_DEFAULT),
       std::string("H5Lcreate_external ") + path);
  }

  // Moves a dataset to PATH_data and puts a soft link to it at its path.
  void link_softly(const char* path) {
    const std::string target = std::string(path) + "_data";
    h5(H5Lmove(file_, path, file_, target.c_str(), H5P_DEFAULT, H5P_DEFAULT), std::string("H5Lmove ") + path);
    h5(H5Lcreate_soft(target.c_str(), file_, path, H5P_DEFAULT, H5P_DEFAULT), std::string("H5Lcreate_soft ") + path);
  }

  // Replaces a dataset by one of the same type, shape and string attributes whose elements HDF5 keeps in
  // `external` (a file outside the golden), nothing written to it.
  void store_externally(const char* path, const std::filesystem::path& external) {
    const Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "H5Pcreate for " + std::string(path));
    h5(H5Pset_external(dcpl.id, external.c_str(), 0, H5F_UNLIMITED), std::string("H5Pset_external ") + path);
    recreate(path, dcpl.id, false);
  }

  // Replaces a dataset by a copy in one chunk stored through the filters shuffle, fletcher32, deflate.
  void add_fletcher32(const char* path) {
    const Id space = dataspace_of(path);
    std::vector<hsize_t> dims(size_t(h5(H5Sget_simple_extent_ndims(space.id), std::string("ndims ") + path)));
    h5(H5Sget_simple_extent_dims(space.id, dims.data(), nullptr), std::string("dims ") + path);
    const Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "H5Pcreate for " + std::string(path));
    h5(H5Pset_chunk(dcpl.id, int(dims.size()), dims.data()), std::string("H5Pset_chunk ") + path);
    h5(H5Pset_shuffle(dcpl.id), std::string("H5Pset_shuffle ") + path);
    h5(H5Pset_fletcher32(dcpl.id), std::string("H5Pset_fletcher32 ") + path);
    h5(H5Pset_deflate(dcpl.id, 6), std::string("H5Pset_deflate ") + path);
    recreate(path, dcpl.id, true);
  }

  // Replaces the stored bytes of a chunk (which the filters are to decode) by `bytes`.
  void write_raw_chunk(const char* path, const std::vector<hsize_t>& origin, const std::vector<unsigned char>& bytes) {
    const Id ds(H5Dopen2(file_, path, H5P_DEFAULT), H5Dclose, std::string("H5Dopen2 ") + path);
    h5(H5Dwrite_chunk(ds.id, H5P_DEFAULT, 0, origin.data(), bytes.size(), bytes.data()),
       std::string("H5Dwrite_chunk ") + path);
  }

  // Replaces a dataset by a float32 one of the same shape (and no attributes).
  void retype_as_f32(const char* path) {
    const Id space = dataspace_of(path);  // the old dataset closed before it goes
    remove(path);
    const Id ds(H5Dcreate2(file_, path, H5T_IEEE_F32LE, space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose,
                std::string("H5Dcreate2 ") + path);
  }

 private:
  // An identifier of an edit, checked when made and closed when it goes (a destructor cannot throw: a
  // failed close, which may drop the edit's data, is the current test's failure).
  struct Id {
    Id(hid_t i, herr_t (*c)(hid_t), const std::string& what) : id(h5(i, what)), close(c) {}
    Id(const Id&) = delete;
    Id& operator=(const Id&) = delete;
    ~Id() {
      if (close(id) < 0) ADD_FAILURE() << "RawGolden: HDF5 cannot close an identifier of the edit";
    }
    const hid_t id;
    herr_t (*const close)(hid_t);
  };

  void add_string(const char* object, const char* name, const std::string& value) {
    const std::string what = std::string(object) + "@" + name;
    const Id type(H5Tcopy(H5T_C_S1), H5Tclose, "H5Tcopy for " + what);
    h5(H5Tset_size(type.id, H5T_VARIABLE), "H5Tset_size for " + what);
    h5(H5Tset_cset(type.id, H5T_CSET_UTF8), "H5Tset_cset for " + what);
    const Id space(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate for " + what);
    const Id attr(H5Acreate_by_name(file_, object, name, type.id, space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                  H5Aclose, "H5Acreate_by_name " + what);
    const char* p = value.c_str();
    h5(H5Awrite(attr.id, type.id, &p), "H5Awrite " + what);
  }

  std::string string_of(const char* object, const char* name) {
    const std::string what = std::string(object) + "@" + name;
    const Id attr(H5Aopen_by_name(file_, object, name, H5P_DEFAULT, H5P_DEFAULT), H5Aclose, "H5Aopen_by_name " + what);
    const Id type(H5Aget_type(attr.id), H5Tclose, "H5Aget_type " + what);
    char* value = nullptr;
    h5(H5Aread(attr.id, type.id, &value), "H5Aread " + what);
    const std::string out = value ? value : "";
    h5(H5free_memory(value), "H5free_memory " + what);
    return out;
  }

  // Replaces a dataset by one of the same type, shape, elements (written where `with_data`) and string
  // attributes (dtype, sha256), made with the creation properties `dcpl`.
  void recreate(const char* path, hid_t dcpl, bool with_data) {
    const std::string dtype = string_of(path, "dtype"), sha256 = string_of(path, "sha256");
    const Id old(H5Dopen2(file_, path, H5P_DEFAULT), H5Dclose, std::string("H5Dopen2 ") + path);
    const Id type(H5Dget_type(old.id), H5Tclose, std::string("H5Dget_type ") + path);
    const Id space(H5Dget_space(old.id), H5Sclose, std::string("H5Dget_space ") + path);
    std::vector<unsigned char> data(
        size_t(h5(H5Sget_simple_extent_npoints(space.id), std::string("H5Sget_simple_extent_npoints ") + path)) *
        H5Tget_size(type.id));
    h5(H5Dread(old.id, type.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), std::string("H5Dread ") + path);
    remove(path);  // the old dataset, still open, goes when closed
    const Id ds(H5Dcreate2(file_, path, type.id, space.id, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose,
                std::string("H5Dcreate2 ") + path);
    if (with_data)
      h5(H5Dwrite(ds.id, type.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), std::string("H5Dwrite ") + path);
    add_string(path, "dtype", dtype);
    add_string(path, "sha256", sha256);
  }

  Id dataspace_of(const char* path) {
    const Id ds(H5Dopen2(file_, path, H5P_DEFAULT), H5Dclose, std::string("H5Dopen2 ") + path);
    return Id(H5Dget_space(ds.id), H5Sclose, std::string("H5Dget_space ") + path);
  }

  std::filesystem::path path_;
  hid_t file_;
};

}  // namespace mok::golden::testing
