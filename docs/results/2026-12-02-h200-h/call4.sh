#!/usr/bin/env bash
# call 4 (session 13): main (the fp8 backward, the ring-cycle guard, the fake's test fixed): GPU tests, the op's GPU tests;
# mok-fp8-chain; fp8 forward+backward against bf16 on kimi-k2 and olmoe; memcheck on the fp8 backward's test
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
cd .snap
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_TORCH=ON -DPython3_EXECUTABLE="$(command -v python3)" -Drapidcheck_DIR=$rc > "$out/build.log" 2>&1 && cmake --build build -j16 >> "$out/build.log" 2>&1
echo "build rc $?: $(grep C75 "$out/build.log" | grep -vc tc_validate) C75xx outside tc_validate" | tee -a "$out/summary.log"
log built
timeout 60 build/megakernel/mok-fp8-chain 20000 > "$out/fp8_chain.log" 2>&1; echo "fp8-chain rc $?" | tee -a "$out/summary.log"
ctest --test-dir build -L gpu --output-on-failure --timeout 150 > "$out/gpu_tests.log" 2>&1
echo "ctest -L gpu rc $?: $(grep -E 'tests passed|tests failed' "$out/gpu_tests.log")" | tee -a "$out/summary.log"
grep -E "\*\*\*Failed|Timeout|Not Run" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
( cd python/tests && PYTHONPATH=$PWD/../../build/python MOK_GOLDEN_DIR=$PWD/../../golden/data timeout 150 python3 -m pytest -q test_cuda.py test_errors.py > "$out/pytest.log" 2>&1; echo "pytest rc $?: $(tail -1 "$out/pytest.log")" | tee -a "$out/summary.log" )
log "tests done"
for shape in kimi-k2 olmoe; do for mode in "--fp8" ""; do
  echo "#### mok-bench --shape $shape --runs 10 $mode" >> "$out/bench.log"
  timeout 60 build/megakernel/mok-bench --shape $shape --runs 10 $mode >> "$out/bench.log" 2>&1; echo "bench $shape $mode rc $?" | tee -a "$out/summary.log"
done; done
log "bench done"
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 1 build/megakernel/tests/mok_megakernel_tests \
  --gtest_filter='Gpu.Fp8BackwardMatchesReferenceBitForBit' > "$out/sanitize.log" 2>&1
echo "memcheck rc $?: $(grep 'ERROR SUMMARY' "$out/sanitize.log" | tail -1) $(grep -E 'PASSED|FAILED' "$out/sanitize.log" | tail -1)" | tee -a "$out/summary.log"
log done
