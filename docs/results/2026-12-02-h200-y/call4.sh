#!/usr/bin/env bash
# Call 4 (session 22): call 3's one failure, bench_processes_one_gpu (mok-bench --gpus 1: a forked rank on
# a one-rank NCCL communicator) running past its 240 s. The cause found on the development machine: since
# c39f8b4 the parent's make_problem runs OpenMP before the fork, and the rank's peak measurement filled
# its matrix with OpenMP again (libgomp's pool does not survive fork). Run again on this tree (the rank
# gets the matrix from its parent), the test's own command with a 70 s limit (the device time left
# allowed no run of the baseline).
set -uo pipefail
out=${OUT:-/tmp/mok-out}
rc_dir=$PWD/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
{
  echo "commit: ${MOK_COMMIT:-unknown}; date: $(date -u +%FT%TZ); $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR="$rc_dir" > /dev/null &&
    cmake --build build -j16 --target mok-bench > "$out/build.log" 2>&1 || { echo "build failed"; exit 1; }
  timeout 70 build/megakernel/mok-bench --gpus 1 --shape olmoe --tokens 1024 --runs 3 --warmup 1 --timeout 60
  echo "exit $?"
} 2>&1 | tee "$out/processes.log"
