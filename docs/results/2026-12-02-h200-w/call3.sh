#!/usr/bin/env bash
# call 3 (session 20): .snap = call 2's tree with the fix of the wgmma serialization that call 2 measured (ptxas
# C7515: the relayed chains' accumulators set to zero on the first GPU and loaded on the others, in two branches, made
# ptxas serialize every wgmma of the backward kernels; now every GPU loads them, the first from a half tile of zeros),
# the LayerMemory tests' expected sizes in the shared expert's rows; .snapB = 06ff81e.
# .snap: GPU tests, goldens in both modes, the op's GPU tests. A/B on one GPU: mok-bench kimi-k2 bf16 (B N B N),
# fp8 (B N), olmoe bf16 (B N), op_bench --kernel-times kimi-k2 (B N).
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
grep -E "warning|error" /tmp/build.log | grep -v "nccl_device\|stl_algobase\|Warray-bounds" | head -5 | tee -a "$out/summary.log"
log built
timeout 200 ctest --test-dir build -L gpu --output-on-failure --timeout 180 > "$out/gpu_tests.log" 2>&1
echo "ctest -L gpu rc $?: $(grep -E 'tests passed|tests failed' "$out/gpu_tests.log")" | tee -a "$out/summary.log"
grep -E "\*\*\*Failed|Timeout|Not Run" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
for m in off on; do
  echo "#### mok-verify golden/data --backend gpu --recompute $m" >> "$out/verify.log"
  timeout 100 build/verify/mok-verify golden/data --backend gpu --recompute $m >> "$out/verify.log" 2>&1
  echo "goldens recompute $m rc $?: $(grep -cE '^EQUAL' "$out/verify.log") EQUAL so far, $(grep -cE '^(MISMATCH|ERROR)' "$out/verify.log") MISMATCH/ERROR" | tee -a "$out/summary.log"
done
( cd python/tests && PYTHONPATH=$PWD/../../build/python MOK_GOLDEN_DIR=$PWD/../../golden/data timeout 150 python3 -m pytest -q -rs test_cuda.py test_errors.py > "$out/pytest.log" 2>&1; echo "pytest rc $?: $(tail -1 "$out/pytest.log")" | tee -a "$out/summary.log" )
log "tests done"
wait
grep build "$out/summary.log"
for tree in B N B N; do
  d=$root/.snap; [ $tree = B ] && d=$root/.snapB
  echo "#### $tree ($(cat $d/COMMIT)) mok-bench --shape kimi-k2 --runs 10" >> "$out/bench.log"
  timeout 60 $d/build/megakernel/mok-bench --shape kimi-k2 --runs 10 >> "$out/bench.log" 2>&1; echo "bench $tree rc $?" | tee -a "$out/summary.log"
done
for tree in B N; do
  d=$root/.snap; [ $tree = B ] && d=$root/.snapB
  echo "#### $tree ($(cat $d/COMMIT)) mok-bench --shape kimi-k2 --runs 10 --fp8" >> "$out/bench.log"
  timeout 60 $d/build/megakernel/mok-bench --shape kimi-k2 --runs 10 --fp8 >> "$out/bench.log" 2>&1; echo "bench fp8 $tree rc $?" | tee -a "$out/summary.log"
done
for tree in B N; do
  d=$root/.snap; [ $tree = B ] && d=$root/.snapB
  echo "#### $tree ($(cat $d/COMMIT)) mok-bench --shape olmoe --runs 10" >> "$out/bench.log"
  timeout 60 $d/build/megakernel/mok-bench --shape olmoe --runs 10 >> "$out/bench.log" 2>&1; echo "bench olmoe $tree rc $?" | tee -a "$out/summary.log"
done
export PYTHONUNBUFFERED=1
for tree in B N; do
  d=$root/.snap; [ $tree = B ] && d=$root/.snapB
  echo "#### $tree ($(cat $d/COMMIT)) op_bench.py --kernel-times --shape kimi-k2 --runs 10" >> "$out/kernel_times.log"
  PYTHONPATH=$d/build/python timeout 90 python3 bench/op_bench.py --kernel-times --shape kimi-k2 --runs 10 >> "$out/kernel_times.log" 2>&1; echo "kernel times $tree rc $?" | tee -a "$out/summary.log"
done
log done
