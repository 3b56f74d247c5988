#!/usr/bin/env bash
# call 1 (session 14): main at the fp8 quantizers' rewrite (words, whole-warp shuffles): GPU tests, goldens (default,
# and recompute with a one-tile ring), the op's GPU tests; fp8 and bf16 on kimi-k2 and olmoe against 40abd31 (.snapA)
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap), $(cat .snapA/COMMIT) (.snapA)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
cd .snap
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_TORCH=ON -DPython3_EXECUTABLE="$(command -v python3)" -Drapidcheck_DIR=$rc > "$out/build.log" 2>&1 && cmake --build build -j16 >> "$out/build.log" 2>&1
echo "build rc $?: $(grep C75 "$out/build.log" | grep -vc tc_validate) C75xx outside tc_validate" | tee -a "$out/summary.log"
log built
( cd $root/.snapA && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$rc > "$out/buildA.log" 2>&1 && cmake --build build -j12 --target mok-bench >> "$out/buildA.log" 2>&1; echo "buildA rc $?" >> "$out/summary.log" ) &
ctest --test-dir build -L gpu --output-on-failure --timeout 150 > "$out/gpu_tests.log" 2>&1
echo "ctest -L gpu rc $?: $(grep -E 'tests passed|tests failed' "$out/gpu_tests.log")" | tee -a "$out/summary.log"
grep -E "\*\*\*Failed|Timeout|Not Run" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
for args in "" "--recompute on --ring-rows 128"; do
  timeout 150 build/verify/mok-verify golden/data --backend gpu $args > "$out/verify.tmp" 2>&1
  echo "verify '$args' rc $?: $(grep -cE '^EQUAL' "$out/verify.tmp") EQUAL, $(grep -cE '^(MISMATCH|ERROR)' "$out/verify.tmp") MISMATCH/ERROR" | tee -a "$out/summary.log"
  { echo "#### mok-verify golden/data --backend gpu $args"; cat "$out/verify.tmp"; } >> "$out/verify.log"; rm -f "$out/verify.tmp"
done
( cd python/tests && PYTHONPATH=$PWD/../../build/python MOK_GOLDEN_DIR=$PWD/../../golden/data timeout 150 python3 -m pytest -q test_cuda.py test_errors.py > "$out/pytest.log" 2>&1; echo "pytest rc $?: $(tail -1 "$out/pytest.log")" | tee -a "$out/summary.log" )
log "tests done"
wait
for shape in kimi-k2 olmoe; do for mode in "--fp8" ""; do for tree in .snapA .snap; do
  echo "#### $tree ($(cat $root/$tree/COMMIT)): mok-bench --shape $shape --runs 10 $mode" >> "$out/bench.log"
  timeout 60 $root/$tree/build/megakernel/mok-bench --shape $shape --runs 10 $mode >> "$out/bench.log" 2>&1; echo "bench $tree $shape $mode rc $?" | tee -a "$out/summary.log"
done; done; done
log "bench done"
