// mok-procs: the layer across G processes, one per GPU, each on its own NCCL communicator rank (the
// device API's communicator constructor, docs/multi-gpu.md), checked bit for bit against the CPU
// reference on a generated problem.
//   mok-procs --gpus G [--shape NAME] [--tokens T] [--routing router|uniform|zipf] [--runs N] [--timeout S]
//   --shape: small (every branch: sigmoid groups, clamp, shared expert) or a shape of mok-bench;
//   --tokens: T tokens per GPU (default: the shape's, kept small so that the CPU reference stays quick);
//   --routing: router (the layer routes), uniform or zipf (replayed expert ids: RoutingMode::replay_ids);
//   --runs: forward and backward N times on every GPU; every run must give the first run's bits;
//   --timeout: seconds the ranks may take together before all are killed (default 120).
// The parent never touches CUDA (a CUDA context does not survive fork): it counts the GPUs in a probe
// child, makes the NCCL unique id (which only opens the bootstrap socket; its listening thread stays
// in the parent), forks one child per GPU and watches them. Each child builds the whole problem from
// the seed, uploads its tokens' and experts' slices, runs, and writes its results to a file in a
// temporary directory; the parent assembles them and compares with the reference.
// Exit: 0 all equal, 1 a mismatch or a failed rank, 2 bad arguments or a setup error, 77 no Hopper GPU
// (ctest: skip).
#include <nccl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mok/core/fields.h"
#include "mok/megakernel/check.h"
#include "mok/megakernel/layer.h"
#include "mok/megakernel/layer_tensors.h"
#include "mok/reference/layer.h"
#include "mok/reference/problem.h"

namespace {

using mok::Error;
using mok::gpu::DType;
using mok::gpu::share_of;
using Tensor = mok::gpu::DeviceTensor;

constexpr int kSkip = 77;
constexpr uint64_t kSeed = 2026;
constexpr uint32_t kResultMagic = 0x6d6f6b70;  // "mokp": a result file of this tool

struct Shape {
  const char* name;
  int H, I, E, k, T;
};

// mok-bench's shapes (docs/benchmarks.md) with fewer tokens: the CPU reference checks every bit.
constexpr Shape kShapes[] = {
    {"small", 128, 64, 8, 3, 40},
    {"kimi-k2", 7168, 2048, 32, 8, 128},
    {"glm-5", 6144, 2048, 32, 8, 128},
    {"qwen3.5-397b", 4096, 1024, 64, 10, 128},
    {"deepseek-v4", 7168, 3072, 32, 6, 128},
    {"qwen3-30b-a3b", 2048, 768, 128, 8, 256},
    {"olmoe", 2048, 1024, 64, 8, 256},
};

struct Options {
  int gpus = 0;
  std::string shape = "small", routing = "router";
  int tokens = 0, runs = 2;
  double timeout_s = 120;
};

// Everything a rank needs, made by the parent before the fork (the children inherit it).
struct Job {
  mok::LayerConfig config;
  mok::ref::RoutingKind kind = mok::ref::RoutingKind::router;
  mok::RoutingMode mode = mok::RoutingMode::router;
  int runs = 1;
  std::filesystem::path dir;
  ncclUniqueId id{};
};

void check_nccl(ncclResult_t status, const char* what) {
  if (status != ncclSuccess && status != ncclInProgress)
    throw Error(std::string("mok-procs: NCCL error (") + what + "): " + ncclGetErrorString(status));
}

void check_sys(bool ok, const std::string& what) {
  if (!ok) throw Error("mok-procs: " + what + ": " + std::strerror(errno));
}

mok::LayerConfig make_config(const Options& o) {
  for (const Shape& s : kShapes) {
    if (o.shape != s.name) continue;
    mok::LayerConfig c = mok::make_config(o.gpus, o.tokens ? o.tokens : s.T, s.H, s.I, s.E, s.k);
    if (o.shape == "small") {  // every branch of the layer (the tests' with_every_branch)
      c.score_mode = mok::ScoreMode::sigmoid;
      c.n_group = 4, c.topk_group = 2, c.routed_scale = 2.5f;
      c.shared_intermediate = 64, c.swiglu_limit = 0.75f;
    }
    mok::validate(c);
    return c;
  }
  throw Error("mok-procs: unknown shape " + mok::quote_input(o.shape));
}

// ---- one rank (a child process) ----

// What a rank reports besides its tensors: the bytes it allocated and the device memory in use.
struct RankHeader {
  uint32_t magic = kResultMagic;
  int32_t rank = 0;
  uint64_t used_after_init = 0, used_after_runs = 0;  // device memory in use (cudaMemGetInfo)
  uint64_t weight_bytes = 0, activation_bytes = 0, saved_bytes = 0, workspace_bytes = 0;
};

uint64_t device_memory_used() {
  size_t free = 0, total = 0;
  MOK_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return total - free;
}

// Rank g's tensors (mok/megakernel/layer_tensors.h): its tokens, its experts' weights and gradients,
// the router and shared expert whole.
struct RankTensors {
  mok::RoutingMode mode;
  mok::gpu::WeightTensors weights;
  mok::gpu::ForwardTensors fwd;
  mok::gpu::GradTensors grad;
  Tensor workspace;

  RankTensors(const mok::gpu::Layer& layer, const mok::ref::Problem& p, mok::RoutingMode routing, int g)
      : mode(routing),
        weights(p.config, p.weights, g, p.config.ranks),
        fwd(p.config, layer.saved_bytes(), p.config.ranks),
        grad(p.config, p.config.ranks),
        workspace(DType::u8, {int64_t(layer.workspace_bytes(mok::gpu::Pass::backward))}) {
    const int G = p.config.ranks;
    fwd.x.upload(share_of(p.x, g, G));
    grad.dy.upload(share_of(p.dy, g, G));
    if (mode != mok::RoutingMode::router) fwd.topk_idx.upload(share_of(p.routing->topk_idx, g, G));
    // The uploads above went through the legacy default stream; the layer's stream does not wait for it.
    MOK_CUDA_CHECK(cudaDeviceSynchronize());
  }

  // Every output poisoned before a run, so that a run that leaves one unwritten cannot pass on the last
  // run's bits.
  void run(mok::gpu::Layer& layer, cudaStream_t stream) {
    fwd.poison(mode);
    grad.poison(false);
    const mok::gpu::ForwardInputs in{fwd.x.view(), weights.views(), mode};
    layer.forward(stream, workspace.view().data, in, fwd.views(mode));
    layer.backward(stream, workspace.view().data, in, fwd.views(mode), grad.dy.view(), grad.views(mode, false));
  }
  void fill_header(RankHeader& h) const {
    const mok::gpu::WeightTensors& w = weights;
    for (const Tensor* t : {&w.router, &w.expert_bias, &w.w1, &w.w2, &w.shared_w1, &w.shared_w2, &grad.d_router,
                            &grad.d_w1, &grad.d_w2, &grad.d_shared_w1, &grad.d_shared_w2})
      h.weight_bytes += t->bytes();
    for (const Tensor* t :
         {&fwd.x, &grad.dy, &fwd.y, &fwd.topk_idx, &fwd.topk_w, &fwd.logits, &grad.dx, &grad.d_topk_w, &grad.d_logits})
      h.activation_bytes += t->bytes();
    h.saved_bytes = fwd.saved.bytes();
    h.workspace_bytes = workspace.bytes();
  }
  // The rank's results, in the fields' vocabulary (the unset fields stay empty).
  std::pair<mok::Forward, mok::Gradients> download() const {
    mok::Forward f;
    f.routing.topk_idx = fwd.topk_idx.download<int32_t>();
    f.routing.topk_w = fwd.topk_w.download<float>();
    f.logits = fwd.logits.download<float>();
    f.y = fwd.y.download<mok::bf16>();
    mok::Gradients d;
    d.dx = grad.dx.download<mok::bf16>();
    d.d_topk_w = grad.d_topk_w.download<float>();
    d.d_logits = grad.d_logits.download<float>();
    d.d_router = grad.d_router.download<float>();
    d.d_w1 = grad.d_w1.download<float>();
    d.d_w2 = grad.d_w2.download<float>();
    d.d_shared_w1 = grad.d_shared_w1.download<float>();
    d.d_shared_w2 = grad.d_shared_w2.download<float>();
    return {std::move(f), std::move(d)};
  }
};

// The first field whose bits differ between two results of the same shape, or "".
template <class S>
std::string first_difference(const S& a, const S& b) {
  std::string found;
  mok::for_each_field(a, b, [&](const char* name, const auto& u, const auto& v) {
    if (found.empty()) found = mok::first_bit_mismatch(name, u, v);
  });
  return found;
}

class File {
 public:
  File(const std::filesystem::path& path, const char* mode) : path_(path), f_(std::fopen(path.c_str(), mode)) {
    check_sys(f_ != nullptr, "cannot open " + path_.string());
  }
  ~File() {
    if (f_) std::fclose(f_);  // only on an error path: close() reports the normal one
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  void write(const void* data, size_t bytes) {
    if (bytes && std::fwrite(data, 1, bytes, f_) != bytes) throw Error("mok-procs: cannot write " + path_.string());
  }
  void read(void* data, size_t bytes) {
    if (bytes && std::fread(data, 1, bytes, f_) != bytes)
      throw Error("mok-procs: " + path_.string() + " is shorter than its contents say");
  }
  void close() {
    FILE* f = std::exchange(f_, nullptr);
    check_sys(std::fclose(f) == 0, "cannot close " + path_.string());
  }

 private:
  std::filesystem::path path_;
  FILE* f_;
};

std::filesystem::path result_path(const std::filesystem::path& dir, int g) {
  return dir / ("rank" + std::to_string(g) + ".bin");
}

// Each field: its element count, then its elements' bytes, in for_each_field's order.
template <class S>
void write_fields(File& file, const S& s) {
  mok::for_each_field(s, [&](const char*, const auto& v) {
    const uint64_t n = v.size();
    file.write(&n, sizeof n);
    file.write(v.data(), n * sizeof(v[0]));
  });
}

template <class S>
void read_fields(File& file, S& s, uint64_t limit) {
  mok::for_each_field(s, [&](const char* name, auto& v) {
    uint64_t n = 0;
    file.read(&n, sizeof n);
    if (n > limit / sizeof(v[0])) throw Error(std::string("mok-procs: a result file's ") + name + " is too large");
    v.resize(n);
    file.read(v.data(), n * sizeof(v[0]));
  });
}

// Owns the communicator; destroyed after the Layer (declared before it), as the Layer's rules ask.
struct Communicator {
  ncclComm_t comm = nullptr;
  Communicator(const ncclUniqueId& id, int ranks, int rank) {
    check_nccl(ncclCommInitRank(&comm, ranks, id, rank), "ncclCommInitRank");
  }
  ~Communicator() {
    if (comm && ncclCommDestroy(comm) != ncclSuccess) std::fprintf(stderr, "mok-procs: ncclCommDestroy failed\n");
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { MOK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() {
    if (s && cudaStreamDestroy(s) != cudaSuccess) std::fprintf(stderr, "mok-procs: cudaStreamDestroy failed\n");
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

[[noreturn]] void fail(int g, const char* what) {
  std::fprintf(stderr, "mok-procs: rank %d (GPU %d): %s\n", g, g, what);
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(1);
}

// Forward and backward job.runs times; the first run's results, checked against every later run's.
std::pair<mok::Forward, mok::Gradients> run_layer(const Job& job, mok::gpu::Layer& layer, RankTensors& t,
                                                  cudaStream_t stream) {
  std::pair<mok::Forward, mok::Gradients> first;
  for (int run = 0; run < job.runs; ++run) {
    t.run(layer, stream);  // the last run's work is done: check() waited for the stream
    layer.check();
    auto results = t.download();
    if (run == 0) {
      first = std::move(results);
      continue;
    }
    std::string diff = first_difference(first.first, results.first);
    if (diff.empty()) diff = first_difference(first.second, results.second);
    if (!diff.empty())
      throw Error("run " + std::to_string(run + 1) + " differs from run 1 (not deterministic): " + diff);
  }
  return first;
}

void run_rank(const Job& job, int g) {
  MOK_CUDA_CHECK(cudaSetDevice(g));
  Communicator comm(job.id, job.config.ranks, g);
  RankHeader header;
  header.rank = g;
  header.used_after_init = device_memory_used();
  std::optional<Stream> stream;
  std::optional<mok::gpu::Layer> layer;
  std::optional<RankTensors> tensors;
  std::pair<mok::Forward, mok::Gradients> results;
  // An error leaves at once, without the destructors: the Layer's window and the communicator are
  // collective, and a peer may be gone; the process's exit frees what they hold.
  try {
    const mok::ref::Problem p = mok::ref::make_problem(job.config, kSeed, job.kind);
    stream.emplace();
    mok::gpu::LaunchConfig launch;
    launch.gpus = job.config.ranks;
    launch.transport = mok::gpu::Transport::nccl;
    layer.emplace(job.config, launch, comm.comm);
    tensors.emplace(*layer, p, job.mode, g);
    results = run_layer(job, *layer, *tensors, stream->s);
    header.used_after_runs = device_memory_used();
    tensors->fill_header(header);
  } catch (const std::exception& e) {
    fail(g, e.what());
  }
  // The Layer goes before the communicator, after its last call finished (check()), as layer.h asks.
  tensors.reset();
  layer.reset();
  stream.reset();
  File file(result_path(job.dir, g), "wb");
  file.write(&header, sizeof header);
  write_fields(file, results.first);
  write_fields(file, results.second);
  file.close();
}

[[noreturn]] void rank_main(const Job& job, int g) {
  try {
    run_rank(job, g);
  } catch (const std::exception& e) {
    fail(g, e.what());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(0);  // not exit(): the parent's atexit handlers and stdio buffers are not this process's
}

// ---- the parent ----

// hopper_gpus() in a child process: CUDA initialised in the parent would be unusable in the ranks.
int probe_hopper_gpus() {
  int fds[2];
  check_sys(pipe(fds) == 0, "pipe");
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  check_sys(pid >= 0, "fork");
  if (pid == 0) {
    close(fds[0]);
    const int n = mok::gpu::hopper_gpus();
    _exit(write(fds[1], &n, sizeof n) == sizeof n ? 0 : 1);
  }
  close(fds[1]);
  int n = 0;
  const ssize_t got = read(fds[0], &n, sizeof n);
  close(fds[0]);
  int status = 0;
  check_sys(waitpid(pid, &status, 0) == pid, "waitpid (GPU probe)");
  if (got != sizeof n || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error("mok-procs: the process counting the GPUs failed");
  return n;
}

// A fresh directory for the ranks' result files, removed with its contents at the end.
class TempDir {
 public:
  TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/mok-procs.XXXXXX";
    check_sys(mkdtemp(pattern.data()) != nullptr, "cannot create a directory from " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    if (ec) std::fprintf(stderr, "mok-procs: cannot remove %s: %s\n", path_.c_str(), ec.message().c_str());
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

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

// Waits for every rank; the first failure or the timeout kills the others (a rank whose peer is gone
// would wait at NCCL's bootstrap or at a barrier across GPUs). True when every rank exited 0.
bool wait_for_ranks(std::vector<pid_t> pids, double timeout_s) {
  const auto start = std::chrono::steady_clock::now();
  for (size_t done = 0; done < pids.size();) {
    for (size_t g = 0; g < pids.size(); ++g) {
      if (pids[g] <= 0) continue;
      int status = 0;
      const pid_t got = waitpid(pids[g], &status, WNOHANG);
      check_sys(got >= 0, "waitpid (rank " + std::to_string(g) + ")");
      if (got == 0) continue;
      pids[g] = 0;
      ++done;
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
      std::fprintf(stderr, "mok-procs: rank %zu %s; killing the other ranks\n", g, describe(status).c_str());
      kill_all(pids);
      return false;
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s) {
      std::string running;
      for (size_t g = 0; g < pids.size(); ++g)
        if (pids[g] > 0) running += " " + std::to_string(g);
      std::fprintf(stderr, "mok-procs: the ranks ran past the timeout of %.0f s; killing ranks%s (still running)\n",
                   timeout_s, running.c_str());
      kill_all(pids);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

std::vector<pid_t> spawn_ranks(const Job& job) {
  std::vector<pid_t> pids;
  std::fflush(stdout);  // or the children would flush the parent's buffered output again
  std::fflush(stderr);
  for (int g = 0; g < job.config.ranks; ++g) {
    const pid_t pid = fork();
    if (pid < 0) {
      const int saved = errno;
      kill_all(pids);
      errno = saved;
      check_sys(false, "fork (rank " + std::to_string(g) + ")");
    }
    if (pid == 0) rank_main(job, g);
    pids.push_back(pid);
  }
  return pids;
}

struct RankResults {
  RankHeader header;
  mok::Forward fwd;
  mok::Gradients grads;
};

RankResults read_rank(const std::filesystem::path& dir, int g) {
  const std::filesystem::path path = result_path(dir, g);
  const uint64_t size = std::filesystem::file_size(path);
  File file(path, "rb");
  RankResults r;
  file.read(&r.header, sizeof r.header);
  if (r.header.magic != kResultMagic || r.header.rank != g)
    throw Error("mok-procs: " + path.string() + " is not rank " + std::to_string(g) + "'s result file");
  read_fields(file, r.fwd, size);
  read_fields(file, r.grads, size);
  file.close();
  return r;
}

// Whole on every rank (every GPU computes them over all tokens); the rest is split by token or by
// expert, each rank's rows following the previous rank's.
bool replicated(const std::string& name) {
  return name == "d_router" || name == "d_shared_w1" || name == "d_shared_w2";
}

// The global results: rank 0's, then each rank's split fields appended; a replicated field of any
// rank that differs from rank 0's is reported in `problems`.
template <class S>
S assemble(const std::vector<const S*>& ranks, std::vector<std::string>& problems) {
  S whole = *ranks[0];
  for (size_t g = 1; g < ranks.size(); ++g)
    mok::for_each_field(whole, *ranks[g], [&](const char* name, auto& w, const auto& r) {
      if (!replicated(name)) {
        w.insert(w.end(), r.begin(), r.end());
        return;
      }
      const std::string diff = mok::first_bit_mismatch(name, r, w);
      if (!diff.empty()) problems.push_back("rank " + std::to_string(g) + " vs rank 0: " + diff);
    });
  return whole;
}

// The fields the Layer returns (the reference's layout and intermediates are not among them).
bool from_device(const std::string& name) {
  for (const char* n : {"topk_idx", "topk_w", "logits", "y", "dx", "d_topk_w", "d_logits", "d_router", "d_w1", "d_w2",
                        "d_shared_w1", "d_shared_w2"})
    if (name == n) return true;
  return false;
}

// One line per tensor; true when every one holds the reference's bits.
template <class S>
bool compare(const S& got, const S& want) {
  bool equal = true;
  mok::for_each_field(got, want, [&](const char* name, const auto& a, const auto& b) {
    if (!from_device(name)) return;
    const std::string diff = mok::first_bit_mismatch(name, a, b);
    if (a.empty() && b.empty()) {
      std::printf("  %-12s absent in this configuration\n", name);
    } else if (diff.empty()) {
      std::printf("  %-12s bitwise equal (%zu elements)\n", name, a.size());
    } else {
      std::printf("  %-12s DIFFERS: %s (mok-procs vs reference)\n", name, diff.c_str());
      equal = false;
    }
  });
  return equal;
}

double mib(uint64_t bytes) { return double(bytes) / (1 << 20); }

void print_memory(const RankHeader& h) {
  std::printf(
      "  rank %d (GPU %d): device memory in use %.1f MiB after NCCL init, %.1f MiB after the runs; "
      "its tensors: weights+grads %.1f, activations %.1f, saved %.1f, workspace %.1f MiB; "
      "the rest (Layer, NCCL window, allocation rounding) %.1f MiB\n",
      h.rank, h.rank, mib(h.used_after_init), mib(h.used_after_runs), mib(h.weight_bytes), mib(h.activation_bytes),
      mib(h.saved_bytes), mib(h.workspace_bytes),
      mib(h.used_after_runs - h.used_after_init) -
          mib(h.weight_bytes + h.activation_bytes + h.saved_bytes + h.workspace_bytes));
}

std::pair<mok::Forward, mok::Gradients> reference(const Job& job) {
  const mok::ref::Problem p = mok::ref::make_problem(job.config, kSeed, job.kind);
  mok::ref::Options opt;
  opt.step = mok::StepModel::hopper_tc;
  opt.replay_ids = job.mode == mok::RoutingMode::replay_ids;
  const mok::Routing* given = job.mode == mok::RoutingMode::router ? nullptr : &*p.routing;
  mok::Forward f = mok::ref::forward(p.config, p.x, p.weights, given, opt);
  mok::Gradients g = mok::ref::backward(p.config, p.x, p.weights, f, p.dy, opt);
  return {std::move(f), std::move(g)};
}

// Reads the ranks' files, checks the replicated gradients, compares with the reference. True: all equal.
bool check_results(const Job& job) {
  std::vector<RankResults> ranks;
  for (int g = 0; g < job.config.ranks; ++g) ranks.push_back(read_rank(job.dir, g));
  std::printf("per-rank device memory:\n");
  for (const RankResults& r : ranks) print_memory(r.header);
  std::vector<const mok::Forward*> fwds;
  std::vector<const mok::Gradients*> grads;
  for (const RankResults& r : ranks) fwds.push_back(&r.fwd), grads.push_back(&r.grads);
  std::vector<std::string> problems;
  const mok::Forward fwd = assemble(fwds, problems);
  const mok::Gradients grad = assemble(grads, problems);
  for (const std::string& p : problems) std::printf("  replicated gradient DIFFERS between ranks: %s\n", p.c_str());
  if (problems.empty())
    std::printf("  d_router and the shared expert's gradients: the same bits on all %d ranks\n", job.config.ranks);
  std::fprintf(stderr, "mok-procs: computing the CPU reference...\n");
  const auto [want_fwd, want_grad] = reference(job);
  std::printf("against the CPU reference (hopper_tc step model):\n");
  const bool fwd_equal = compare(fwd, want_fwd);
  const bool grad_equal = compare(grad, want_grad);
  return problems.empty() && fwd_equal && grad_equal;
}

void usage() {
  std::fprintf(stderr,
               "usage: mok-procs --gpus G [--shape small|kimi-k2|glm-5|qwen3.5-397b|deepseek-v4|qwen3-30b-a3b|olmoe] "
               "[--tokens T] [--routing router|uniform|zipf] [--runs N] [--timeout S]\n");
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return false;
    const char* value = argv[++i];
    if (arg == "--gpus")
      o.gpus = std::atoi(value);
    else if (arg == "--shape")
      o.shape = value;
    else if (arg == "--tokens")
      o.tokens = std::atoi(value);
    else if (arg == "--routing")
      o.routing = value;
    else if (arg == "--runs")
      o.runs = std::atoi(value);
    else if (arg == "--timeout")
      o.timeout_s = std::atof(value);
    else
      return false;
  }
  return true;
}

Job make_job(const Options& o) {
  if (o.gpus < 1) throw Error("mok-procs: --gpus G is required, with G >= 1");
  if (o.runs < 1 || o.tokens < 0 || !(o.timeout_s > 0))
    throw Error("mok-procs: --runs must be >= 1, --tokens >= 0 and --timeout > 0");
  Job job;
  job.config = make_config(o);
  job.kind = mok::ref::routing_kind_from_string(o.routing);
  if (job.kind != mok::ref::RoutingKind::router && job.kind != mok::ref::RoutingKind::uniform &&
      job.kind != mok::ref::RoutingKind::zipf)
    throw Error("mok-procs: --routing must be router, uniform or zipf");
  job.mode = job.kind == mok::ref::RoutingKind::router ? mok::RoutingMode::router : mok::RoutingMode::replay_ids;
  job.runs = o.runs;
  return job;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (!parse(argc, argv, options)) {
    usage();
    return 2;
  }
  try {
    Job job = make_job(options);
    const int hopper = probe_hopper_gpus();
    if (hopper == 0) {
      std::fprintf(stderr, "mok-procs: no Hopper GPU\n");
      return kSkip;
    }
    if (job.config.ranks > hopper)
      throw Error("mok-procs: --gpus " + std::to_string(job.config.ranks) + " but only " + std::to_string(hopper) +
                  " Hopper GPU(s) are usable (devices 0.." + std::to_string(hopper - 1) + ")");
    // As mok's own peer groups do: NVLink multicast is not used by the layer, and a program that turns it on
    // can take a shared host's GPUs out of service; an explicit setting is kept. The ranks inherit it.
    check_sys(setenv("NCCL_NVLS_ENABLE", "0", 0) == 0, "setenv NCCL_NVLS_ENABLE");
    check_nccl(ncclGetUniqueId(&job.id), "ncclGetUniqueId");
    const TempDir dir;
    job.dir = dir.path();
    const mok::LayerConfig& c = job.config;
    std::printf(
        "mok-procs: %d process(es), one per GPU; shape %s: T %d tokens per GPU, H %d, I %d, E %d (%d per "
        "GPU), k %d; routing %s; %d run(s)\n",
        c.ranks, options.shape.c_str(), c.tokens_per_rank, c.hidden, c.intermediate, c.experts, c.experts_per_rank(),
        c.top_k, options.routing.c_str(), job.runs);
    if (!wait_for_ranks(spawn_ranks(job), options.timeout_s)) {
      std::printf("mok-procs: FAIL: a rank failed (above)\n");
      return 1;
    }
    std::printf("every rank's %d run(s) gave the same bits\n", job.runs);
    const bool equal = check_results(job);
    std::printf("mok-procs: %s\n",
                equal ? "PASS: every tensor bitwise equal to the CPU reference" : "FAIL: results differ (above)");
    return equal ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
