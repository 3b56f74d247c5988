#!/usr/bin/env bash
# call 2 (session 21): .snap = the working tree over 1da79f3: the dispatch's pulls beside the GEMM that reads their
# rows (PullBeside: the producer warpgroup's warps 1-3 pull x beside GEMM1 and dy beside dy W2, a tile's TMA waits
# for its ring slot's count; no pull phase and no grid barrier before those GEMMs); the host-only tests in a CPU
# executable. .snapB = 1da79f3. .snap: GPU tests, goldens in both modes, the op's GPU tests, compute-sanitizer
# (memcheck, synccheck, racecheck) on the forward/backward tests, many ring cycles and one block among them, and
# a colocated test. A/B: mok-bench kimi-k2 bf16 (B N B N), --fp8 (B N), --shape all --runs 5 (B N).
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap), $(cat .snapB/COMMIT) (.snapB)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
py="-DMOK_TORCH=ON -DPython3_EXECUTABLE=$(command -v python3)"
( cd $root/.snapB && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$rc > /tmp/build_b.log 2>&1 && cmake --build build -j5 --target mok-bench >> /tmp/build_b.log 2>&1; echo "build .snapB (mok-bench) rc $?" >> "$out/summary.log" ) &
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
filter="Gpu.MatchesReference*:Gpu.Fp8BackwardMatchesReferenceBitForBit:Gpu.LaunchAndRingInvariance:Gpu.ColocatedEveryRoutingModeMatchesTheReference"
for tool in memcheck synccheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 1 build/megakernel/tests/mok_megakernel_tests --gtest_filter="$filter" > /tmp/san.log 2>&1
  echo "$tool rc $?: $(grep 'ERROR SUMMARY' /tmp/san.log | tail -1) $(grep -E '^\[  (PASSED|FAILED)' /tmp/san.log | tr '\n' ' ')" | tee -a "$out/summary.log"
  { echo "== compute-sanitizer --tool $tool --gtest_filter=$filter"; head -c 60000 /tmp/san.log; } >> "$out/sanitize.log"
done
log "tests done"
wait
grep build "$out/summary.log"
for tree in B N B N; do
  d=$root/.snap; [ $tree = B ] && d=$root/.snapB
  echo "#### $tree ($(cat $d/COMMIT)) mok-bench --shape kimi-k2 --runs 10" >> "$out/bench.log"
  timeout 40 $d/build/megakernel/mok-bench --shape kimi-k2 --runs 10 >> "$out/bench.log" 2>&1; echo "bench $tree rc $?" | tee -a "$out/summary.log"
done
for tree in B N; do
  d=$root/.snap; [ $tree = B ] && d=$root/.snapB
  echo "#### $tree ($(cat $d/COMMIT)) mok-bench --shape kimi-k2 --runs 10 --fp8" >> "$out/bench.log"
  timeout 40 $d/build/megakernel/mok-bench --shape kimi-k2 --runs 10 --fp8 >> "$out/bench.log" 2>&1; echo "bench --fp8 $tree rc $?" | tee -a "$out/summary.log"
done
for tree in B N; do
  d=$root/.snap; [ $tree = B ] && d=$root/.snapB
  echo "#### $tree ($(cat $d/COMMIT)) mok-bench --shape all --runs 5" >> "$out/bench_all.log"
  timeout 75 $d/build/megakernel/mok-bench --shape all --runs 5 >> "$out/bench_all.log" 2>&1; echo "bench all $tree rc $?" | tee -a "$out/summary.log"
done
log done
