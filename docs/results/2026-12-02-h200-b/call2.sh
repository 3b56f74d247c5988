#!/usr/bin/env bash
# call 2: 913d0c7 (.snap): GPU tests, goldens, the op's GPU tests, compute-sanitizer on the fp8 forward;
# and 913d0c7 with 3 pipeline stages instead of 4 (.snap3: the stage alone, what the epilogue-warp variant paid)
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: 913d0c7 (.snap); .snap3 = 913d0c7 with kStages = 3"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
rc=.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
( cd .snap && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_TORCH=ON -DPython3_EXECUTABLE="$(command -v python3)" -Drapidcheck_DIR=$PWD/$rc > "$out/build.log" 2>&1 && cmake --build build -j10 >> "$out/build.log" 2>&1; echo "build .snap rc $?" | tee -a "$out/summary.log" ) &
( cd .snap3 && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$PWD/$rc > "$out/build3.log" 2>&1 && cmake --build build -j6 --target mok-bench >> "$out/build3.log" 2>&1; echo "build .snap3 rc $?" | tee -a "$out/summary.log" ) &
wait
log built
cd "$root/.snap"
ctest --test-dir build -L gpu --output-on-failure --timeout 120 > "$out/gpu_tests.log" 2>&1
echo "ctest -L gpu rc $?: $(grep -E 'tests passed|tests failed' "$out/gpu_tests.log")" | tee -a "$out/summary.log"
grep -E "\*\*\*Failed|Timeout|Not Run" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
timeout 150 build/verify/mok-verify golden/data --backend gpu > "$out/verify.log" 2>&1
echo "verify rc $?: $(grep -cE '^EQUAL' "$out/verify.log") EQUAL, $(grep -cE '^(MISMATCH|ERROR)' "$out/verify.log") MISMATCH/ERROR" | tee -a "$out/summary.log"
( cd python/tests && PYTHONPATH=$PWD/../../build/python MOK_GOLDEN_DIR=$PWD/../../golden/data timeout 200 python3 -m pytest -q test_cuda.py test_errors.py > "$out/pytest.log" 2>&1; echo "pytest rc $?: $(tail -1 "$out/pytest.log")" | tee -a "$out/summary.log" )
log "tests done"
for shape in kimi-k2 olmoe; do for mode in "" "--fp8"; do for t in .snap .snap3; do
  echo "#### $t mok-bench --shape $shape --runs 10 $mode" >> "$out/bench.log"
  timeout 100 "$root/$t/build/megakernel/mok-bench" --shape $shape --runs 10 $mode >> "$out/bench.log" 2>&1
  echo "bench $t $shape $mode rc $?" >> "$out/summary.log"
done; done; done
for tool in initcheck memcheck racecheck synccheck; do
  timeout 75 compute-sanitizer --tool $tool --error-exitcode 1 build/megakernel/tests/mok_megakernel_tests \
    --gtest_filter='Gpu.Fp8ForwardMatchesReferenceBitForBit' > "$out/san.tmp" 2>&1
  echo "$tool rc $?: $(grep 'ERROR SUMMARY' "$out/san.tmp" | tail -1) $(grep -E 'PASSED|FAILED' "$out/san.tmp" | tail -1)" | tee -a "$out/summary.log"
  { echo "== $tool"; head -c 100000 "$out/san.tmp"; } >> "$out/sanitize.log"; rm -f "$out/san.tmp"
done
log "sanitizers done"
log done
