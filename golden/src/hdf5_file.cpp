// Golden format v1 on HDF5 (docs/golden-format.md): every HDF5 call checked, errors as mok::Error
// naming the file, the object and HDF5's own reason.
#include <hdf5.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <mutex>
#include <type_traits>
#include <utility>

#include "chunk_codec.h"
#include "hdf5_guard.h"
#include "mok/core/fields.h"
#include "mok/core/validate.h"
#include "mok/golden/atomic_file.h"
#include "mok/golden/file_kind.h"
#include "mok/golden/golden.h"
#include "mok/golden/seal.h"
#include "mok/golden/sha256.h"

namespace mok::golden {
namespace {

constexpr const char* kFormatName = "mok-golden";
constexpr int kDeflateLevel = 6;
// Reading a golden holds its tensors and the file's image. (Its users check what they add: regenerate,
// mok-verify's reference backend.)
constexpr double kReadCopies = 2;
constexpr size_t kChunkBytes = size_t(1) << 20;  // target size of a dataset chunk before compression
constexpr uint64_t kMaxInflation = 1032;         // deflate's largest ratio: 258 bytes per 2 bits at best

// HDF5 prints its error stack to stderr by default; every failure here becomes an exception instead.
void silence_hdf5() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (H5open() < 0 || H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr) < 0)
      throw Error("mok: cannot initialise the HDF5 library");
  });
}

herr_t keep_innermost(unsigned n, const H5E_error2_t* err, void* out) {
  if (n == 0 && err->desc) *static_cast<std::string*>(out) = err->desc;
  return 0;
}

// The most specific message on HDF5's error stack (then cleared), e.g. "truncated file: eof = ...".
// Called while an error is being raised: a failed walk leaves the reason empty and a failed clear
// leaves a stack that the next HDF5 call clears on entry, so their statuses are dropped rather than
// let hide the error being raised.
std::string hdf5_reason() {
  std::string reason;
  (void)H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, keep_innermost, &reason);
  (void)H5Eclear2(H5E_DEFAULT);
  return reason.empty() ? "" : " (HDF5: " + reason + ")";
}

template <class R>
R check(R result, const std::string& what) {
  if (result < 0) throw Error(what + hdf5_reason());
  return result;
}

// An HDF5 identifier closed by its own close function.
class Handle {
 public:
  Handle(hid_t id, herr_t (*close)(hid_t), const std::string& what) : id_(check(id, what)), close_(close) {}
  Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, H5I_INVALID_HID)), close_(other.close_) {}
  // Unchecked: a destructor cannot throw. It closes the handles of a file that is read (closing
  // writes nothing), those that hold no data of the file (property lists, types, dataspaces), and any
  // handle while an error is on its way out. A write's file, group, dataset and attribute handles are
  // closed by close(), checked, since their close may write (a dataset's flushes its chunk cache).
  ~Handle() {
    if (id_ != H5I_INVALID_HID) (void)close_(id_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle& operator=(Handle&&) = delete;
  hid_t get() const { return id_; }

  // Closes now, checked (a file's close writes its last metadata).
  void close(const std::string& what) { check(close_(std::exchange(id_, H5I_INVALID_HID)), what); }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// The object that the link `name` of `parent` names, checked before the library decodes it: a hard link
// (a soft link is nothing the writer makes; an external link's object, like a virtual or external
// dataset's data, lies in another file, which the seal does not cover), and its object header on the
// file's bytes (hdf5_guard.h). `where` is its path ("/inputs/x").
void check_object(RawHdf5& raw, hid_t parent, const std::string& name, const std::string& where) {
  H5L_info_t link;
  check(H5Lget_info(parent, name.c_str(), &link, H5P_DEFAULT), "cannot look up " + where);
  if (link.type != H5L_TYPE_HARD)
    throw Error(where + " is a" +
                (link.type == H5L_TYPE_SOFT       ? " soft"
                 : link.type == H5L_TYPE_EXTERNAL ? "n external"
                                                  : " user-defined") +
                " link, no object of this file: the file is corrupt or was edited");
#if H5_VERSION_GE(1, 12, 0)
  haddr_t address = HADDR_UNDEF;
  check(H5VLnative_token_to_addr(parent, link.u.token, &address), "cannot locate " + where);
#else
  const haddr_t address = link.u.address;
#endif
  raw.check_object_header(where, address);
}

Handle open_group(RawHdf5& raw, hid_t parent, const std::string& path) {
  const htri_t exists = check(H5Lexists(parent, path.c_str(), H5P_DEFAULT), "cannot look up group " + path);
  if (!exists) throw Error("missing group " + path);
  const std::string where = path.front() == '/' ? path : "/" + path;
  check_object(raw, parent, path, where);
  raw.check_symbol_table(where);  // before the library looks a name up in the group
  return Handle(H5Gopen2(parent, path.c_str(), H5P_DEFAULT), H5Gclose, "cannot open group " + path);
}

Handle create_group(hid_t parent, const std::string& path) {
  Handle gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose, "cannot create a group property list");
  check(H5Pset_obj_track_times(gcpl.get(), false), "cannot turn off time tracking");
  return Handle(H5Gcreate2(parent, path.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), H5Gclose,
                "cannot create group " + path);
}

// ---- attributes: scalars of fixed little-endian types, strings variable-length UTF-8 -----------

void write_attribute(hid_t obj, const std::string& where, const char* name, hid_t file_type, hid_t mem_type,
                     const void* value) {
  const std::string what = "attribute " + where + "@" + name;
  Handle space(H5Screate(H5S_SCALAR), H5Sclose, "cannot create a scalar dataspace");
  Handle attr(H5Acreate2(obj, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
              "cannot create " + what);
  check(H5Awrite(attr.get(), mem_type, value), "cannot write " + what);
  attr.close("cannot close " + what);
}

Handle string_type() {
  Handle t(H5Tcopy(H5T_C_S1), H5Tclose, "cannot copy the string type");
  check(H5Tset_size(t.get(), H5T_VARIABLE), "cannot make a variable-length string type");
  check(H5Tset_cset(t.get(), H5T_CSET_UTF8), "cannot set the UTF-8 character set");
  return t;
}

void write_string(hid_t obj, const std::string& where, const char* name, const std::string& value) {
  // A C string ends at its first NUL: the rest was lost, and the content hash (of the whole string) then refused
  // the file the writer had just made.
  if (value.find('\0') != std::string::npos)
    throw Error("attribute " + where + "@" + name + " holds a NUL byte, which an HDF5 string cannot hold");
  Handle t = string_type();
  const char* p = value.c_str();
  write_attribute(obj, where, name, t.get(), t.get(), &p);
}

void write_i32(hid_t obj, const std::string& where, const char* name, int32_t v) {
  write_attribute(obj, where, name, H5T_STD_I32LE, H5T_NATIVE_INT32, &v);
}

void write_u64(hid_t obj, const std::string& where, const char* name, uint64_t v) {
  write_attribute(obj, where, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &v);
}

void write_f32(hid_t obj, const std::string& where, const char* name, float v) {
  write_attribute(obj, where, name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, &v);
}

void write_f64(hid_t obj, const std::string& where, const char* name, double v) {
  write_attribute(obj, where, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v);
}

bool has_attribute(hid_t obj, const std::string& where, const char* name) {
  return check(H5Aexists(obj, name), "cannot look up attribute " + where + "@" + name) > 0;
}

// Opens a scalar attribute whose type is of the given class.
Handle open_attribute(hid_t obj, const std::string& where, const char* name, H5T_class_t type_class) {
  const std::string what = "attribute " + where + "@" + name;
  if (!has_attribute(obj, where, name)) throw Error("missing " + what);
  Handle attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose, "cannot open " + what);
  Handle space(H5Aget_space(attr.get()), H5Sclose, "cannot get the dataspace of " + what);
  if (check(H5Sget_simple_extent_type(space.get()), "cannot read the dataspace of " + what) != H5S_SCALAR)
    throw Error(what + " is not a scalar");
  Handle type(H5Aget_type(attr.get()), H5Tclose, "cannot get the type of " + what);
  if (check(H5Tget_class(type.get()), "cannot get the type class of " + what) != type_class)
    throw Error(what + " has the wrong type class");
  return attr;
}

template <class T>
T read_number(hid_t obj, const std::string& where, const char* name, H5T_class_t type_class, hid_t mem_type) {
  Handle attr = open_attribute(obj, where, name, type_class);
  T v{};
  check(H5Aread(attr.get(), mem_type, &v), "cannot read attribute " + where + "@" + name);
  return v;
}

int32_t read_i32(hid_t obj, const std::string& where, const char* name) {
  return read_number<int32_t>(obj, where, name, H5T_INTEGER, H5T_NATIVE_INT32);
}

uint64_t read_u64(hid_t obj, const std::string& where, const char* name) {
  return read_number<uint64_t>(obj, where, name, H5T_INTEGER, H5T_NATIVE_UINT64);
}

float read_f32(hid_t obj, const std::string& where, const char* name) {
  return read_number<float>(obj, where, name, H5T_FLOAT, H5T_NATIVE_FLOAT);
}

double read_f64(hid_t obj, const std::string& where, const char* name) {
  return read_number<double>(obj, where, name, H5T_FLOAT, H5T_NATIVE_DOUBLE);
}

bool read_flag(hid_t obj, const std::string& where, const char* name) {
  const int32_t v = read_i32(obj, where, name);
  if (v != 0 && v != 1) throw Error("attribute " + where + "@" + name + " = " + std::to_string(v) + " is not 0 or 1");
  return v == 1;
}

std::string read_string(RawHdf5& raw, hid_t obj, const std::string& where, const char* name) {
  const std::string what = "attribute " + where + "@" + name;
  Handle attr = open_attribute(obj, where, name, H5T_STRING);
  Handle file_type(H5Aget_type(attr.get()), H5Tclose, "cannot get the type of " + what);
  if (check(H5Tis_variable_str(file_type.get()), "cannot inspect the type of " + what) <= 0)
    throw Error(what + " is not a variable-length string");
  raw.check_string_attribute(where, name);  // its global heap object, which the library reads unchecked
  Handle t = string_type();
  char* value = nullptr;
  check(H5Aread(attr.get(), t.get(), &value), "cannot read " + what);
  std::string out = value ? value : "";
  check(H5free_memory(value), "cannot free the string of " + what);
  return out;
}

// ---- datasets -------------------------------------------------------------------------------------

hid_t file_type_of(DType d) {
  return d == DType::bf16 ? H5T_STD_U16LE : d == DType::f32 ? H5T_IEEE_F32LE : H5T_STD_I32LE;
}

hid_t memory_type_of(DType d) {
  return d == DType::bf16 ? H5T_NATIVE_UINT16 : d == DType::f32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_INT32;
}

std::string type_description(DType d) {
  return d == DType::bf16  ? "uint16 little-endian (bf16 bits)"
         : d == DType::f32 ? "float32 little-endian"
                           : "int32 little-endian";
}

void write_dataset(hid_t group, const std::string& path, const Tensor& t, const TensorSpec& spec,
                   const OracleAccuracy* oracle) {
  if (t.dtype != spec.dtype || t.shape != spec.shape)
    throw Error("dataset " + path + ": tensor is " + to_string(t.dtype) + " " + shape_text(t.shape) +
                ", format v1 expects " + to_string(spec.dtype) + " " + shape_text(spec.shape));
  if (t.bytes.size() != size_t(t.elements()) * element_size(t.dtype))
    throw Error("dataset " + path + ": tensor holds " + std::to_string(t.bytes.size()) + " bytes, its shape " +
                shape_text(t.shape) + " needs " + std::to_string(t.elements() * element_size(t.dtype)));
  std::vector<hsize_t> dims(t.shape.begin(), t.shape.end()), chunk(dims);
  const size_t row_bytes = size_t(t.elements() / t.shape[0]) * element_size(t.dtype);
  chunk[0] = std::clamp<hsize_t>(kChunkBytes / row_bytes, 1, dims[0]);
  Handle space(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose,
               "cannot create the dataspace of " + path);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "cannot create a dataset property list");
  check(H5Pset_obj_track_times(dcpl.get(), false), "cannot turn off time tracking");
  check(H5Pset_chunk(dcpl.get(), int(chunk.size()), chunk.data()), "cannot set the chunks of " + path);
  check(H5Pset_shuffle(dcpl.get()), "cannot set the shuffle filter of " + path);
  check(H5Pset_deflate(dcpl.get(), kDeflateLevel), "cannot set the deflate filter of " + path);
  Handle ds(
      H5Dcreate2(group, spec.name.c_str(), file_type_of(t.dtype), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
      H5Dclose, "cannot create dataset " + path);
  check(H5Dwrite(ds.get(), memory_type_of(t.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.bytes.data()),
        "cannot write dataset " + path);
  write_string(ds.get(), path, "dtype", to_string(t.dtype));
  write_string(ds.get(), path, "sha256", sha256_hex(t.bytes.data(), t.bytes.size()));
  if (oracle) {
    write_f64(ds.get(), path, "oracle_rel_error", oracle->rel_error);
    write_f64(ds.get(), path, "oracle_rel_bound", oracle->bound);
  }
  ds.close("cannot close dataset " + path);
}

std::string dims_text(const std::vector<hsize_t>& dims) {
  return shape_text(std::vector<int64_t>(dims.begin(), dims.end()));
}

std::string layout_name(H5D_layout_t layout) {
  return layout == H5D_COMPACT      ? "compact"
         : layout == H5D_CONTIGUOUS ? "contiguous"
         : layout == H5D_VIRTUAL    ? "virtual"
                                    : "unknown";
}

std::string filter_names(const std::vector<H5Z_filter_t>& filters) {
  std::string names = "[";
  for (const H5Z_filter_t f : filters) {
    if (names.size() > 1) names += ", ";
    names += f == H5Z_FILTER_DEFLATE       ? "deflate"
             : f == H5Z_FILTER_SHUFFLE     ? "shuffle"
             : f == H5Z_FILTER_FLETCHER32  ? "fletcher32"
             : f == H5Z_FILTER_SZIP        ? "szip"
             : f == H5Z_FILTER_NBIT        ? "nbit"
             : f == H5Z_FILTER_SCALEOFFSET ? "scaleoffset"
                                           : "filter " + std::to_string(f);
  }
  return names + "]";
}

// Format v1's storage, the writer's: chunks of at least one element and at most the dataset on each axis,
// through the shuffle filter and then deflate (which read_chunks undoes). Any other layout holds data
// this reader does not decode (external files, a virtual dataset's sources in other files).
std::vector<hsize_t> chunk_dims_of(hid_t ds, const std::string& path, const std::vector<int64_t>& shape) {
  Handle dcpl(H5Dget_create_plist(ds), H5Pclose, "cannot get the storage properties of dataset " + path);
  const H5D_layout_t layout = check(H5Pget_layout(dcpl.get()), "cannot get the storage layout of dataset " + path);
  if (layout != H5D_CHUNKED)
    throw Error("dataset " + path + " is stored " + layout_name(layout) + ", format v1 stores datasets in chunks");
  std::vector<H5Z_filter_t> filters;
  for (int i = 0, n = check(H5Pget_nfilters(dcpl.get()), "cannot count the filters of dataset " + path); i < n; ++i) {
    unsigned flags = 0, config = 0;
    size_t values = 0;
    filters.push_back(check(H5Pget_filter2(dcpl.get(), unsigned(i), &flags, &values, nullptr, 0, nullptr, &config),
                            "cannot get a filter of dataset " + path));
  }
  if (filters != std::vector<H5Z_filter_t>{H5Z_FILTER_SHUFFLE, H5Z_FILTER_DEFLATE})
    throw Error("dataset " + path + " is stored through the filters " + filter_names(filters) +
                ", format v1's are [shuffle, deflate]");
  std::vector<hsize_t> chunk(shape.size());
  if (check(H5Pget_chunk(dcpl.get(), int(chunk.size()), chunk.data()), "cannot get the chunks of dataset " + path) !=
      int(shape.size()))
    throw Error("dataset " + path + " has chunks of another rank than its shape");
  for (size_t i = 0; i < shape.size(); ++i)
    if (chunk[i] < 1 || chunk[i] > hsize_t(shape[i]))
      throw Error("dataset " + path + " has chunks of " + dims_text(chunk) + ", not inside its shape " +
                  shape_text(shape));
  return chunk;
}

// The bytes the chunk at `origin` stores: present (the writer writes every chunk), and no more than the
// file holds.
hsize_t stored_bytes(hid_t ds, const std::vector<hsize_t>& origin, uintmax_t file_bytes, const std::string& what) {
  hsize_t bytes = 0;
  check(H5Dget_chunk_storage_size(ds, origin.data(), &bytes), "cannot look up " + what);
  if (bytes == 0) throw Error(what + " is missing");
  if (bytes > file_bytes)
    throw Error(what + " claims " + std::to_string(bytes) + " bytes, more than the file's " +
                std::to_string(file_bytes));
  return bytes;
}

// The dataset's elements, from its raw chunks decoded by chunk_codec.h: before anything is allocated,
// the chunks' stored bytes must fit the file and could inflate to the shape's bytes; then no chunk
// inflates past its own size (the library's deflate filter grows without bound).
std::vector<uint8_t> read_chunks(hid_t ds, const std::string& path, const TensorSpec& spec, uintmax_t file_bytes) {
  const std::vector<hsize_t> chunk = chunk_dims_of(ds, path, spec.shape);
  const size_t element = element_size(spec.dtype);
  size_t chunk_bytes = element, chunks = 1;
  for (size_t i = 0; i < chunk.size(); ++i) {
    chunk_bytes *= chunk[i];  // at most the tensor's bytes, which fit this machine's memory (read_config)
    chunks *= (hsize_t(spec.shape[i]) + chunk[i] - 1) / chunk[i];
  }
  const auto chunk_name = [&](const std::vector<hsize_t>& origin) {
    return "dataset " + path + ": the chunk at " + dims_text(origin);
  };
  if (chunks > file_bytes)
    throw Error("dataset " + path + " has " + std::to_string(chunks) + " chunks, more than the file's bytes");
  uintmax_t stored = 0;
  std::vector<hsize_t> sizes;  // each chunk's stored bytes, in C order
  std::vector<hsize_t> origin(chunk.size(), 0);
  do {
    const hsize_t bytes = stored_bytes(ds, origin, file_bytes, chunk_name(origin));
    if (chunk_bytes / kMaxInflation > bytes)
      throw Error(chunk_name(origin) + " stores " + std::to_string(bytes) +
                  " bytes, which no deflate stream inflates to its " + std::to_string(chunk_bytes));
    stored += bytes;
    sizes.push_back(bytes);
  } while (next_chunk(origin, chunk, spec.shape));
  if (stored > file_bytes)
    throw Error("dataset " + path + ": its chunks claim " + std::to_string(stored) + " bytes, more than the file's " +
                std::to_string(file_bytes));
  std::vector<uint8_t> out(size_t(Tensor{spec.name, spec.dtype, spec.shape, {}}.elements()) * element);
  const std::vector<uint64_t> chunk_dims(chunk.begin(), chunk.end());  // copy_chunk's
  // origin is back at the first chunk: next_chunk resets it after the last.
  for (const hsize_t size : sizes) {
    const std::string what = chunk_name(origin);
    std::vector<uint8_t> bytes(size);
    uint32_t skipped = 0;  // bit i: filter i (0 shuffle, 1 deflate) was not applied to this chunk
    check(H5Dread_chunk(ds, H5P_DEFAULT, origin.data(), &skipped, bytes.data()), "cannot read " + what);
    if (skipped != 0) fail_internal(what + " skips filters: the guard refuses such chunks (check_chunk_entry)");
    bytes = inflate_exactly(bytes, chunk_bytes, what);
    unshuffle(bytes, element);
    copy_chunk(bytes.data(), chunk_dims, {origin.begin(), origin.end()}, spec.shape, element, out.data());
    next_chunk(origin, chunk, spec.shape);
  }
  return out;
}

Tensor read_dataset(RawHdf5& raw, hid_t group, const std::string& path, const TensorSpec& spec) {
  const htri_t exists = check(H5Lexists(group, spec.name.c_str(), H5P_DEFAULT), "cannot look up dataset " + path);
  if (!exists) throw Error("missing dataset " + path);
  check_object(raw, group, spec.name, path);
  Handle ds(H5Dopen2(group, spec.name.c_str(), H5P_DEFAULT), H5Dclose, "cannot open dataset " + path);
  Handle type(H5Dget_type(ds.get()), H5Tclose, "cannot get the type of dataset " + path);
  if (check(H5Tequal(type.get(), file_type_of(spec.dtype)), "cannot compare the type of dataset " + path) <= 0)
    throw Error("dataset " + path + " has the wrong element type, expected " + type_description(spec.dtype));
  const std::string dtype = read_string(raw, ds.get(), path, "dtype");
  if (dtype != to_string(spec.dtype))
    throw Error("dataset " + path + "@dtype is " + quote_input(dtype) + ", expected '" + to_string(spec.dtype) + "'");
  Handle space(H5Dget_space(ds.get()), H5Sclose, "cannot get the dataspace of dataset " + path);
  const int rank = check(H5Sget_simple_extent_ndims(space.get()), "cannot read the rank of dataset " + path);
  std::vector<hsize_t> dims(size_t(std::max(rank, 0)));
  check(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), "cannot read the shape of dataset " + path);
  const std::vector<int64_t> shape(dims.begin(), dims.end());
  if (shape != spec.shape)
    throw Error("dataset " + path + " has shape " + shape_text(shape) + ", the config gives " + shape_text(spec.shape));
  Tensor t{spec.name, spec.dtype, spec.shape, read_chunks(ds.get(), path, spec, raw.file_bytes())};
  const std::string stored = read_string(raw, ds.get(), path, "sha256");
  const std::string computed = sha256_hex(t.bytes.data(), t.bytes.size());
  if (stored != computed)
    throw Error("dataset " + path + ": SHA-256 mismatch, stored " + quote_input(stored) + ", data hashes to " +
                computed + ": the file is corrupt or was edited");
  return t;
}

// A dataset's fp64-oracle accuracy: both attributes or neither (an error without its bound was dropped
// in silence), an error not negative (infinity or NaN where the oracle's sums overflow or its scale is
// all zero: they fail every bound) and a positive, finite bound (ref::oracle_bound's). A negative error
// or a NaN bound read, and mok-verify printed "-1 + 0 <= 0.0312 yes".
OracleAccuracy read_oracle_accuracy(hid_t ds, const std::string& path) {
  const OracleAccuracy a{read_f64(ds, path, "oracle_rel_error"), read_f64(ds, path, "oracle_rel_bound")};
  if (a.rel_error < 0)
    throw Error("attribute " + path + "@oracle_rel_error = " + std::to_string(a.rel_error) + " is negative");
  if (!(a.bound > 0 && std::isfinite(a.bound)))
    throw Error("attribute " + path + "@oracle_rel_bound = " + std::to_string(a.bound) + " is not positive and finite");
  return a;
}

// ---- the file ---------------------------------------------------------------------------------------

// Every scalar of the config (mok/core/fields.h), as an attribute of /config, in the visitor's order.
// precision is written only when it is fp8: a bf16 golden is the file it was before the FP8 mode, and
// a reader takes a missing precision for bf16.
void write_config(hid_t root, const LayerConfig& c) {
  Handle g = create_group(root, "config");
  const hid_t id = g.get();
  const std::string w = "/config";
  for_each_field(c, [&](const char* name, const auto& value) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<T, Precision>) {
      if (value != Precision::bf16) write_string(id, w, name, to_string(value));
    } else if constexpr (std::is_same_v<T, ScoreMode>)
      write_string(id, w, name, to_string(value));
    else if constexpr (std::is_same_v<T, float>)
      write_f32(id, w, name, value);
    else
      write_i32(id, w, name, int32_t(value));  // int32_t, and bool as 0 / 1
  });
  g.close("cannot close group /config");
}

LayerConfig read_config(RawHdf5& raw, hid_t root) {
  Handle g = open_group(raw, root, "config");
  const hid_t id = g.get();
  const std::string w = "/config";
  LayerConfig c;
  for_each_field(c, [&](const char* name, auto& value) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<T, Precision>)
      value = has_attribute(id, w, name) ? precision_from_string(read_string(raw, id, w, name)) : Precision::bf16;
    else if constexpr (std::is_same_v<T, ScoreMode>)
      value = score_mode_from_string(read_string(raw, id, w, name));
    else if constexpr (std::is_same_v<T, float>)
      value = read_f32(id, w, name);
    else if constexpr (std::is_same_v<T, bool>)
      value = read_flag(id, w, name);
    else
      value = read_i32(id, w, name);
  });
  validate(c);
  require_fits_in_memory(c, kReadCopies);  // before any dataset of this config is allocated
  return c;
}

void write_options(hid_t root, const ref::Options& o) {
  Handle g = create_group(root, "options");
  write_string(g.get(), "/options", "step", to_string(o.step));
  write_i32(g.get(), "/options", "ring_rows", o.ring_rows);
  write_i32(g.get(), "/options", "recompute", o.recompute);
  // Only where set: the files without it (every one before it) read as before.
  if (o.fp8_weight_gradients) write_i32(g.get(), "/options", "fp8_weight_gradients", 1);
  g.close("cannot close group /options");
}

ref::Options read_options(RawHdf5& raw, hid_t root) {
  Handle g = open_group(raw, root, "options");
  ref::Options o;
  o.step = step_model_from_string(read_string(raw, g.get(), "/options", "step"));
  o.ring_rows = read_i32(g.get(), "/options", "ring_rows");
  if (const std::string problem = ring_rows_problem(o.ring_rows); !problem.empty())
    throw Error("attribute /options@" + problem);
  o.recompute = read_flag(g.get(), "/options", "recompute");
  o.fp8_weight_gradients = has_attribute(g.get(), "/options", "fp8_weight_gradients") &&
                           read_flag(g.get(), "/options", "fp8_weight_gradients");
  return o;
}

void write_recipe(hid_t root, const Recipe& r) {
  Handle g = create_group(root, "recipe");
  write_u64(g.get(), "/recipe", "seed", r.seed);
  write_string(g.get(), "/recipe", "routing_kind", ref::to_string(r.routing));
  write_f64(g.get(), "/recipe", "zipf_s", r.zipf_s);
  g.close("cannot close group /recipe");
}

// A recipe routes as the inputs do (its router, or the given routing they hold): one that did not made the
// golden's inputs again with another routing (mok-golden check and mok-verify judged such a file apart).
void require_recipe_matches(const std::optional<Recipe>& recipe, bool routing_given) {
  if (recipe && ref::routed_by_router(recipe->routing) == routing_given)
    throw Error("group /recipe's routing_kind " + ref::to_string(recipe->routing) + " contradicts the inputs, which " +
                (routing_given ? "hold a given routing (/@routing_source given)"
                               : "hold none (/@routing_source router: the router routes)"));
}

Recipe read_recipe(RawHdf5& raw, hid_t root) {
  Handle g = open_group(raw, root, "recipe");
  Recipe r;
  r.seed = read_u64(g.get(), "/recipe", "seed");
  r.routing = ref::routing_kind_from_string(read_string(raw, g.get(), "/recipe", "routing_kind"));
  r.zipf_s = read_f64(g.get(), "/recipe", "zipf_s");
  ref::validate_zipf_s(r.zipf_s);
  return r;
}

// "/outputs/y" (appended piecewise: GCC 12 warns falsely on "/" + std::string temporaries).
std::string dataset_path(Group group, const std::string& name) {
  std::string path = "/";
  path += to_string(group);
  path += '/';
  path += name;
  return path;
}

const std::vector<Tensor>& group_tensors(const GoldenCase& g, Group group) {
  return group == Group::inputs ? g.inputs : group == Group::routing ? g.results.routing : g.results.outputs;
}

std::vector<Tensor>& group_tensors(GoldenCase& g, Group group) {
  return group == Group::inputs ? g.inputs : group == Group::routing ? g.results.routing : g.results.outputs;
}

// Everything a golden says, as canonical text: every attribute (floats as their bits) and every
// dataset's name, dtype, shape and SHA-256. Its digest, the root attribute content_sha256, makes
// any change to the metadata as detectable as a change to the data.
std::string content_text(const GoldenCase& g) {
  std::string t;
  const auto line = [&](const std::string& key, const std::string& value) { t += key + "=" + value + "\n"; };
  const auto bits = [](float v) { return std::to_string(bits_of(v)); };
  const LayerConfig& c = g.config;
  line("format_version", std::to_string(g.format_version));
  line("numerics_model_version", std::to_string(g.numerics_version));
  line("generator_revision", g.generator);
  line("name", g.name);
  line("description", g.description);
  line("routing_source", g.routing_given() ? "given" : "router");
  for (const auto& [key, value] : {std::pair<const char*, int32_t>{"ranks", c.ranks},
                                   {"tokens_per_rank", c.tokens_per_rank},
                                   {"experts", c.experts},
                                   {"hidden", c.hidden},
                                   {"intermediate", c.intermediate},
                                   {"top_k", c.top_k},
                                   {"renormalize", c.renormalize},
                                   {"n_group", c.n_group},
                                   {"topk_group", c.topk_group},
                                   {"shared_intermediate", c.shared_intermediate},
                                   {"ring_rows", g.options.ring_rows},
                                   {"recompute", g.options.recompute}})
    line(key, std::to_string(value));
  line("score_mode", to_string(c.score_mode));
  line("routed_scale", bits(c.routed_scale));
  line("swiglu_limit", bits(c.swiglu_limit));
  if (c.precision != Precision::bf16) line("precision", to_string(c.precision));  // bf16 goldens hash as before
  line("step", to_string(g.options.step));
  if (g.options.fp8_weight_gradients) line("fp8_weight_gradients", "1");  // the files without it hash as before
  if (g.recipe) {
    line("seed", std::to_string(g.recipe->seed));
    line("routing_kind", ref::to_string(g.recipe->routing));
    line("zipf_s", std::to_string(std::bit_cast<uint64_t>(g.recipe->zipf_s)));
  }
  for (const Group group : {Group::inputs, Group::routing, Group::outputs})
    for (const Tensor& x : group_tensors(g, group)) {
      std::string description = to_string(x.dtype);
      for (int64_t d : x.shape) (description += ' ') += std::to_string(d);
      (description += ' ') += sha256_hex(x.bytes.data(), x.bytes.size());
      line(dataset_path(group, x.name), description);
    }
  for (const auto& [name, accuracy] : g.oracle)
    line("oracle " + name, std::to_string(std::bit_cast<uint64_t>(accuracy.rel_error)) + " " +
                               std::to_string(std::bit_cast<uint64_t>(accuracy.bound)));
  return t;
}

std::string content_sha256(const GoldenCase& g) {
  const std::string text = content_text(g);
  return sha256_hex(text.data(), text.size());
}

// The golden's HDF5 file, made in memory (the core driver, no backing store) and returned as its bytes,
// the seal block still empty: HDF5 never holds a descriptor to the file on disk, so a full disk or a
// failed write is the byte writer's checked error (write_bytes_atomically), never a half-closed HDF5
// file (whose close at exit crashed).
std::string golden_image(const GoldenCase& g) {
  if (g.format_version != kFormatVersion || g.numerics_version != kNumericsModelVersion)
    throw Error("the case claims format version " + std::to_string(g.format_version) + " and numerics model version " +
                std::to_string(g.numerics_version) + "; this build writes only " + std::to_string(kFormatVersion) +
                " and " + std::to_string(kNumericsModelVersion));
  validate(g.config);
  require_recipe_matches(g.recipe, g.routing_given());
  const std::vector<TensorSpec> specs = tensor_specs(g.config, g.routing_given());
  for (const Group group : {Group::inputs, Group::routing, Group::outputs})
    if (group_tensors(g, group).size() !=
        size_t(std::count_if(specs.begin(), specs.end(), [&](const TensorSpec& s) { return s.group == group; })))
      throw Error("group " + dataset_path(group, "") + " holds " + std::to_string(group_tensors(g, group).size()) +
                  " tensors, this config needs the datasets listed in docs/golden-format.md");
  for (const auto& [name, accuracy] : g.oracle)
    if (std::none_of(specs.begin(), specs.end(), [&](const TensorSpec& s) {
          return s.group != Group::inputs && s.name == name && s.dtype != DType::i32;
        }))
      throw Error("oracle accuracy given for " + name + ", which is no float result of this config");

  Handle fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose, "cannot create a file property list");
  check(H5Pset_obj_track_times(fcpl.get(), false), "cannot turn off time tracking");
  check(H5Pset_userblock(fcpl.get(), kSealBytes), "cannot reserve the seal block");
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "cannot create a file access property list");
  check(H5Pset_fapl_core(fapl.get(), kChunkBytes, false), "cannot select the in-memory file driver");
  Handle f(H5Fcreate("golden.h5", H5F_ACC_TRUNC, fcpl.get(), fapl.get()), H5Fclose, "cannot create the file");
  const hid_t root = f.get();
  write_string(root, "/", "format", kFormatName);
  write_i32(root, "/", "format_version", kFormatVersion);
  write_i32(root, "/", "numerics_model_version", kNumericsModelVersion);
  write_string(root, "/", "generator_revision", g.generator);
  write_string(root, "/", "name", g.name);
  write_string(root, "/", "description", g.description);
  write_string(root, "/", "routing_source", g.routing_given() ? "given" : "router");
  write_config(root, g.config);
  write_options(root, g.options);
  if (g.recipe) write_recipe(root, *g.recipe);
  for (const Group group : {Group::inputs, Group::routing, Group::outputs}) {
    Handle h = create_group(root, to_string(group));
    size_t next = 0;
    for (const TensorSpec& s : specs) {
      if (s.group != group) continue;
      const Tensor& t = group_tensors(g, group)[next++];
      const std::string path = dataset_path(group, s.name);
      if (t.name != s.name) throw Error("dataset " + path + ": tensor in its place is named " + t.name);
      const auto oracle = g.oracle.find(s.name);
      write_dataset(h.get(), path, t, s, oracle == g.oracle.end() ? nullptr : &oracle->second);
    }
    h.close("cannot close group " + dataset_path(group, ""));
  }
  write_string(root, "/", "content_sha256", content_sha256(g));
  check(H5Fflush(root, H5F_SCOPE_GLOBAL), "cannot flush the file");
  // The image is HDF5's data without the user block (the seal's): the block is put back in front.
  const size_t bytes = size_t(check(H5Fget_file_image(root, nullptr, 0), "cannot size the file image"));
  std::string image(kSealBytes + bytes, '\0');
  check(H5Fget_file_image(root, image.data() + kSealBytes, bytes), "cannot copy the file image");
  f.close("cannot close the file");
  return image;
}

// The file's bytes, for the checks of hdf5_guard.h (made for 8-byte addresses and lengths, the writer's,
// relative to the seal block): the superblock, the root group's object header and symbol table, checked
// before H5Fopen, which decodes the root group's object header.
RawHdf5 raw_file(const std::string& path) {
  RawHdf5 raw(path, kSealBytes);
  raw.check_object_header("/", raw.root_address());
  raw.check_symbol_table("/");
  return raw;
}

// The library's view of the file agrees with the checks': 8-byte addresses and lengths, the seal block as
// its user block.
void check_file_layout(hid_t file) {
  Handle fcpl(H5Fget_create_plist(file), H5Pclose, "cannot get the file's creation properties");
  size_t address_bytes = 0, length_bytes = 0;
  hsize_t user_block = 0;
  check(H5Pget_sizes(fcpl.get(), &address_bytes, &length_bytes), "cannot get the file's address sizes");
  check(H5Pget_userblock(fcpl.get(), &user_block), "cannot get the file's user block size");
  if (address_bytes != 8 || length_bytes != 8 || user_block != kSealBytes)
    throw Error("HDF5 addresses of " + std::to_string(address_bytes) + " bytes, lengths of " +
                std::to_string(length_bytes) + " and a user block of " + std::to_string(user_block) +
                " bytes: not the writer's 8, 8 and 512 (the file is corrupt or was edited)");
}

GoldenCase read_file(const std::string& file) {
  if (const std::string kind = not_a_regular_file(file); !kind.empty()) throw Error(kind);
  check_seal(file);
  RawHdf5 raw = raw_file(file);
  Handle f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose,
           "cannot open the file (corrupt or truncated?)");
  const hid_t root = f.get();
  check_file_layout(root);
  if (!has_attribute(root, "/", "format") || read_string(raw, root, "/", "format") != kFormatName)
    throw Error("not a mok golden file: the root attribute 'format' is not '" + std::string(kFormatName) + "'");
  GoldenCase g;
  g.format_version = read_i32(root, "/", "format_version");
  if (g.format_version != kFormatVersion)
    throw Error("format version " + std::to_string(g.format_version) + ", this build reads version " +
                std::to_string(kFormatVersion));
  g.numerics_version = read_i32(root, "/", "numerics_model_version");
  if (g.numerics_version != kNumericsModelVersion)
    throw Error("numerics model version " + std::to_string(g.numerics_version) +
                ", this build's reference is version " + std::to_string(kNumericsModelVersion) +
                ": its bits are stale, regenerate it with mok-golden generate");
  g.generator = read_string(raw, root, "/", "generator_revision");
  g.name = read_string(raw, root, "/", "name");
  validate_case_name(g.name, "attribute /@name");
  g.description = read_string(raw, root, "/", "description");
  const std::string source = read_string(raw, root, "/", "routing_source");
  if (source != "router" && source != "given")
    throw Error("attribute /@routing_source is " + quote_input(source) + ", expected 'router' or 'given'");
  g.config = read_config(raw, root);
  g.options = read_options(raw, root);
  if (check(H5Lexists(root, "recipe", H5P_DEFAULT), "cannot look up group /recipe")) g.recipe = read_recipe(raw, root);
  require_recipe_matches(g.recipe, source == "given");
  const std::vector<TensorSpec> specs = tensor_specs(g.config, source == "given");
  for (const Group group : {Group::inputs, Group::routing, Group::outputs}) {
    Handle h = open_group(raw, root, to_string(group));
    for (const TensorSpec& s : specs) {
      if (s.group != group) continue;
      const std::string path = dataset_path(group, s.name);
      group_tensors(g, group).push_back(read_dataset(raw, h.get(), path, s));
      Handle ds(H5Dopen2(h.get(), s.name.c_str(), H5P_DEFAULT), H5Dclose, "cannot open dataset " + path);
      if (has_attribute(ds.get(), path, "oracle_rel_bound") || has_attribute(ds.get(), path, "oracle_rel_error"))
        g.oracle[s.name] = read_oracle_accuracy(ds.get(), path);
    }
  }
  if (read_string(raw, root, "/", "content_sha256") != content_sha256(g))
    throw Error(
        "attribute /@content_sha256 does not match the attributes and datasets: the file is corrupt or was "
        "edited");
  return g;
}

}  // namespace

void write_golden(const std::filesystem::path& path, const GoldenCase& golden) {
  try {
    validate_case_name(golden.name, "name");  // before any file is made: the reader would refuse these
    validate_ring_rows(golden.options.ring_rows);
    silence_hdf5();
    std::string image = golden_image(golden);
    seal_image(image);
    write_bytes_atomically(path, image);
  } catch (const Error& e) {
    throw Error("mok: writing golden file " + display_name(path.string()) + ": " + reason_of(e));
  }
}

GoldenCase read_golden(const std::filesystem::path& path) {
  try {
    silence_hdf5();
    return read_file(path.string());
  } catch (const Error& e) {
    throw Error("mok: golden file " + display_name(path.string()) + ": " + reason_of(e));
  }
}

}  // namespace mok::golden
