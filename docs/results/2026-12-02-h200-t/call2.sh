#!/usr/bin/env bash
# call 2 (session 17): the fp8 chain's consumers taking turns on the tensor core (.snap: 9996741 + TensorTurns,
# the turn handed over once a group has completed) against 9996741 (.snap0) and the experiment of handing it over
# at issue (.snapA): GPU tests, goldens in both modes, the op's GPU tests (.snap); mok-bench kimi-k2 and
# qwen3-30b-a3b fp8 on all three; the tile clock of .snap (.snapT); the op's kernels against mok-bench's with the
# SM clock logged (op_bench --kernel-times, normal and uniform values)
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap), $(cat .snap0/COMMIT) (.snap0), $(cat .snapA/COMMIT) (.snapA), $(cat .snapT/COMMIT) (.snapT)"
  echo "date: $(date -u +%FT%TZ)"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
for t in .snap0 .snapA .snapT; do
  ( cd $root/$t && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$rc > /tmp/build$t.log 2>&1 && cmake --build build -j2 --target mok-bench >> /tmp/build$t.log 2>&1; echo "build $t rc $?" >> "$out/summary.log" ) &
done
cd $root/.snap
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_TORCH=ON -DPython3_EXECUTABLE="$(command -v python3)" -Drapidcheck_DIR=$rc > /tmp/build.log 2>&1 && cmake --build build -j10 >> /tmp/build.log 2>&1
echo "build rc $?" | tee -a "$out/summary.log"
grep -E "C7510|spill|error" /tmp/build.log | head -5 | tee -a "$out/summary.log"
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
wait
log "builds done"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 100 > "$out/clocks.csv" 2>&1 &
smi=$!
for shape in kimi-k2 qwen3-30b-a3b; do
  for tree in .snap0 .snap .snapA; do
    echo "#### $tree mok-bench --shape $shape --runs 10 --fp8" >> "$out/bench.log"
    ( cd $root/$tree && timeout 60 build/megakernel/mok-bench --shape $shape --runs 10 --fp8 >> "$out/bench.log" 2>&1; echo "bench $tree $shape fp8 rc $?" >> "$out/summary.log" )
  done
done
log "bench done"
( cd $root/.snapT && echo "#### .snapT mok-bench --shape kimi-k2 --fp8 --runs 1 (tile clock)" > "$out/tile_clock.log" && timeout 45 build/megakernel/mok-bench --shape kimi-k2 --fp8 --runs 1 >> "$out/tile_clock.log" 2>&1; echo "tile clock rc $?" | tee -a "$out/summary.log" )
log "op kernels: mok-bench kimi-k2 bf16, then op_bench --kernel-times normal, uniform"
echo "#### $(date -u +%T) .snap mok-bench --shape kimi-k2 --runs 10 (bf16)" >> "$out/op_kernels.log"
timeout 60 build/megakernel/mok-bench --shape kimi-k2 --runs 10 >> "$out/op_kernels.log" 2>&1
for v in normal uniform; do
  echo "#### $(date -u +%T) bench/op_bench.py --kernel-times --shape kimi-k2 --values $v" >> "$out/op_kernels.log"
  ( cd bench && PYTHONPATH=$PWD/../build/python PYTHONUNBUFFERED=1 timeout 90 python3 op_bench.py --kernel-times --shape kimi-k2 --runs 10 --values $v >> "$out/op_kernels.log" 2>&1; echo "op_bench --kernel-times $v rc $?" | tee -a "$out/summary.log" )
done
echo "#### $(date -u +%T) end" >> "$out/op_kernels.log"
kill $smi
log done
