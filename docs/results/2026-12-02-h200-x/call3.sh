#!/usr/bin/env bash
# call 3 (session 21): .snap = the working tree over 1da79f3 as it landed: the pull beside the forward's GEMM1 only
# (call 2 measured the backward's dy pull beside dy W2 slower: the side warps do not keep up with dy W2, bf16 or fp8),
# the fp8 consumers reading A's exponents after stage 0 only where rows were pulled beside; host tests on the CPU.
# .snapB = 1da79f3. .snap: GPU tests, goldens (recompute off). A/B, one GPU, B N B N per shape: mok-bench --runs 5
# on kimi-k2, deepseek-v4 (call 2's one pair of runs: slower), qwen3-30b-a3b and olmoe (small K, rows of 4 KB);
# then --fp8 kimi-k2 (B N).
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap), $(cat .snapB/COMMIT) (.snapB)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
( cd $root/.snapB && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$rc > /tmp/build_b.log 2>&1 && cmake --build build -j5 --target mok-bench >> /tmp/build_b.log 2>&1; echo "build .snapB (mok-bench) rc $?" >> "$out/summary.log" ) &
cd $root/.snap
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$rc > /tmp/build.log 2>&1 && cmake --build build -j11 >> /tmp/build.log 2>&1
echo "build .snap rc $?" | tee -a "$out/summary.log"
grep -E "warning|error" /tmp/build.log | grep -v "nccl_device\|stl_algobase\|Warray-bounds" | head -5 | tee -a "$out/summary.log"
log built
timeout 130 ctest --test-dir build -L gpu --output-on-failure --timeout 120 > "$out/gpu_tests.log" 2>&1
echo "ctest -L gpu rc $?: $(grep -E 'tests passed|tests failed' "$out/gpu_tests.log")" | tee -a "$out/summary.log"
grep -E "\*\*\*Failed|Timeout|Not Run" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
timeout 40 build/verify/mok-verify golden/data --backend gpu > "$out/verify.log" 2>&1
echo "goldens rc $?: $(grep -cE '^EQUAL' "$out/verify.log") EQUAL, $(grep -cE '^(MISMATCH|ERROR)' "$out/verify.log") MISMATCH/ERROR" | tee -a "$out/summary.log"
log "tests done"
wait
grep build "$out/summary.log"
bench() {  # tree, shape, extra flags
  local d=$root/.snap; [ $1 = B ] && d=$root/.snapB
  echo "#### $1 ($(cat $d/COMMIT)) mok-bench --shape $2 --runs 5 ${3:-}" >> "$out/bench.log"
  timeout 40 $d/build/megakernel/mok-bench --shape $2 --runs 5 ${3:-} >> "$out/bench.log" 2>&1; echo "bench $2 ${3:-} $1 rc $?" | tee -a "$out/summary.log"
}
for shape in kimi-k2 deepseek-v4 qwen3-30b-a3b olmoe; do
  for tree in B N B N; do bench $tree $shape; done
done
for tree in B N; do bench $tree kimi-k2 --fp8; done
log done
