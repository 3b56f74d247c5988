#!/usr/bin/env bash
# call 5 (session 14): main after the review (warp_row_pass skips batches past a row's end; the colocated fp8 case with
# the weights given): GPU tests; kimi-k2 bf16 and fp8 with the new back-to-back step, the SM clock logged beside them
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
cd .snap
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$rc > "$out/build.log" 2>&1 && cmake --build build -j16 >> "$out/build.log" 2>&1
echo "build rc $?" | tee -a "$out/summary.log"
log built
timeout 120 ctest --test-dir build -L gpu --output-on-failure --timeout 110 > "$out/gpu_tests.log" 2>&1
echo "ctest -L gpu rc $?: $(grep -E 'tests passed|tests failed' "$out/gpu_tests.log")" | tee -a "$out/summary.log"
grep -E "\*\*\*Failed|Timeout|Not Run" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
log "tests done"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 100 > "$out/clocks.csv" 2>&1 &
smi=$!
for mode in "" "--fp8"; do
  log "mok-bench kimi-k2 $mode start"
  timeout 60 stdbuf -oL -eL build/megakernel/mok-bench --shape kimi-k2 --runs 10 $mode 2>&1 |
    while IFS= read -r line; do echo "$(date -u +%T.%3N) $line"; done > "$out/bench$mode.log"
  echo "bench kimi-k2 $mode rc ${PIPESTATUS[0]}" | tee -a "$out/summary.log"
done
kill $smi
log done
