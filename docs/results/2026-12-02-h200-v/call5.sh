#!/usr/bin/env bash
# call 5 (session 19): .snap = the working tree over 78f086a (the shared expert's bf16 GEMM outputs, shared_y and
# the shared dx, through the staging rows; the bf16 backward's dh_s a word at a time instead of element by element)
# against .snapH = 78f086a. .snap: GPU tests, goldens (recompute off); then op_bench --shared kimi-k2, H B H B.
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap), $(cat .snapH/COMMIT) (.snapH)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
py="-DMOK_TORCH=ON -DPython3_EXECUTABLE=$(command -v python3)"
( cd $root/.snapH && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release $py -Drapidcheck_DIR=$rc > /tmp/build_h.log 2>&1 && cmake --build build -j5 --target mok_torch >> /tmp/build_h.log 2>&1; echo "build .snapH (mok_torch) rc $?" >> "$out/summary.log" ) &
cd $root/.snap
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release $py -Drapidcheck_DIR=$rc > /tmp/build.log 2>&1 && cmake --build build -j11 >> /tmp/build.log 2>&1
echo "build .snap rc $?" | tee -a "$out/summary.log"
log built
timeout 110 ctest --test-dir build -L gpu --output-on-failure --timeout 100 > "$out/gpu_tests.log" 2>&1
echo "ctest -L gpu rc $?: $(grep -E 'tests passed|tests failed' "$out/gpu_tests.log")" | tee -a "$out/summary.log"
grep -E "\*\*\*Failed|Timeout|Not Run" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
timeout 60 build/verify/mok-verify golden/data --backend gpu > "$out/verify.log" 2>&1
echo "goldens rc $?: $(grep -cE '^EQUAL' "$out/verify.log") EQUAL, $(grep -cE '^(MISMATCH|ERROR)' "$out/verify.log") MISMATCH/ERROR" | tee -a "$out/summary.log"
wait
export PYTHONUNBUFFERED=1
for tree in H B H B; do
  d=$root/.snap; [ $tree = H ] && d=$root/.snapH
  echo "#### $tree ($(cat $d/COMMIT)) op_bench.py --shape kimi-k2 --runs 10 --shared" >> "$out/op_bench.log"
  PYTHONPATH=$d/build/python timeout 40 python3 bench/op_bench.py --shape kimi-k2 --runs 10 --shared >> "$out/op_bench.log" 2>&1; echo "op_bench kimi-k2 --shared $tree rc $?" | tee -a "$out/summary.log"
done
log done
