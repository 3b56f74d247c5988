#!/usr/bin/env bash
# call 1 (session 20): .snap = 06ff81e (shared_dh_words for both precisions, accumulate_pairs on float2 again: never
# run on a GPU), .snapS = 78f086a (before the shared expert's bf16 outputs went through the staging rows, 4851dd7).
# .snap: GPU tests, goldens in both modes, the op's GPU tests, compute-sanitizer on the backward tests of both
# precisions (the shared expert's paths among them). A/B: op_bench --shared on all six shapes, S B S B, bf16; then
# --shared --fp8, S B.
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap), $(cat .snapS/COMMIT) (.snapS)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
py="-DMOK_TORCH=ON -DPython3_EXECUTABLE=$(command -v python3)"
( cd $root/.snapS && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release $py -Drapidcheck_DIR=$rc > /tmp/build_s.log 2>&1 && cmake --build build -j5 --target mok_torch >> /tmp/build_s.log 2>&1; echo "build .snapS (mok_torch) rc $?" >> "$out/summary.log" ) &
cd $root/.snap
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release $py -Drapidcheck_DIR=$rc > /tmp/build.log 2>&1 && cmake --build build -j11 >> /tmp/build.log 2>&1
echo "build .snap rc $?" | tee -a "$out/summary.log"
grep -E "warning|error" /tmp/build.log | grep -v "nccl_device\|stl_algobase\|Warray-bounds" | head -5 | tee -a "$out/summary.log"
log built
timeout 150 ctest --test-dir build -L gpu --output-on-failure --timeout 140 > "$out/gpu_tests.log" 2>&1
echo "ctest -L gpu rc $?: $(grep -E 'tests passed|tests failed' "$out/gpu_tests.log")" | tee -a "$out/summary.log"
grep -E "\*\*\*Failed|Timeout|Not Run" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
for m in off on; do
  echo "#### mok-verify golden/data --backend gpu --recompute $m" >> "$out/verify.log"
  timeout 100 build/verify/mok-verify golden/data --backend gpu --recompute $m >> "$out/verify.log" 2>&1
  echo "goldens recompute $m rc $?: $(grep -cE '^EQUAL' "$out/verify.log") EQUAL so far, $(grep -cE '^(MISMATCH|ERROR)' "$out/verify.log") MISMATCH/ERROR" | tee -a "$out/summary.log"
done
( cd python/tests && PYTHONPATH=$PWD/../../build/python MOK_GOLDEN_DIR=$PWD/../../golden/data timeout 150 python3 -m pytest -q -rs test_cuda.py test_errors.py > "$out/pytest.log" 2>&1; echo "pytest rc $?: $(tail -1 "$out/pytest.log")" | tee -a "$out/summary.log" )
filter="Gpu.MatchesReference*:Gpu.Fp8BackwardMatchesReferenceBitForBit:LayerApi.Bf16WeightGradientsAreTheFp32OnesRoundedOrAddedAsAutogradAdds"
for tool in memcheck synccheck racecheck initcheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 1 build/megakernel/tests/mok_megakernel_tests --gtest_filter="$filter" > /tmp/san.log 2>&1
  echo "$tool rc $?: $(grep 'ERROR SUMMARY' /tmp/san.log | tail -1) $(grep -E '^\[  (PASSED|FAILED)' /tmp/san.log | tr '\n' ' ')" | tee -a "$out/summary.log"
  { echo "== compute-sanitizer --tool $tool --gtest_filter=$filter"; head -c 60000 /tmp/san.log; } >> "$out/sanitize.log"
done
log "tests done"
wait
grep build "$out/summary.log"
export PYTHONUNBUFFERED=1
for tree in S B S B; do
  d=$root/.snap; [ $tree = S ] && d=$root/.snapS
  echo "#### $tree ($(cat $d/COMMIT)) op_bench.py --shape all --runs 10 --shared" >> "$out/op_bench_shared.log"
  PYTHONPATH=$d/build/python timeout 100 python3 bench/op_bench.py --shape all --runs 10 --shared >> "$out/op_bench_shared.log" 2>&1; echo "op_bench --shared $tree rc $?" | tee -a "$out/summary.log"
done
for tree in S B; do
  d=$root/.snap; [ $tree = S ] && d=$root/.snapS
  echo "#### $tree ($(cat $d/COMMIT)) op_bench.py --shape all --runs 10 --shared --fp8" >> "$out/op_bench_shared.log"
  PYTHONPATH=$d/build/python timeout 100 python3 bench/op_bench.py --shape all --runs 10 --shared --fp8 >> "$out/op_bench_shared.log" 2>&1; echo "op_bench --shared --fp8 $tree rc $?" | tee -a "$out/summary.log"
done
log done
