#!/usr/bin/env bash
# call 3 (session 16): sigmoids by exp_f32_moderate and the weight gradients' maps as members (.snap, working tree over
# 5f701b4) against 5f701b4 (.snap0): GPU tests, goldens in both modes, the op's GPU tests, mok-scalar-check at every
# input (beside the tests); A/B mok-bench kimi-k2 and qwen3-30b-a3b, bf16 and fp8
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap), $(cat .snap0/COMMIT) (.snap0)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
for t in .snap0; do
  ( cd $root/$t && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$rc > "$out/build$t.log" 2>&1 && cmake --build build -j5 --target mok-bench >> "$out/build$t.log" 2>&1; echo "build $t rc $?" >> "$out/summary.log" ) &
done
cd $root/.snap
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_TORCH=ON -DPython3_EXECUTABLE="$(command -v python3)" -Drapidcheck_DIR=$rc > "$out/build.log" 2>&1 && cmake --build build -j12 >> "$out/build.log" 2>&1
echo "build rc $?" | tee -a "$out/summary.log"
grep -E "C7510|spill|warning" "$out/build.log" | head -5 | tee -a "$out/summary.log"
log built
( timeout 330 build/megakernel/mok-scalar-check 1 > "$out/scalar_check.log" 2>&1; echo "scalar-check (every input) rc $?: $(tail -1 "$out/scalar_check.log")" >> "$out/summary.log" ) &
spid=$!
timeout 150 ctest --test-dir build -L gpu --output-on-failure --timeout 140 -E scalar_functions > "$out/gpu_tests.log" 2>&1
echo "ctest -L gpu rc $?: $(grep -E 'tests passed|tests failed' "$out/gpu_tests.log")" | tee -a "$out/summary.log"
grep -E "\*\*\*Failed|Timeout|Not Run" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
for m in off on; do
  echo "#### mok-verify golden/data --backend gpu --recompute $m" >> "$out/verify.log"
  timeout 100 build/verify/mok-verify golden/data --backend gpu --recompute $m >> "$out/verify.log" 2>&1
  echo "goldens recompute $m rc $?" | tee -a "$out/summary.log"
done
grep -cE "EQUAL" "$out/verify.log" | sed 's/^/EQUAL lines: /' | tee -a "$out/summary.log"
( cd python/tests && PYTHONPATH=$PWD/../../build/python MOK_GOLDEN_DIR=$PWD/../../golden/data timeout 150 python3 -m pytest -q test_cuda.py test_errors.py > "$out/pytest.log" 2>&1; echo "pytest rc $?: $(tail -1 "$out/pytest.log")" | tee -a "$out/summary.log" )
log "tests done"
wait
log "scalar check and base build done"
for shape in kimi-k2 qwen3-30b-a3b; do
  for mode in "" "--fp8"; do
    for tree in .snap0 .snap; do
      echo "#### $tree mok-bench --shape $shape --runs 10 $mode" >> "$out/bench.log"
      ( cd $root/$tree && timeout 60 build/megakernel/mok-bench --shape $shape --runs 10 $mode >> "$out/bench.log" 2>&1; echo "bench $tree $shape $mode rc $?" >> "$out/summary.log" )
    done
  done
done
log "bench done"
log done
