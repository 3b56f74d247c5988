#!/usr/bin/env bash
# call 1 (session 19): .snap = the working tree over 3290ff5 (bf16 weight gradients, written and accumulated, go
# through the staging rows, 16 bytes per lane, instead of 4-byte pairs; the bf16 accumulation rule one core function
# for CPU and GPU; token_tiles_gemm; one alignment check) against .snapH = 3290ff5, and .snapC = c7fdae2 for the fp8
# backward's spills.
# .snap: mok-scalar-check to_bf16x2, GPU tests, goldens in both modes, the op's GPU tests (session 18's final
# accumulation tests and the fp8 accumulate_grad test had not run on a GPU). A/B: op_bench --kernel-times kimi-k2
# (H B H B: the plain path's backward kernel), op_bench on all six shapes (H B); mok-bench kimi-k2 --fp8 (C B C B).
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap), $(cat .snapH/COMMIT) (.snapH), $(cat .snapC/COMMIT) (.snapC)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
py="-DMOK_TORCH=ON -DPython3_EXECUTABLE=$(command -v python3)"
( cd $root/.snapC && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$rc > /tmp/build_c.log 2>&1 && cmake --build build -j2 --target mok-bench >> /tmp/build_c.log 2>&1; echo "build .snapC (mok-bench) rc $?" >> "$out/summary.log" ) &
( cd $root/.snapH && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release $py -Drapidcheck_DIR=$rc > /tmp/build_h.log 2>&1 && cmake --build build -j5 --target mok_torch >> /tmp/build_h.log 2>&1; echo "build .snapH (mok_torch) rc $? $(grep -c error /tmp/build_h.log)" >> "$out/summary.log" ) &
cd $root/.snap
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release $py -Drapidcheck_DIR=$rc > /tmp/build.log 2>&1 && cmake --build build -j9 >> /tmp/build.log 2>&1
echo "build .snap rc $?" | tee -a "$out/summary.log"
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
cat "$out/summary.log" | grep build
export PYTHONUNBUFFERED=1
for tree in H B H B; do
  d=$root/.snap; [ $tree = H ] && d=$root/.snapH
  echo "#### $tree ($(cat $d/COMMIT)) op_bench.py --kernel-times --shape kimi-k2 --runs 10" >> "$out/kernel_times.log"
  PYTHONPATH=$d/build/python timeout 90 python3 bench/op_bench.py --kernel-times --shape kimi-k2 --runs 10 >> "$out/kernel_times.log" 2>&1; echo "kernel times $tree rc $?" | tee -a "$out/summary.log"
done
for tree in H B; do
  d=$root/.snap; [ $tree = H ] && d=$root/.snapH
  echo "#### $tree ($(cat $d/COMMIT)) op_bench.py --shape all --runs 10" >> "$out/op_bench.log"
  PYTHONPATH=$d/build/python timeout 120 python3 bench/op_bench.py --shape all --runs 10 >> "$out/op_bench.log" 2>&1; echo "op_bench all $tree rc $?" | tee -a "$out/summary.log"
done
log "op A/B done"
for tree in C B C B; do
  d=$root/.snap; [ $tree = H ] && d=$root/.snapH; [ $tree = C ] && d=$root/.snapC
  echo "#### $tree ($(cat $d/COMMIT)) mok-bench --shape kimi-k2 --runs 10 --fp8" >> "$out/bench_fp8.log"
  timeout 60 $d/build/megakernel/mok-bench --shape kimi-k2 --runs 10 --fp8 >> "$out/bench_fp8.log" 2>&1; echo "bench fp8 $tree rc $?" | tee -a "$out/summary.log"
done
log done
