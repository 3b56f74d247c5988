#!/usr/bin/env bash
# call 4 (session 20): .snap = call 3's tree with the relayed chains of the shared expert's weight gradients in a
# kernel of their own (relayed_chains_kernel, launched after the backward across GPUs): in the backward kernel their
# tile phase raised its register pressure, and call 3 measured the fp32 accumulate_into path's backward kernel at
# 28.13 against 25.24 ms; .snapB = 06ff81e. GPU tests, then A/B op_bench --kernel-times kimi-k2 (B N), mok-bench
# kimi-k2 (B N), goldens (recompute off). The device time left was about 5 minutes.
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
log built
timeout 120 ctest --test-dir build -L gpu --output-on-failure --timeout 110 > "$out/gpu_tests.log" 2>&1
echo "ctest -L gpu rc $?: $(grep -E 'tests passed|tests failed' "$out/gpu_tests.log")" | tee -a "$out/summary.log"
grep -E "\*\*\*Failed|Timeout|Not Run" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
wait
grep build "$out/summary.log"
export PYTHONUNBUFFERED=1
for tree in B N; do
  d=$root/.snap; [ $tree = B ] && d=$root/.snapB
  echo "#### $tree ($(cat $d/COMMIT)) op_bench.py --kernel-times --shape kimi-k2 --runs 10" >> "$out/kernel_times.log"
  PYTHONPATH=$d/build/python timeout 60 python3 bench/op_bench.py --kernel-times --shape kimi-k2 --runs 10 >> "$out/kernel_times.log" 2>&1; echo "kernel times $tree rc $?" | tee -a "$out/summary.log"
done
for tree in B N; do
  d=$root/.snap; [ $tree = B ] && d=$root/.snapB
  echo "#### $tree ($(cat $d/COMMIT)) mok-bench --shape kimi-k2 --runs 10" >> "$out/bench.log"
  timeout 40 $d/build/megakernel/mok-bench --shape kimi-k2 --runs 10 >> "$out/bench.log" 2>&1; echo "bench $tree rc $?" | tee -a "$out/summary.log"
done
timeout 40 build/verify/mok-verify golden/data --backend gpu > "$out/verify.log" 2>&1
echo "goldens rc $?: $(grep -cE '^EQUAL' "$out/verify.log") EQUAL, $(grep -cE '^(MISMATCH|ERROR)' "$out/verify.log") MISMATCH/ERROR" | tee -a "$out/summary.log"
log done
