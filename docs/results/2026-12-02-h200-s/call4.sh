#!/usr/bin/env bash
# call 4 (session 16): aq (and the shared expert's dh codes) stored 8 bytes at a time after a quad transpose
# (.snap, working tree over 0d5d9e5) against 0d5d9e5 (.snap0, the landed sigmoid change): GPU tests, goldens in both
# modes; A/B mok-bench kimi-k2 and qwen3-30b-a3b fp8 (cut to fit the session's last 400 s of device time: no torch
# build, no op tests, no op_bench)
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap), $(cat .snap0/COMMIT) (.snap0)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
( cd $root/.snap0 && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$rc > "$out/build0.log" 2>&1 && cmake --build build -j5 --target mok-bench >> "$out/build0.log" 2>&1; echo "build .snap0 rc $?" >> "$out/summary.log" ) &
cd $root/.snap
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$rc > "$out/build.log" 2>&1 && cmake --build build -j12 >> "$out/build.log" 2>&1
echo "build rc $?" | tee -a "$out/summary.log"
grep -E "C7510|error" "$out/build.log" | head -5 | tee -a "$out/summary.log"
log built
timeout 150 ctest --test-dir build -L gpu --output-on-failure --timeout 140 -E scalar_functions > "$out/gpu_tests.log" 2>&1
echo "ctest -L gpu rc $?: $(grep -E 'tests passed|tests failed' "$out/gpu_tests.log")" | tee -a "$out/summary.log"
grep -E "\*\*\*Failed|Timeout|Not Run" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
for m in off on; do
  echo "#### mok-verify golden/data --backend gpu --recompute $m" >> "$out/verify.log"
  timeout 100 build/verify/mok-verify golden/data --backend gpu --recompute $m >> "$out/verify.log" 2>&1
  echo "goldens recompute $m rc $?" | tee -a "$out/summary.log"
done
grep -cE "EQUAL" "$out/verify.log" | sed 's/^/EQUAL lines: /' | tee -a "$out/summary.log"
log "tests done"
wait
for shape in kimi-k2 qwen3-30b-a3b; do
  for tree in .snap0 .snap; do
    echo "#### $tree mok-bench --shape $shape --runs 10 --fp8" >> "$out/bench.log"
    ( cd $root/$tree && timeout 60 build/megakernel/mok-bench --shape $shape --runs 10 --fp8 >> "$out/bench.log" 2>&1; echo "bench $tree $shape fp8 rc $?" >> "$out/summary.log" )
  done
done
log "bench done"
log done
