// mok-procs: the layer across G processes, one per GPU, each on its own NCCL communicator rank (the
// device API's communicator constructor, docs/multi-gpu.md), checked bit for bit against the CPU
// reference on a generated problem.
//   mok-procs --gpus G [--shape NAME] [--tokens T] [--routing router|uniform|zipf] [--runs N] [--timeout S]
//   --shape: small (every branch: sigmoid groups, clamp, shared expert) or a shape of mok-bench;
//   --tokens: T tokens per GPU (default: the shape's, kept small so that the CPU reference stays quick);
//   --routing: router (the layer routes), uniform or zipf (replayed expert ids: RoutingMode::replay_ids);
//   --runs: forward and backward N times on every GPU; every run must give the first run's bits;
//   --timeout: seconds the ranks may take together before all are killed (default 120).
// One process per GPU (mok/tools/process_ranks.h): the parent builds the whole problem from the seed once;
// each rank, forked from it, uploads its tokens' and experts' slices, runs, and writes its results to a
// file; the parent assembles them and compares with the reference.
// Exit: 0 all equal, 1 a mismatch or a failed rank, 2 bad arguments or a setup error, 77 no Hopper GPU
// (ctest: skip).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "mok/core/fields.h"
#include "mok/core/tool_exit.h"
#include "mok/megakernel/check.h"
#include "mok/megakernel/layer.h"
#include "mok/reference/layer.h"
#include "mok/reference/problem.h"
#include "mok/tools/cli_args.h"
#include "mok/tools/process_ranks.h"
#include "mok/tools/rank_layer.h"

namespace {

using mok::Error;
using mok::tools::RankResults;

constexpr uint64_t kSeed = 2026;

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
  mok::ref::Problem problem;  // made once from the seed, before the fork (make_problem runs no OpenMP)
};

mok::LayerConfig make_config(const Options& o) {
  for (const Shape& s : kShapes) {
    if (o.shape != s.name) continue;
    mok::LayerConfig c = mok::make_config(o.gpus, o.tokens ? o.tokens : s.T, s.H, s.I, s.E, s.k);
    if (o.shape == "small") {  // every branch of the layer (the tests' with_every_branch)
      c.score_mode = mok::ScoreMode::sigmoid;
      c.n_group = 4, c.topk_group = 2, c.routed_scale = 2.5f;
      c.shared_intermediate = 64, c.swiglu_limit = 0.75f;
    }
    try {
      mok::validate(c);
    } catch (const Error& e) {
      throw Error("mok-procs: " + o.shape + " over " + std::to_string(o.gpus) + " GPU(s), one rank each: " + e.what());
    }
    return c;
  }
  throw Error("mok-procs: unknown shape " + mok::quote_input(o.shape));
}

// ---- one rank (a child process) ----

// What a rank reports besides its results: its tensors' bytes and the device memory in use.
struct RankMemory {
  uint64_t used_after_init = 0, used_after_runs = 0;  // device memory in use (cudaMemGetInfo)
  mok::tools::TensorBytes tensors;
};

// Forward and backward job.runs times; the first run's results, checked against every later run's.
RankResults run_layer(const Job& job, mok::gpu::Layer& layer, mok::tools::RankTensors& t, cudaStream_t stream) {
  RankResults first;
  for (int run = 0; run < job.runs; ++run) {
    t.poison();
    t.forward(layer, stream);
    t.backward(layer, stream);
    layer.check();  // waits for the stream
    RankResults results = t.download();
    if (run == 0) {
      first = std::move(results);
      continue;
    }
    const std::string diff = mok::tools::first_difference(first, results);
    if (!diff.empty())
      throw Error("run " + std::to_string(run + 1) + " differs from run 1 (not deterministic): " + diff);
  }
  return first;
}

// Rank g runs its share of the parent's problem. An error leaves without the collective teardowns
// (mok/tools/process_ranks.h).
void run_rank(const Job& job, const mok::tools::Rank& rank) {
  const mok::tools::RankComm comm(rank);
  RankMemory memory;
  memory.used_after_init = mok::tools::device_memory_in_use();
  const mok::ref::Problem& p = job.problem;
  const mok::tools::Stream stream;
  mok::gpu::LaunchConfig launch;
  launch.gpus = rank.count;
  launch.transport = mok::gpu::Transport::nccl;
  mok::tools::Collective<mok::gpu::Layer> layer(job.config, launch, comm.get());
  RankResults results;
  {
    mok::tools::RankTensors tensors(*layer, p.weights, launch, rank.index);
    tensors.set_inputs(p.x, p.dy, job.mode == mok::RoutingMode::router ? nullptr : &*p.routing, job.mode);
    results = run_layer(job, *layer, tensors, stream.get());
    memory.used_after_runs = mok::tools::device_memory_in_use();
    memory.tensors = tensors.bytes();
  }
  layer.reset();  // before the communicator, after its last call finished (check()), as layer.h asks
  mok::tools::ResultWriter file(rank.result);
  file.put(memory);
  mok::tools::put_results(file, results);
  file.commit();
}

// ---- the parent ----

// The fields a rank returns (the reference's h and the shared expert's h and a are not among them).
bool from_device(const std::string& name) { return name != "h" && name != "shared_h" && name != "shared_a"; }

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

void print_memory(int g, const RankMemory& m) {
  const mok::tools::TensorBytes& t = m.tensors;
  std::printf(
      "  rank %d (GPU %d): device memory in use %.1f MiB after NCCL init, %.1f MiB after the runs; "
      "its tensors: weights+grads %.1f, activations %.1f, saved %.1f, workspace %.1f MiB; "
      "the rest (Layer, NCCL window, allocation rounding) %.1f MiB\n",
      g, g, mib(m.used_after_init), mib(m.used_after_runs), mib(t.weights), mib(t.activations), mib(t.saved),
      mib(t.workspace),
      mib(m.used_after_runs - m.used_after_init) - mib(t.weights + t.activations + t.saved + t.workspace));
}

std::pair<mok::Forward, mok::Gradients> reference(const Job& job) {
  const mok::ref::Problem& p = job.problem;
  mok::ref::Options opt;
  opt.step = mok::StepModel::hopper_tc;
  opt.replay_ids = job.mode == mok::RoutingMode::replay_ids;
  const mok::Routing* given = job.mode == mok::RoutingMode::router ? nullptr : &*p.routing;
  mok::Forward f = mok::ref::forward(p.config, p.x, p.weights, given, opt);
  mok::Gradients g = mok::ref::backward(p.config, p.x, p.weights, f, p.dy, opt);
  return {std::move(f), std::move(g)};
}

// Reads the ranks' files, checks the replicated results, compares with the reference. True: all equal.
bool check_results(const Job& job, const mok::tools::TempDir& dir) {
  std::vector<RankResults> ranks;
  std::printf("per-rank device memory:\n");
  for (int g = 0; g < job.config.ranks; ++g) {
    mok::tools::ResultReader file(mok::tools::result_path(dir.path(), g));
    RankMemory memory;
    file.get(memory);
    print_memory(g, memory);
    ranks.push_back(mok::tools::get_results(file));
  }
  std::vector<std::string> problems;
  const RankResults whole = mok::tools::assemble(ranks, problems);
  for (const std::string& p : problems) std::printf("  replicated result DIFFERS between ranks: %s\n", p.c_str());
  if (problems.empty())
    std::printf("  the dispatch layout, d_router and the shared expert's gradients: the same bits on all %d ranks\n",
                job.config.ranks);
  std::fprintf(stderr, "mok-procs: computing the CPU reference...\n");
  const auto [want_fwd, want_grad] = reference(job);
  std::printf("against the CPU reference (hopper_tc step model):\n");
  const bool fwd_equal = compare(whole.fwd, want_fwd);
  const bool grad_equal = compare(whole.grads, want_grad);
  return problems.empty() && fwd_equal && grad_equal;
}

constexpr const char* kUsage =
    "usage: mok-procs --gpus G [--shape small|kimi-k2|glm-5|qwen3.5-397b|deepseek-v4|qwen3-30b-a3b|olmoe] "
    "[--tokens T] [--routing router|uniform|zipf] [--runs N] [--timeout S]\n";

bool parse(int argc, char** argv, Options& o) {
  using mok::tools::parse_double, mok::tools::parse_int;
  mok::tools::OptionReader reader("mok-procs");
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (!reader.first(arg)) return false;
    if (i + 1 >= argc) return reader.missing_value(arg);
    const char* value = argv[++i];
    bool ok = true;
    if (arg == "--gpus")
      ok = parse_int(value, o.gpus);
    else if (arg == "--shape")
      o.shape = value;
    else if (arg == "--tokens")
      ok = parse_int(value, o.tokens);
    else if (arg == "--routing")
      o.routing = value;
    else if (arg == "--runs")
      ok = parse_int(value, o.runs);
    else if (arg == "--timeout")
      ok = parse_double(value, o.timeout_s);
    else
      return reader.unknown(arg);
    if (!ok) return reader.bad_value(arg, value);
  }
  return true;
}

Job make_job(const Options& o) {
  if (o.gpus < 1) throw Error("mok-procs: --gpus G is required, with G >= 1");
  if (o.runs < 1 || o.tokens < 0 || !(o.timeout_s > 0 && std::isfinite(o.timeout_s)))
    throw Error("mok-procs: --runs must be >= 1, --tokens >= 0 and --timeout finite and > 0");
  // Before the generator's parser, whose message lists the seven kinds it knows, four of them not ours.
  if (o.routing != "router" && o.routing != "uniform" && o.routing != "zipf")
    throw Error("mok-procs: --routing must be router, uniform or zipf, got " + mok::quote_input(o.routing));
  Job job;
  job.config = make_config(o);
  mok::gpu::check_launch(job.config, mok::gpu::on_communicator({}, o.gpus));  // the ranks' launch, before any GPU
  job.kind = mok::ref::routing_kind_from_string(o.routing);
  job.mode = job.kind == mok::ref::RoutingKind::router ? mok::RoutingMode::router : mok::RoutingMode::replay_ids;
  job.runs = o.runs;
  return job;
}

}  // namespace

int tool_main(int argc, char** argv) {
  if (mok::printed_help(argc, argv, kUsage)) return 0;
  Options options;
  if (!parse(argc, argv, options)) {
    std::fputs(kUsage, stderr);
    return mok::tools::kExitError;
  }
  try {
    Job job = make_job(options);
    if (!mok::tools::have_gpus_for(job.config.ranks)) {
      std::fprintf(stderr, "mok-procs: no Hopper GPU\n");
      return mok::tools::kExitSkip;
    }
    job.problem = mok::ref::make_problem(job.config, kSeed, job.kind);
    const mok::LayerConfig& c = job.config;
    std::printf(
        "mok-procs: %d process(es), one per GPU; shape %s: T %d tokens per GPU, H %d, I %d, E %d (%d per "
        "GPU), k %d; routing %s; %d run(s)\n",
        c.ranks, options.shape.c_str(), c.tokens_per_rank, c.hidden, c.intermediate, c.experts, c.experts_per_rank(),
        c.top_k, options.routing.c_str(), job.runs);
    const mok::tools::TempDir dir("mok-procs");
    const auto rank = [&](const mok::tools::Rank& r) { run_rank(job, r); };
    if (!mok::tools::run_ranks("mok-procs", c.ranks, options.timeout_s, dir.path(), rank)) {
      std::printf("mok-procs: FAIL: a rank failed (above)\n");
      return mok::tools::kExitFail;
    }
    std::printf("every rank's %d run(s) gave the same bits\n", job.runs);
    const bool equal = check_results(job, dir);
    std::printf("mok-procs: %s\n",
                equal ? "PASS: every tensor bitwise equal to the CPU reference" : "FAIL: results differ (above)");
    return equal ? mok::tools::kExitPass : mok::tools::kExitFail;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return mok::tools::kExitError;
  }
}

// A report lost to a full disk or a closed pipe is no success.
int main(int argc, char** argv) { return mok::tool_exit_status("mok-procs", tool_main(argc, argv)); }
