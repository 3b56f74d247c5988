#!/usr/bin/env bash
# call 2 (session 13): .snap = main with the fp8 K loop's work in the wgmma shadow and a's codes staged (4d0367f):
# GPU tests, goldens; fp8 forward all shapes against bbb1ada (.snap0) and the K loop alone (6f7be81, .snapK);
# bf16 kimi-k2 and olmoe against .snap0 (the staged-pass refactor touches the bf16 epilogues)
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap) vs $(cat .snap0/COMMIT) (.snap0), $(cat .snapK/COMMIT) (.snapK)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
( cd .snap && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$rc > "$out/build.log" 2>&1 && cmake --build build -j10 >> "$out/build.log" 2>&1; echo "build .snap rc $?: $(grep -c C7510 "$out/build.log") C7510" | tee -a "$out/summary.log" ) &
for t in .snap0 .snapK; do
( cd $t && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$rc > "$out/build$t.log" 2>&1 && cmake --build build -j3 --target mok-bench >> "$out/build$t.log" 2>&1; echo "build $t rc $?: $(grep -c C7510 "$out/build$t.log") C7510" | tee -a "$out/summary.log" ) &
done
wait
log built
cd "$root/.snap"
ctest --test-dir build -L gpu --output-on-failure --timeout 120 > "$out/gpu_tests.log" 2>&1
echo "ctest -L gpu rc $?: $(grep -E 'tests passed|tests failed' "$out/gpu_tests.log")" | tee -a "$out/summary.log"
grep -E "\*\*\*Failed|Timeout|Not Run" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
timeout 150 build/verify/mok-verify golden/data --backend gpu > "$out/verify.tmp" 2>&1
echo "verify rc $?: $(grep -cE '^EQUAL' "$out/verify.tmp") EQUAL, $(grep -cE '^(MISMATCH|ERROR)' "$out/verify.tmp") MISMATCH/ERROR" | tee -a "$out/summary.log"
cat "$out/verify.tmp" >> "$out/gpu_tests.log"; rm -f "$out/verify.tmp"
log "tests done"
for t in .snap0 .snapK .snap; do
  echo "#### $t mok-bench --shape all --runs 10 --fp8" >> "$out/bench.log"
  timeout 100 "$root/$t/build/megakernel/mok-bench" --shape all --runs 10 --fp8 >> "$out/bench.log" 2>&1; echo "bench fp8 $t rc $?" | tee -a "$out/summary.log"
done
for shape in kimi-k2 olmoe; do for t in .snap0 .snap; do
  echo "#### $t mok-bench --shape $shape --runs 10" >> "$out/bench.log"
  timeout 60 "$root/$t/build/megakernel/mok-bench" --shape $shape --runs 10 >> "$out/bench.log" 2>&1; echo "bench bf16 $shape $t rc $?" | tee -a "$out/summary.log"
done; done
log done
