#include "gpu_ranks.h"

#include <string>
#include <vector>

#include "mok/tools/process_ranks.h"
#include "mok/tools/rank_layer.h"
#include "mok/verify/backend.h"

namespace mok::verify {
namespace {

constexpr const char* kTool = "mok-verify";

// Rank g: its share of the golden's problem (the parent's, inherited by the fork), one forward and
// backward, its results to its file. An error leaves without the collective teardowns.
void run_rank(const ref::Problem& p, const gpu::LaunchConfig& launch, const tools::Rank& rank) {
  const tools::RankComm comm(rank);
  const tools::Stream stream;
  tools::Collective<gpu::Layer> layer(p.config, launch, comm.get());
  tools::RankResults results;
  {
    tools::RankTensors t(*layer, p.weights, launch, rank.index);
    const Routing* given = p.routing ? &*p.routing : nullptr;
    t.set_inputs(p.x, p.dy, given, given ? RoutingMode::given : RoutingMode::router);
    t.poison();
    t.forward(*layer, stream.get());
    t.backward(*layer, stream.get());
    layer->check();  // waits for the stream
    results = t.download();
  }
  layer.reset();  // before the communicator, after its last call finished, as layer.h asks
  tools::ResultWriter file(rank.result);
  tools::put_results(file, results);
  file.commit();
}

}  // namespace

golden::LayerResults run_over_processes(const ref::Problem& p, const gpu::LaunchConfig& launch, double timeout_s) {
  const int G = launch.gpus;
  if (!tools::have_gpus_for(G)) throw NoGpu("mok: no Hopper GPU (--gpus runs one process per Hopper GPU)");
  const tools::TempDir dir(kTool);
  if (!tools::run_ranks(kTool, G, timeout_s, dir.path(), [&](const tools::Rank& r) { run_rank(p, launch, r); }))
    throw Error("mok: a rank of the " + std::to_string(G) + " processes failed (above)");
  std::vector<tools::RankResults> ranks;
  for (int g = 0; g < G; ++g) {
    tools::ResultReader file(tools::result_path(dir.path(), g));
    ranks.push_back(tools::get_results(file));
  }
  std::vector<std::string> problems;
  const tools::RankResults whole = tools::assemble(ranks, problems);
  if (!problems.empty())
    throw Error("mok: a result every GPU computes whole differs between the ranks: " + problems[0]);
  return golden::results_of(p, whole.fwd, whole.grads);
}

}  // namespace mok::verify
