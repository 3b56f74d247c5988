#!/usr/bin/env bash
# Call 3 (session 24): the landing tree (the fp8 weight-gradient test one per launch mode; the op's
# reference options one mapping for the CPU op and mok.capture) with the PyTorch extension: every GPU
# test and golden, the Python tests. Then an experiment (stagger.patch in .snapS, built twice): blocks
# start each GEMM phase staggered by (block % 4) x 6 or 3 us, so that their epilogues' stores do not all
# fall at once; mok-bench against this tree, runs alternating.
set -uo pipefail
out=${OUT:-/tmp/mok-out}
rc_dir=$PWD/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
stagger_build() {  # ns
  cmake -S .snapS -B .snapS/build-$1 -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR="$rc_dir" \
    -DCMAKE_CUDA_FLAGS="-DMOK_STAGGER_NS=$1" && cmake --build .snapS/build-$1 -j4 --target mok-bench
}
{ stagger_build 6000 && stagger_build 3000; } > "$out/build_stagger.log" 2>&1 &
MOK_COMMIT=${MOK_COMMIT:-unknown} MOK_TORCH_BUILD=1 bash bench/h200_session.sh tests || exit 1
( cd python/tests && PYTHONPATH=$PWD/../../build/python MOK_GOLDEN_DIR=$PWD/../../golden/data timeout 150 python3 -m pytest -q -rs \
    test_cuda.py test_errors.py test_capture.py test_distributed.py test_autograd.py > "$out/pytest.log" 2>&1
  echo "pytest rc $?: $(tail -1 "$out/pytest.log")" | tee -a "$out/summary.log" )
wait $! || { tail -20 "$out/build_stagger.log"; exit 1; }
run() {  # label, binary, flags
  echo "== $1 $3"
  timeout 60 $2 $3 --runs 5
}
{
  for flags in "--shape kimi-k2" "--shape kimi-k2 --fp8" "--shape olmoe"; do
    for pass in 1 2; do
      run B build/megakernel/mok-bench "$flags"
      run S6000 .snapS/build-6000/megakernel/mok-bench "$flags"
      run S3000 .snapS/build-3000/megakernel/mok-bench "$flags"
    done
  done
} > "$out/stagger_ab.log" 2>&1
grep -E "^==|uniform  " "$out/stagger_ab.log" | tee -a "$out/summary.log"
grep "backward phases" "$out/stagger_ab.log" | sed 's/.*tile table[^;]*;//' | tee -a "$out/summary.log"
grep "forward phases" "$out/stagger_ab.log" | sed 's/.*layout place[^;]*;//' | tee -a "$out/summary.log"
