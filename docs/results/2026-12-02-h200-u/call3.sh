#!/usr/bin/env bash
# call 3 (session 18): .snapB, the working tree over 3366ce8 (to_bf16x2: every bf16 pair rounded by the hardware's
# cvt.rn.bf16x2.f32, NaN made 0x7fc0, in pack_bf16 and the bf16 accumulate_into; op_bench --kernel-times without
# x.grad adds) against .snap = 3366ce8 (call 2's kernels). B: mok-scalar-check on every input of to_bf16x2, GPU tests,
# goldens in both modes, the op's GPU tests. A/B: mok-bench kimi-k2 bf16 (A B A B) and fp8 (A B). B: op_bench
# --kernel-times kimi-k2 (the three gradient modes), op_bench kimi-k2 plain / --accumulate fp32 / --accumulate bf16,
# op_bench --recompute on all six shapes.
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snapB/COMMIT) (.snapB), $(cat .snap/COMMIT) (.snap)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
( cd $root/.snap && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$rc > /tmp/build_a.log 2>&1 && cmake --build build -j6 --target mok-bench >> /tmp/build_a.log 2>&1; echo "build .snap (mok-bench) rc $?" >> "$out/summary.log" ) &
cd $root/.snapB
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_TORCH=ON -DPython3_EXECUTABLE="$(command -v python3)" -Drapidcheck_DIR=$rc > /tmp/build.log 2>&1 && cmake --build build -j10 >> /tmp/build.log 2>&1
echo "build .snapB rc $?" | tee -a "$out/summary.log"
grep -E "warning|error" /tmp/build.log | grep -v "nccl_device\|stl_algobase\|Warray-bounds" | head -5 | tee -a "$out/summary.log"
log built
timeout 120 build/megakernel/mok-scalar-check 1 to_bf16x2 > "$out/scalar_check.log" 2>&1; echo "scalar-check to_bf16x2 (every input) rc $?: $(head -1 "$out/scalar_check.log")" | tee -a "$out/summary.log"
timeout 150 ctest --test-dir build -L gpu --output-on-failure --timeout 140 > "$out/gpu_tests.log" 2>&1
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
for run in "A bf16" "B bf16" "A bf16" "B bf16" "A fp8" "B fp8"; do
  set -- $run
  tree=$root/.snap; [ $1 = B ] && tree=$root/.snapB
  flag=""; [ $2 = fp8 ] && flag=--fp8
  echo "#### $1 ($(cat $tree/COMMIT)) mok-bench --shape kimi-k2 --runs 10 $flag" >> "$out/bench_ab.log"
  timeout 60 $tree/build/megakernel/mok-bench --shape kimi-k2 --runs 10 $flag >> "$out/bench_ab.log" 2>&1; echo "bench $run rc $?" | tee -a "$out/summary.log"
done
log "A/B done"
export PYTHONPATH=$PWD/build/python PYTHONUNBUFFERED=1
timeout 90 python3 bench/op_bench.py --kernel-times --shape kimi-k2 --runs 10 > "$out/kernel_times.log" 2>&1; echo "kernel times kimi-k2 rc $?" | tee -a "$out/summary.log"
for mode in "" "--accumulate fp32" "--accumulate bf16"; do
  echo "#### op_bench.py --shape kimi-k2 --runs 10 $mode" >> "$out/op_bench.log"
  timeout 60 python3 bench/op_bench.py --shape kimi-k2 --runs 10 $mode >> "$out/op_bench.log" 2>&1; echo "op_bench kimi-k2 $mode rc $?" | tee -a "$out/summary.log"
done
timeout 100 python3 bench/op_bench.py --shape all --runs 10 --recompute >> "$out/op_bench.log" 2>&1; echo "op_bench all --recompute rc $?" | tee -a "$out/summary.log"
log done
