#!/usr/bin/env bash
# call 2 (session 15): batched sigmoids (SwiGLU epilogue, SwiGLU backward) and the batched accumulate_into
# epilogue (.snap, working tree over 15790c4) against 15790c4 (.snap0): GPU tests, goldens in both modes, the op's
# GPU tests, mok-scalar-check on every input; A/B mok-bench kimi-k2 and qwen3-30b-a3b, bf16 and fp8, alternating;
# the op's step with accumulate_into on kimi-k2
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap), $(cat .snap0/COMMIT) (.snap0)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
cd $root/.snap
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_TORCH=ON -DPython3_EXECUTABLE="$(command -v python3)" -Drapidcheck_DIR=$rc > "$out/build.log" 2>&1 && cmake --build build -j16 >> "$out/build.log" 2>&1
echo "build rc $?" | tee -a "$out/summary.log"
grep -E "spill|warning" "$out/build.log" | head -5
log built
( cd $root/.snap0 && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$rc > "$out/build0.log" 2>&1 && cmake --build build -j6 --target mok-bench >> "$out/build0.log" 2>&1; echo "base build rc $?" >> "$out/summary.log" ) &
bpid=$!
( timeout 240 build/megakernel/mok-scalar-check 1 > "$out/scalar_check.log" 2>&1; echo "scalar-check (every input) rc $?: $(tail -1 "$out/scalar_check.log")" >> "$out/summary.log" ) &
spid=$!
timeout 150 ctest --test-dir build -L gpu --output-on-failure --timeout 140 -E scalar_functions > "$out/gpu_tests.log" 2>&1
echo "ctest -L gpu rc $?: $(grep -E 'tests passed|tests failed' "$out/gpu_tests.log")" | tee -a "$out/summary.log"
grep -E "\*\*\*Failed|Timeout|Not Run" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
for m in off on; do
  echo "#### mok-verify golden/data --backend gpu --recompute $m" >> "$out/verify.log"
  timeout 100 build/verify/mok-verify golden/data --backend gpu --recompute $m >> "$out/verify.log" 2>&1
  echo "goldens recompute $m rc $?" | tee -a "$out/summary.log"
done
( cd python/tests && PYTHONPATH=$PWD/../../build/python MOK_GOLDEN_DIR=$PWD/../../golden/data timeout 150 python3 -m pytest -q test_cuda.py test_errors.py > "$out/pytest.log" 2>&1; echo "pytest rc $?: $(tail -1 "$out/pytest.log")" | tee -a "$out/summary.log" )
log "tests done"
wait $spid $bpid
log "scalar check and base build done"
for shape in kimi-k2 qwen3-30b-a3b; do
  for mode in "" "--fp8"; do
    for tree in .snap0 .snap .snap0 .snap; do
      echo "#### $tree mok-bench --shape $shape --runs 10 $mode" >> "$out/bench.log"
      ( cd $root/$tree && timeout 60 build/megakernel/mok-bench --shape $shape --runs 10 $mode >> "$out/bench.log" 2>&1; echo "bench $tree $shape $mode rc $?" >> "$out/summary.log" )
    done
  done
done
log "bench done"
cd $root/.snap/bench
for mode in "--accumulate" "--fp8 --accumulate"; do
  echo "#### bench/op_bench.py --shape kimi-k2 --runs 10 $mode" >> "$out/op_bench.log"
  PYTHONPATH=$PWD/../build/python PYTHONUNBUFFERED=1 timeout 90 python3 op_bench.py --shape kimi-k2 --runs 10 $mode >> "$out/op_bench.log" 2>&1; echo "op_bench kimi-k2 $mode rc $?" | tee -a "$out/summary.log"
done
log done
