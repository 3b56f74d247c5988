#!/usr/bin/env bash
# call 1 (session 21): .snap = 1da79f3 (session 20's landed tree: the relay's error path ce324b3 and the read-through
# f952a83, never run on a GPU), .snapB = 06ff81e (before the relay). .snap: GPU tests, goldens in both modes, the op's
# GPU tests, compute-sanitizer on the backward tests of both precisions and on a colocated test that runs the relay.
# A/B, one GPU: mok-bench kimi-k2 bf16 (B N B N) and --fp8 (B N B N), op_bench --kernel-times kimi-k2 (B N).
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap), $(cat .snapB/COMMIT) (.snapB)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
py="-DMOK_TORCH=ON -DPython3_EXECUTABLE=$(command -v python3)"
( cd $root/.snapB && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release $py -Drapidcheck_DIR=$rc > /tmp/build_b.log 2>&1 && cmake --build build -j5 --target mok_torch mok-bench >> /tmp/build_b.log 2>&1; echo "build .snapB (mok_torch, mok-bench) rc $?" >> "$out/summary.log" ) &
cd $root/.snap
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release $py -Drapidcheck_DIR=$rc > /tmp/build.log 2>&1 && cmake --build build -j11 >> /tmp/build.log 2>&1
echo "build .snap rc $?" | tee -a "$out/summary.log"
grep -E "warning|error" /tmp/build.log | grep -v "nccl_device\|stl_algobase\|Warray-bounds" | head -5 | tee -a "$out/summary.log"
log built
timeout 130 ctest --test-dir build -L gpu --output-on-failure --timeout 120 > "$out/gpu_tests.log" 2>&1
echo "ctest -L gpu rc $?: $(grep -E 'tests passed|tests failed' "$out/gpu_tests.log")" | tee -a "$out/summary.log"
grep -E "\*\*\*Failed|Timeout|Not Run" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
for m in off on; do
  echo "#### mok-verify golden/data --backend gpu --recompute $m" >> "$out/verify.log"
  timeout 60 build/verify/mok-verify golden/data --backend gpu --recompute $m >> "$out/verify.log" 2>&1
  echo "goldens recompute $m rc $?: $(grep -cE '^EQUAL' "$out/verify.log") EQUAL so far, $(grep -cE '^(MISMATCH|ERROR)' "$out/verify.log") MISMATCH/ERROR" | tee -a "$out/summary.log"
done
( cd python/tests && PYTHONPATH=$PWD/../../build/python MOK_GOLDEN_DIR=$PWD/../../golden/data timeout 100 python3 -m pytest -q -rs test_cuda.py test_errors.py > "$out/pytest.log" 2>&1; echo "pytest rc $?: $(tail -1 "$out/pytest.log")" | tee -a "$out/summary.log" )
filter="Gpu.MatchesReference*:Gpu.Fp8BackwardMatchesReferenceBitForBit:LayerApi.Bf16WeightGradientsAreTheFp32OnesRoundedOrAddedAsAutogradAdds"
for tool in memcheck synccheck racecheck initcheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 1 build/megakernel/tests/mok_megakernel_tests --gtest_filter="$filter" > /tmp/san.log 2>&1
  echo "$tool rc $?: $(grep 'ERROR SUMMARY' /tmp/san.log | tail -1) $(grep -E '^\[  (PASSED|FAILED)' /tmp/san.log | tr '\n' ' ')" | tee -a "$out/summary.log"
  { echo "== compute-sanitizer --tool $tool --gtest_filter=$filter"; head -c 60000 /tmp/san.log; } >> "$out/sanitize.log"
done
# The relay needs the colocated shares' kernels to run at once; a sanitizer that serializes launches ends them on the
# watchdog (5 s), which says so rather than hangs.
cf="Gpu.ColocatedEveryRoutingModeMatchesTheReference"
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 build/megakernel/tests/mok_megakernel_tests --gtest_filter="$cf" > /tmp/san.log 2>&1
echo "memcheck colocated rc $?: $(grep 'ERROR SUMMARY' /tmp/san.log | tail -1) $(grep -E '^\[  (PASSED|FAILED)' /tmp/san.log | tr '\n' ' ')" | tee -a "$out/summary.log"
{ echo "== compute-sanitizer --tool memcheck --gtest_filter=$cf"; head -c 30000 /tmp/san.log; } >> "$out/sanitize.log"
log "tests done"
wait
grep build "$out/summary.log"
export PYTHONUNBUFFERED=1
for fp in "" "--fp8"; do
  for tree in B N B N; do
    d=$root/.snap; [ $tree = B ] && d=$root/.snapB
    echo "#### $tree ($(cat $d/COMMIT)) mok-bench --shape kimi-k2 --runs 10 $fp" >> "$out/bench.log"
    timeout 40 $d/build/megakernel/mok-bench --shape kimi-k2 --runs 10 $fp >> "$out/bench.log" 2>&1; echo "bench $fp $tree rc $?" | tee -a "$out/summary.log"
  done
done
for tree in B N; do
  d=$root/.snap; [ $tree = B ] && d=$root/.snapB
  echo "#### $tree ($(cat $d/COMMIT)) op_bench.py --kernel-times --shape kimi-k2 --runs 10" >> "$out/kernel_times.log"
  PYTHONPATH=$d/build/python timeout 60 python3 bench/op_bench.py --kernel-times --shape kimi-k2 --runs 10 >> "$out/kernel_times.log" 2>&1; echo "kernel times $tree rc $?" | tee -a "$out/summary.log"
done
log done
