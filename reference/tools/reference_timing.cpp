// mok-reference-timing: wall time of the CPU reference's forward and backward, per step model.
//   mok-reference-timing [R T H I E k]      (default: issue 2's size, 4 512 512 256 16 4)
// Uses every core OpenMP offers (OMP_NUM_THREADS to change it).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>

#include "mok/core/tool_exit.h"
#include "mok/reference/layer.h"
#include "mok/reference/problem.h"

namespace {

constexpr const char* kUsage = "usage: mok-reference-timing [R T H I E k]   (default 4 512 512 256 16 4)\n";

// A timing lost to a full disk or a closed pipe is no success.
int exit_status(int status) { return mok::tool_exit_status("mok-reference-timing", status); }

}  // namespace

int main(int argc, char** argv) {
  using namespace mok;
  using clock = std::chrono::steady_clock;
  if (argc == 2 && (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0)) {
    std::printf("%s", kUsage);
    return exit_status(0);
  }
  if (argc != 1 && argc != 7) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  int sizes[6] = {4, 512, 512, 256, 16, 4};  // R T H I E k
  for (int i = 1; i < argc; ++i) {
    // Strictly: atoi took "2x" and "1e3" for 2 and 1, and wrapped 99999999999 to another size, which then
    // ran or was refused by a number the user never gave.
    if (!parse_whole_number(argv[i], sizes[i - 1])) {
      std::fprintf(stderr, "mok-reference-timing: argument %d, %s, is not a decimal integer in int's range\n", i,
                   quote_input(argv[i]).c_str());
      std::fprintf(stderr, "%s", kUsage);
      return 2;
    }
  }
  try {
    const LayerConfig c = make_config(sizes[0], sizes[1], sizes[2], sizes[3], sizes[4], sizes[5]);
    const ref::Problem p = ref::make_problem(c, 7);
    std::printf("R=%d T=%d H=%d I=%d E=%d k=%d\n", c.ranks, c.tokens_per_rank, c.hidden, c.intermediate, c.experts,
                c.top_k);
    for (const StepModel step : {StepModel::fp32_fma, StepModel::hopper_tc}) {
      ref::Options o;
      o.step = step;
      const auto t0 = clock::now();
      const ref::Forward f = ref::forward(c, p.x, p.weights, nullptr, o);
      const auto t1 = clock::now();
      ref::backward(c, p.x, p.weights, f, p.dy, o);
      const auto t2 = clock::now();
      const double fwd = std::chrono::duration<double>(t1 - t0).count();
      const double bwd = std::chrono::duration<double>(t2 - t1).count();
      const double macs = 3.0 * c.tokens() * c.top_k * double(c.hidden) * c.intermediate;  // forward GEMMs
      std::printf("%-9s forward %7.2f s  backward %7.2f s  (%.2f G multiply-adds/s)\n",
                  step == StepModel::hopper_tc ? "hopper_tc" : "fp32_fma", fwd, bwd, 3 * macs / (fwd + bwd) / 1e9);
    }
    return exit_status(0);
  } catch (const std::bad_alloc&) {  // its what() is "std::bad_alloc": name the tool and what ran out
    std::fprintf(stderr, "mok-reference-timing: out of memory for R=%d T=%d H=%d I=%d E=%d k=%d\n", sizes[0], sizes[1],
                 sizes[2], sizes[3], sizes[4], sizes[5]);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
