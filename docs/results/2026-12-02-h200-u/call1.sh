#!/usr/bin/env bash
# call 1 (session 18): the landed HEAD c7fdae2 (.snap) checked whole: GPU tests, goldens in both modes, the op's GPU
# tests (the autograd fix's CUDA twin); with the SM clock and power logged every 50 ms: mok-bench kimi-k2
# --sustained 3, op_bench kimi-k2 --kernel-times (the two saved-sized fills should be gone), op_bench kimi-k2 plain and
# --accumulate (the "peak beyond" line should be ~0); then op_bench on all six shapes, bf16 and fp8; last, mok-bench on
# all six shapes with --sustained 2 (bf16)
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
cd $root/.snap
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_TORCH=ON -DPython3_EXECUTABLE="$(command -v python3)" -Drapidcheck_DIR=$rc > /tmp/build.log 2>&1 && cmake --build build -j14 >> /tmp/build.log 2>&1
echo "build rc $?" | tee -a "$out/summary.log"
grep -E "warning|error" /tmp/build.log | grep -v nccl_device | head -5 | tee -a "$out/summary.log"
log built
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
fields=timestamp,clocks.sm,power.draw.instant,temperature.gpu,clocks_event_reasons.sw_power_cap,clocks_event_reasons.hw_slowdown,memory.used
nvidia-smi --query-gpu=$fields --format=csv -lms 50 > "$out/clocks.csv" 2>&1 &
smi=$!
sleep 1
run() { echo "#### $(date -u +%T.%N | cut -c1-12) $*" >> "$out/power_runs.log"; "$@" >> "$out/power_runs.log" 2>&1; echo "rc $? $(date -u +%T.%N | cut -c1-12)" >> "$out/power_runs.log"; }
run timeout 90 build/megakernel/mok-bench --shape kimi-k2 --runs 10 --sustained 3
export PYTHONPATH=$PWD/build/python PYTHONUNBUFFERED=1
run timeout 60 python3 bench/op_bench.py --kernel-times --shape kimi-k2 --runs 10
run timeout 60 python3 bench/op_bench.py --shape kimi-k2 --runs 10
run timeout 60 python3 bench/op_bench.py --shape kimi-k2 --runs 10 --accumulate
kill $smi
log "power runs done"
timeout 100 python3 bench/op_bench.py --shape all --runs 10 > "$out/op_bench_bf16.log" 2>&1; echo "op_bench all bf16 rc $?" | tee -a "$out/summary.log"
timeout 80 python3 bench/op_bench.py --shape all --runs 10 --fp8 >> "$out/op_bench_bf16.log" 2>&1; echo "op_bench all fp8 rc $? (appended to op_bench_bf16.log)" | tee -a "$out/summary.log"
log "op_bench done"
timeout 150 build/megakernel/mok-bench --shape all --runs 10 --sustained 2 > "$out/mok_sustained.log" 2>&1; echo "mok-bench all --sustained 2 rc $?" | tee -a "$out/summary.log"
log done
