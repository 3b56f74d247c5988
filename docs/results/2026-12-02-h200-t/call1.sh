#!/usr/bin/env bash
# call 1 (session 17): the landed HEAD 9996741 (.snap) checked whole: GPU tests, goldens in both modes, the op's GPU
# tests; op_bench kimi-k2 (plain, --fp8, --accumulate, --fp8 --accumulate); the six-shape table bf16 and fp8; the tile
# clock after the aq change (.snapT: .snap + results -r tile_clock.patch, measurement only)
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap), $(cat .snapT/COMMIT) (.snapT)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
( cd $root/.snapT && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$rc > "$out/build.snapT.log" 2>&1 && cmake --build build -j4 --target mok-bench >> "$out/build.snapT.log" 2>&1; echo "build .snapT rc $?" >> "$out/summary.log" ) &
cd $root/.snap
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_TORCH=ON -DPython3_EXECUTABLE="$(command -v python3)" -Drapidcheck_DIR=$rc > "$out/build.log" 2>&1 && cmake --build build -j12 >> "$out/build.log" 2>&1
echo "build rc $?" | tee -a "$out/summary.log"
grep -E "C7510|spill|warning" "$out/build.log" | head -5 | tee -a "$out/summary.log"
log built
timeout 150 ctest --test-dir build -L gpu --output-on-failure --timeout 140 > "$out/gpu_tests.log" 2>&1
echo "ctest -L gpu rc $?: $(grep -E 'tests passed|tests failed' "$out/gpu_tests.log")" | tee -a "$out/summary.log"
grep -E "\*\*\*Failed|Timeout|Not Run" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
for m in off on; do
  echo "#### mok-verify golden/data --backend gpu --recompute $m" >> "$out/verify.log"
  timeout 100 build/verify/mok-verify golden/data --backend gpu --recompute $m >> "$out/verify.log" 2>&1
  echo "goldens recompute $m rc $?" | tee -a "$out/summary.log"
done
grep -cE "EQUAL" "$out/verify.log" | sed 's/^/EQUAL lines: /' | tee -a "$out/summary.log"
( cd python/tests && PYTHONPATH=$PWD/../../build/python MOK_GOLDEN_DIR=$PWD/../../golden/data timeout 150 python3 -m pytest -q test_cuda.py test_errors.py > "$out/pytest.log" 2>&1; echo "pytest rc $?: $(tail -1 "$out/pytest.log")" | tee -a "$out/summary.log" )
log "tests done"
( cd bench
for mode in "" "--fp8" "--accumulate" "--fp8 --accumulate"; do
  echo "#### bench/op_bench.py --shape kimi-k2 --runs 10 $mode" >> "$out/op_bench.log"
  PYTHONPATH=$PWD/../build/python PYTHONUNBUFFERED=1 timeout 90 python3 op_bench.py --shape kimi-k2 --runs 10 $mode >> "$out/op_bench.log" 2>&1; echo "op_bench kimi-k2 $mode rc $?" | tee -a "$out/summary.log"
done )
log "op_bench done"
timeout 170 build/megakernel/mok-bench --shape all --runs 10 > "$out/mok_bf16.log" 2>&1; echo "mok bf16 all rc $?" | tee -a "$out/summary.log"
timeout 170 build/megakernel/mok-bench --shape all --runs 10 --fp8 > "$out/mok_fp8.log" 2>&1; echo "mok fp8 all rc $?" | tee -a "$out/summary.log"
log "six shapes done"
wait
cd $root/.snapT
for args in "--shape kimi-k2" "--shape kimi-k2 --fp8" "--shape qwen3-30b-a3b --fp8"; do
  echo "#### mok-bench $args --runs 1 (tile clock)" >> "$out/tile_clock.log"
  timeout 45 build/megakernel/mok-bench $args --runs 1 >> "$out/tile_clock.log" 2>&1; echo "tile clock $args rc $?" | tee -a "$out/summary.log"
done
log done
