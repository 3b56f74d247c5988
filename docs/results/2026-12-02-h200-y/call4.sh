#!/usr/bin/env bash
# Call 4 (session 22): call 3's one failure, bench_processes_one_gpu (mok-bench --gpus 1: a forked rank on
# a one-rank NCCL communicator) running past its 240 s. The cause found on the development machine: since
# c39f8b4 the parent's make_problem runs OpenMP before the fork, and the rank's peak measurement filled
# its matrix with OpenMP again (libgomp's pool does not survive fork). Run again on this tree (the rank
# gets the matrix from its parent) and on 0eabecc (.snapB), each with a 70 s limit.
set -uo pipefail
out=${OUT:-/tmp/mok-out}
rc_dir=$PWD/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
for tree in . .snapB; do
  (cmake -S $tree -B $tree/build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR="$rc_dir" > /dev/null &&
    cmake --build $tree/build -j8 --target mok-bench > "$out/build_$(basename $(realpath $tree)).log" 2>&1) &
done
wait
for tree in . .snapB; do
  echo "== $tree ($(cat $tree/COMMIT 2>/dev/null || echo 0027dc8))"
  NCCL_DEBUG=WARN timeout 70 $tree/build/megakernel/mok-bench --gpus 1 --shape olmoe --tokens 1024 --runs 3 --warmup 1 --timeout 60
  echo "exit $?"
done 2>&1 | tee "$out/processes.log"
