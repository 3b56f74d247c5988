#!/usr/bin/env bash
# Call 2 (session 23): .snapC is the landing tree (call 1's without the warpgroup quantizer, which
# call 1 found to slow the fp8 backward's other phases: ptxas spills). On it: the tests of the fp8 weight
# gradients (accumulated; bf16 tensors), racecheck over the fp8 weight-gradient test (call 1 reported
# hazards in weight_grads' tables: are they the quantizer's?). Then the GEMM1 epilogue's
# SwiGLU batch, kBatch 16 (this tree) against 8 (.snapC), forward and backward, alternating.
set -uo pipefail
out=${OUT:-/tmp/mok-out}
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snapC/COMMIT) (.snapC); this tree: the same with kBatch 16"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
rc=$PWD/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
build() {  # tree, jobs, targets
  cmake -S "$1" -B "$1/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR="$rc" && cmake --build "$1/build" -j"$2" --target ${@:3}
}
build . 5 mok-bench > "$out/build_kbatch16.log" 2>&1 &
build .snapC 11 mok_megakernel_tests mok-fuzz mok-bench > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
wait $! || { tail -30 "$out/build_kbatch16.log"; exit 1; }
log "built"
t=.snapC/build/megakernel/tests/mok_megakernel_tests
timeout 150 $t --gtest_filter='Gpu.Fp8WeightGradientsMatchTheReference:LayerApi.Bf16WeightGradients*:Gpu.ColocatedEveryRoutingModeMatchesTheReference' > "$out/tests.log" 2>&1
echo "tests rc $?: $(grep -E '^\[  (PASSED|FAILED) ' "$out/tests.log" | tr '\n' ' ')" | tee -a "$out/summary.log"
timeout 110 compute-sanitizer --tool racecheck --error-exitcode 1 $t --gtest_filter='Gpu.Fp8WeightGradientsMatchTheReference' > "$out/sanitize_racecheck.log" 2>&1
echo "racecheck exit $?: $(grep 'RACECHECK SUMMARY' "$out/sanitize_racecheck.log" | tail -1)" | tee -a "$out/summary.log"
ab() {  # mok-bench's flags
  echo "== B kBatch 8 $*"
  .snapC/build/megakernel/mok-bench "$@" --runs 10
  echo "== N kBatch 16 $*"
  build/megakernel/mok-bench "$@" --runs 10
}
{
  for shape in kimi-k2; do
    ab --shape $shape
    ab --shape $shape --fp8
  done
} > "$out/batch_ab.log" 2>&1
grep -E "^==|uniform  " "$out/batch_ab.log" | tee -a "$out/summary.log"
grep "forward phases" "$out/batch_ab.log" | sed 's/.*routing check[^;]*;//' | tee -a "$out/summary.log"
