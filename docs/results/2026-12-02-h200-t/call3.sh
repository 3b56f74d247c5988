#!/usr/bin/env bash
# call 3 (session 17): the working tree over 9996741 (.snap: the layer refuses a missing or misaligned workspace,
# op_bench --values): GPU tests and the op's GPU tests; then the SM clock, power and clock-event reasons logged every
# 50 ms over mok-bench kimi-k2 bf16 (10 runs, then 100) and op_bench kimi-k2 (--kernel-times, then the step table);
# last, op_bench on all six shapes, bf16 and fp8 (the op's table)
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
( cd python/tests && PYTHONPATH=$PWD/../../build/python MOK_GOLDEN_DIR=$PWD/../../golden/data timeout 150 python3 -m pytest -q test_cuda.py test_errors.py > "$out/pytest.log" 2>&1; echo "pytest rc $?: $(tail -1 "$out/pytest.log")" | tee -a "$out/summary.log" )
log "tests done"
fields=timestamp,clocks.sm,power.draw.instant,power.draw.average,temperature.gpu,clocks_event_reasons.active,clocks_event_reasons.sw_power_cap,clocks_event_reasons.hw_slowdown,clocks_event_reasons.sw_thermal_slowdown
nvidia-smi --query-gpu=$fields --format=csv -lms 50 > "$out/clocks.csv" 2>&1 &
smi=$!
sleep 1
run() { echo "#### $(date -u +%T.%N | cut -c1-12) $*" >> "$out/power_runs.log"; "$@" >> "$out/power_runs.log" 2>&1; echo "rc $? $(date -u +%T.%N | cut -c1-12)" >> "$out/power_runs.log"; }
run timeout 60 build/megakernel/mok-bench --shape kimi-k2 --runs 10
run timeout 90 build/megakernel/mok-bench --shape kimi-k2 --runs 100
export PYTHONPATH=$PWD/build/python PYTHONUNBUFFERED=1
run timeout 60 python3 bench/op_bench.py --kernel-times --shape kimi-k2 --runs 10
run timeout 60 python3 bench/op_bench.py --shape kimi-k2 --runs 10
kill $smi
log "power runs done"
timeout 170 python3 bench/op_bench.py --shape all --runs 10 > "$out/op_bench_bf16.log" 2>&1; echo "op_bench all bf16 rc $?" | tee -a "$out/summary.log"
timeout 150 python3 bench/op_bench.py --shape all --runs 10 --fp8 > "$out/op_bench_fp8.log" 2>&1; echo "op_bench all fp8 rc $?" | tee -a "$out/summary.log"
log done
