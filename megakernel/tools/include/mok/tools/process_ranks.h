// One process per GPU for mok's tools (mok-procs, mok-verify --gpus, mok-bench --gpus): the machinery
// once. The parent never initialises CUDA (a CUDA context does not survive fork): it counts the GPUs in
// a probe child, makes one NCCL unique id (which opens only the bootstrap socket), forks one rank per GPU
// and watches them with a timeout; the first rank that fails, or the timeout, kills every rank. Each rank
// writes its results to a file of a temporary directory (ResultWriter), which the parent reads after
// all exited 0. A rank must not enter an OpenMP parallel region when its parent ran one before the fork:
// libgomp's pool does not survive fork, and the rank would wait for its threads for ever (mok-bench
// --gpus did, since make_problem fills in parallel, until its ranks got the peak measurement's matrix
// from the parent). So the ranks' host data are made in the parent.
// Each unique id leaves NCCL's bootstrap root thread in the parent until every rank has connected: a
// run whose ranks were killed before that leaves the thread waiting, so later forks come from a
// multithreaded parent (harmless unless a child takes a lock that thread holds, e.g. NCCL_DEBUG's).
#pragma once

#include <nccl.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "mok/core/config.h"
#include "mok/core/fields.h"

namespace mok::tools {

// The tools' exit codes: 0 pass, 1 a difference or a failed rank, 2 bad arguments or a setup error, 77 no
// Hopper GPU (ctest: SKIP_RETURN_CODE).
inline constexpr int kExitPass = 0, kExitFail = 1, kExitError = 2, kExitSkip = 77;

// Whether `ranks` ranks, one per GPU, can run here, counted in a child process: false when there is no
// Hopper GPU at all; throws mok::Error when there are some but fewer than `ranks`.
bool have_gpus_for(int ranks);

struct Rank {
  int index = 0, count = 1;  // GPU `index` of `count`, also its NCCL rank
  ncclUniqueId id{};
  std::filesystem::path result;  // the rank's result file (ResultWriter)
};

// A fresh directory for the ranks' result files, removed with its contents at the end.
class TempDir {
 public:
  explicit TempDir(const std::string& tool);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Rank g's result file in `dir`.
std::filesystem::path result_path(const std::filesystem::path& dir, int g);

// Runs body(rank) in `ranks` child processes, rank g on GPU g, all with one fresh NCCL unique id
// (NCCL_NVLS_ENABLE=0 unless set: the layer does not use NVLink multicast). A rank whose body throws
// names itself and the error on stderr and exits 1 at once. True when every rank exited 0; otherwise
// the first failure (or the timeout) is named on stderr and every rank has been killed.
bool run_ranks(const std::string& tool, int ranks, double timeout_s, const std::filesystem::path& dir,
               const std::function<void(const Rank&)>& body);

// Whether this object's destructor runs because an exception leaves a rank: then a collective
// teardown (a Layer's window, the communicator) is skipped, since a peer may be gone and the teardown
// would wait for it; the rank exits at once and its exit frees what the objects held.
inline bool unwinding() { return std::uncaught_exceptions() > 0; }

// A rank's NCCL communicator on GPU rank.index, which it makes current.
class RankComm {
 public:
  explicit RankComm(const Rank& rank);
  ~RankComm();
  RankComm(const RankComm&) = delete;
  RankComm& operator=(const RankComm&) = delete;
  ncclComm_t get() const { return comm_; }

 private:
  ncclComm_t comm_ = nullptr;
};

// An object whose destruction is collective across the ranks (a Layer on a communicator): destroyed
// with its owner, except while an exception unwinds (see unwinding()).
template <class T>
class Collective {
 public:
  template <class... Args>
  explicit Collective(Args&&... args) : object_(std::make_unique<T>(std::forward<Args>(args)...)) {}
  ~Collective() {
    if (unwinding()) (void)object_.release();  // left to the process's exit
  }
  Collective(const Collective&) = delete;
  Collective& operator=(const Collective&) = delete;
  T& operator*() const { return *object_; }
  T* operator->() const { return object_.get(); }
  void reset() { object_.reset(); }

 private:
  std::unique_ptr<T> object_;
};

struct CloseFile {
  void operator()(FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<FILE, CloseFile>;

// A rank's result file, written under a temporary name and renamed when complete: the parent never
// reads a part. Plain values, and the fields of a Forward or Gradients (mok/core/fields.h).
class ResultWriter {
 public:
  explicit ResultWriter(std::filesystem::path path);
  ~ResultWriter();
  ResultWriter(const ResultWriter&) = delete;
  ResultWriter& operator=(const ResultWriter&) = delete;
  template <class T>
  void put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    write(&value, sizeof value);
  }
  // Each field: its element count, then its elements' bytes, in for_each_field's order.
  template <class S>
  void put_fields(const S& s) {
    for_each_field(s, [&](const char*, const auto& v) {
      put(uint64_t(v.size()));
      write(v.data(), v.size() * sizeof(v[0]));
    });
  }
  void commit();  // closes and renames; without it the destructor removes the temporary file

 private:
  void write(const void* data, size_t bytes);
  std::filesystem::path path_, part_;
  FilePtr f_;
};

class ResultReader {
 public:
  explicit ResultReader(const std::filesystem::path& path);
  template <class T>
  void get(T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    read(&value, sizeof value);
  }
  template <class S>
  void get_fields(S& s) {
    for_each_field(s, [&](const char* name, auto& v) {
      uint64_t n = 0;
      get(n);
      if (n > size_ / sizeof(v[0])) throw Error(path_.string() + ": its " + name + " is larger than the file");
      v.resize(n);
      read(v.data(), n * sizeof(v[0]));
    });
  }

 private:
  void read(void* data, size_t bytes);
  std::filesystem::path path_;
  uint64_t size_;
  FilePtr f_;
};

}  // namespace mok::tools
