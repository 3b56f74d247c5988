#!/usr/bin/env bash
# call 4: main (.snap: the fp8 forward's epilogue warps, the backward workspace by lifetime) against 4edbe61 (.snap0):
# GPU tests, goldens, the op's GPU tests on .snap; FP8 forward and bf16 forward+backward side by side; the op's peak memory
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap) vs 4edbe61 (.snap0)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
rc=.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
( cd .snap && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_TORCH=ON -DPython3_EXECUTABLE="$(command -v python3)" -Drapidcheck_DIR=$PWD/$rc > "$out/build.log" 2>&1 && cmake --build build -j12 >> "$out/build.log" 2>&1; echo "build .snap rc $?: $(grep -c C7510 "$out/build.log") C7510" | tee -a "$out/summary.log" ) &
( cd .snap0 && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$PWD/$rc > "$out/build0.log" 2>&1 && cmake --build build -j4 --target mok-bench >> "$out/build0.log" 2>&1; echo "build .snap0 rc $?" | tee -a "$out/summary.log" ) &
wait
log built
cd "$root/.snap"
ctest --test-dir build -L gpu --output-on-failure --timeout 120 > "$out/gpu_tests.log" 2>&1
echo "ctest -L gpu rc $?: $(grep -E 'tests passed|tests failed' "$out/gpu_tests.log")" | tee -a "$out/summary.log"
grep -E "\*\*\*Failed|Timeout|Not Run" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
timeout 120 build/verify/mok-verify golden/data --backend gpu > "$out/verify.log" 2>&1
echo "verify rc $?: $(grep -cE '^EQUAL' "$out/verify.log") EQUAL, $(grep -cE '^(MISMATCH|ERROR)' "$out/verify.log") MISMATCH/ERROR" | tee -a "$out/summary.log"
( cd python/tests && PYTHONPATH=$PWD/../../build/python MOK_GOLDEN_DIR=$PWD/../../golden/data timeout 150 python3 -m pytest -q test_cuda.py test_errors.py > "$out/pytest.log" 2>&1; echo "pytest rc $?: $(tail -1 "$out/pytest.log")" | tee -a "$out/summary.log" )
log "tests done"
for t in .snap0 .snap; do
  echo "#### $t mok-bench --shape all --runs 10 --fp8" >> "$out/bench.log"
  timeout 100 "$root/$t/build/megakernel/mok-bench" --shape all --runs 10 --fp8 >> "$out/bench.log" 2>&1; echo "bench fp8 $t rc $?" | tee -a "$out/summary.log"
done
for shape in kimi-k2 olmoe; do for t in .snap0 .snap; do
  echo "#### $t mok-bench --shape $shape --runs 10" >> "$out/bench.log"
  timeout 60 "$root/$t/build/megakernel/mok-bench" --shape $shape --runs 10 >> "$out/bench.log" 2>&1; echo "bench bf16 $shape $t rc $?" | tee -a "$out/summary.log"
done; done
log "bench done"
( cd "$root/.snap" && PYTHONPATH=$PWD/build/python timeout 90 python3 bench/op_bench.py --shape kimi-k2 --runs 5 > "$out/op_bench.log" 2>&1; echo "op_bench kimi-k2 rc $?" | tee -a "$out/summary.log" )
log done
