#!/usr/bin/env bash
# call 1: epilogue warps (working tree over ddd9a60, .snap) vs ddd9a60 (.snap0): GPU tests + goldens on the new tree, then A/B bench
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: working tree over ddd9a60 (.snap) vs ddd9a60 (.snap0)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
build() { cd "$root/$1" && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$PWD/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck > "$out/build_$1.log" 2>&1 && cmake --build build -j8 >> "$out/build_$1.log" 2>&1; echo "build $1 rc $?" | tee -a "$out/summary.log"; }
build .snap & build .snap0 & wait
log built
cd "$root/.snap"
ctest --test-dir build -L gpu --output-on-failure --timeout 120 > "$out/gpu_tests.log" 2>&1
echo "ctest -L gpu rc $?: $(grep -E 'tests passed|tests failed' "$out/gpu_tests.log")" | tee -a "$out/summary.log"
grep -E "\*\*\*Failed|Timeout|Not Run" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
timeout 150 build/verify/mok-verify golden/data --backend gpu > "$out/verify.log" 2>&1
echo "verify rc $?: $(grep -cE '^EQUAL' "$out/verify.log") EQUAL, $(grep -cE '^(MISMATCH|ERROR)' "$out/verify.log") MISMATCH/ERROR" | tee -a "$out/summary.log"
log "tests done"
for mode in "" "--fp8"; do
  for t in .snap0 .snap; do
    echo "#### $t mok-bench --shape all --runs 10 $mode" >> "$out/bench.log"
    timeout 200 "$root/$t/build/megakernel/mok-bench" --shape all --runs 10 $mode >> "$out/bench.log" 2>&1
    echo "bench $t $mode rc $?" | tee -a "$out/summary.log"
  done
done
log done
