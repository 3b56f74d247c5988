#include "mok/tools/process_ranks.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "mok/megakernel/check.h"
#include "mok/megakernel/layer.h"
#include "mok/megakernel/nccl.h"

namespace mok::tools {
namespace {

constexpr uint32_t kResultMagic = 0x6d6f6b72;  // "mokr": a rank's result file

void check_sys(bool ok, const std::string& what) {
  if (!ok) throw Error("mok: " + what + ": " + std::strerror(errno));
}

// nccl.h's check (NCCL's reason included), ncclInProgress taken as no failure as it always was here.
void check_nccl(ncclResult_t status, const char* what) {
  if (status != ncclInProgress) gpu::check_nccl(status, what);
}

// Before a fork: or the children would flush the parent's buffered output again.
void flush_output() {
  std::fflush(stdout);
  std::fflush(stderr);
}

// hopper_gpus() in a child process: CUDA initialised in the parent would be unusable in the ranks.
int probe_hopper_gpus() {
  int fds[2];
  check_sys(pipe(fds) == 0, "pipe");
  flush_output();
  const pid_t pid = fork();
  check_sys(pid >= 0, "fork");
  if (pid == 0) {
    close(fds[0]);
    int n = 0;
    try {  // a CUDA failure throws: said here, as no exception may unwind into the parent's stack
      n = mok::gpu::hopper_gpus();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      _exit(1);
    }
    _exit(write(fds[1], &n, sizeof n) == sizeof n ? 0 : 1);
  }
  close(fds[1]);
  int n = 0;
  const ssize_t got = read(fds[0], &n, sizeof n);
  close(fds[0]);
  int status = 0;
  check_sys(waitpid(pid, &status, 0) == pid, "waitpid (GPU probe)");
  if (got != sizeof n || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error("mok: the process counting the GPUs failed (its error, if any, is above)");
  return n;
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + strsignal(WTERMSIG(status));
  return "ended with status " + std::to_string(status);
}

void kill_all(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids)
    if (pid > 0) kill(pid, SIGKILL);  // ESRCH (already gone) is fine
  for (pid_t pid : pids)
    if (pid > 0) waitpid(pid, nullptr, 0);
}

[[noreturn]] void rank_main(const std::string& tool, const Rank& rank, const std::function<void(const Rank&)>& body,
                            pid_t parent) {
  // A rank dies with its parent (say, killed by a test's timeout) rather than run on, orphaned.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(1);
  int code = 0;
  try {
    body(rank);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d (GPU %d): %s\n", tool.c_str(), rank.index, rank.index, e.what());
    code = 1;
  }
  flush_output();
  _exit(code);  // not exit(): the parent's atexit handlers and stdio buffers are not this process's
}

std::vector<pid_t> spawn(const std::string& tool, Rank rank, const std::function<void(const Rank&)>& body,
                         const std::filesystem::path& dir) {
  std::vector<pid_t> pids;
  const pid_t parent = getpid();
  flush_output();
  for (int g = 0; g < rank.count; ++g) {
    rank.index = g;
    rank.result = result_path(dir, g);
    const pid_t pid = fork();
    if (pid < 0) {
      const int saved = errno;
      kill_all(pids);
      errno = saved;
      check_sys(false, "fork (rank " + std::to_string(g) + ")");
    }
    if (pid == 0) rank_main(tool, rank, body, parent);
    pids.push_back(pid);
  }
  return pids;
}

std::string still_running(const std::vector<pid_t>& pids) {
  std::string running;
  for (size_t g = 0; g < pids.size(); ++g)
    if (pids[g] > 0) running.append(" ").append(std::to_string(g));  // not " " + ...: GCC 12's -Wrestrict
  return running;
}

// Waits for every rank; the first failure or the timeout kills the others (a rank whose peer is gone
// would wait at NCCL's bootstrap or at a barrier across GPUs). True when every rank exited 0.
bool watch(const std::string& tool, std::vector<pid_t> pids, double timeout_s) {
  const auto start = std::chrono::steady_clock::now();
  for (size_t done = 0; done < pids.size();) {
    for (size_t g = 0; g < pids.size(); ++g) {
      if (pids[g] <= 0) continue;
      int status = 0;
      const pid_t got = waitpid(pids[g], &status, WNOHANG);
      if (got < 0) {
        const int saved = errno;
        kill_all(pids);
        errno = saved;
        check_sys(false, "waitpid (rank " + std::to_string(g) + ")");
      }
      if (got == 0) continue;
      pids[g] = 0;
      ++done;
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
      std::fprintf(stderr, "%s: rank %zu %s; killing the other ranks\n", tool.c_str(), g, describe(status).c_str());
      kill_all(pids);
      return false;
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s) {
      std::fprintf(stderr, "%s: the ranks ran past the timeout of %g s; killing ranks%s (still running)\n",
                   tool.c_str(), timeout_s, still_running(pids).c_str());
      kill_all(pids);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

}  // namespace

bool have_gpus_for(int ranks) {
  const int hopper = probe_hopper_gpus();
  if (hopper > 0 && ranks > hopper)
    throw Error("mok: --gpus " + std::to_string(ranks) + " but only " + std::to_string(hopper) +
                " Hopper GPU(s) are usable (devices 0.." + std::to_string(hopper - 1) + ")");
  return hopper > 0;
}

TempDir::TempDir(const std::string& tool) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + tool + ".XXXXXX";
  check_sys(mkdtemp(pattern.data()) != nullptr, "cannot create a directory from " + pattern);
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
  if (ec) std::fprintf(stderr, "mok: cannot remove %s: %s\n", path_.c_str(), ec.message().c_str());
}

std::filesystem::path result_path(const std::filesystem::path& dir, int g) {
  return dir / ("rank" + std::to_string(g) + ".bin");
}

bool run_ranks(const std::string& tool, int ranks, double timeout_s, const std::filesystem::path& dir,
               const std::function<void(const Rank&)>& body) {
  // As mok's own peer groups do: NVLink multicast is not used by the layer, and a program that turns it
  // on can take a shared host's GPUs out of service; an explicit setting is kept. The ranks inherit it.
  check_sys(setenv("NCCL_NVLS_ENABLE", "0", 0) == 0, "setenv NCCL_NVLS_ENABLE");
  Rank rank;
  rank.count = ranks;
  check_nccl(ncclGetUniqueId(&rank.id), "ncclGetUniqueId");
  return watch(tool, spawn(tool, rank, body, dir), timeout_s);
}

RankComm::RankComm(const Rank& rank) {
  MOK_CUDA_CHECK(cudaSetDevice(rank.index));
  check_nccl(ncclCommInitRank(&comm_, rank.count, rank.id, rank.index), "ncclCommInitRank");
}

RankComm::~RankComm() {
  if (comm_ && !unwinding() && ncclCommDestroy(comm_) != ncclSuccess)
    std::fprintf(stderr, "mok: ncclCommDestroy failed\n");
}

ResultWriter::ResultWriter(std::filesystem::path path)
    : path_(std::move(path)), part_(path_.string() + ".part"), f_(std::fopen(part_.c_str(), "wb")) {
  check_sys(f_ != nullptr, "cannot create " + part_.string());
  put(kResultMagic);
}

ResultWriter::~ResultWriter() {
  if (!f_) return;
  f_.reset();
  std::error_code ec;
  std::filesystem::remove(part_, ec);
}

void ResultWriter::write(const void* data, size_t bytes) {
  if (bytes && std::fwrite(data, 1, bytes, f_.get()) != bytes) throw Error("cannot write " + part_.string());
}

void ResultWriter::commit() {
  if (!f_) throw Error("internal: " + path_.string() + " was committed twice");
  check_sys(std::fclose(f_.release()) == 0, "cannot close " + part_.string());
  std::filesystem::rename(part_, path_);
}

// The size of a rank's result file; a rank that exited 0 without committing one is an error of the run.
uint64_t result_size(const std::filesystem::path& path) {
  std::error_code error;
  const uint64_t size = std::filesystem::file_size(path, error);
  if (error) throw Error(path.string() + ": no result file (" + error.message() + ")");
  return size;
}

ResultReader::ResultReader(const std::filesystem::path& path)
    : path_(path), size_(result_size(path)), f_(std::fopen(path.c_str(), "rb")) {
  check_sys(f_ != nullptr, "cannot open " + path_.string());
  uint32_t magic = 0;
  get(magic);
  if (magic != kResultMagic) throw Error(path_.string() + " is not a rank's result file");
}

void ResultReader::read(void* data, size_t bytes) {
  if (bytes && std::fread(data, 1, bytes, f_.get()) != bytes)
    throw Error(path_.string() + " is shorter than its contents say");
}

}  // namespace mok::tools
