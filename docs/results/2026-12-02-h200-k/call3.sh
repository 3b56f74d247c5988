#!/usr/bin/env bash
# call 3 (session 14): main with the fp8 backward's sections over the forward's E4M3 activations (weights given, no
# recompute): GPU tests, the op's GPU tests; the op's fp8 memory on kimi-k2; the op's device kernels per step (bf16
# kimi-k2: where the op's forward+backward spends its time beside the kernels)
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
cd .snap
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_TORCH=ON -DPython3_EXECUTABLE="$(command -v python3)" -Drapidcheck_DIR=$rc > "$out/build.log" 2>&1 && cmake --build build -j16 >> "$out/build.log" 2>&1
echo "build rc $?" | tee -a "$out/summary.log"
log built
ctest --test-dir build -L gpu --output-on-failure --timeout 150 > "$out/gpu_tests.log" 2>&1
echo "ctest -L gpu rc $?: $(grep -E 'tests passed|tests failed' "$out/gpu_tests.log")" | tee -a "$out/summary.log"
grep -E "\*\*\*Failed|Timeout|Not Run" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
build/megakernel/tests/mok_megakernel_tests --gtest_filter='LayerApi.Fp8BackwardSections*:LayerMemory.*' > "$out/sections.log" 2>&1
echo "sections rc $?: $(grep -E 'PASSED|FAILED' "$out/sections.log" | head -3 | tr '\n' ' ')" | tee -a "$out/summary.log"
( cd python/tests && PYTHONPATH=$PWD/../../build/python MOK_GOLDEN_DIR=$PWD/../../golden/data timeout 150 python3 -m pytest -q test_cuda.py test_errors.py > "$out/pytest.log" 2>&1; echo "pytest rc $?: $(tail -1 "$out/pytest.log")" | tee -a "$out/summary.log" )
log "tests done"
cd bench
for mode in "--fp8" ""; do
  echo "#### bench/op_bench.py --shape kimi-k2 --runs 10 $mode" >> "$out/op_bench.log"
  PYTHONPATH=$PWD/../build/python PYTHONUNBUFFERED=1 timeout 120 python3 op_bench.py --shape kimi-k2 --runs 10 $mode >> "$out/op_bench.log" 2>&1; echo "op_bench kimi-k2 $mode rc $?" | tee -a "$out/summary.log"
done
echo "#### bench/op_bench.py --shape kimi-k2 --kernel-times --runs 10" >> "$out/op_bench.log"
PYTHONPATH=$PWD/../build/python PYTHONUNBUFFERED=1 timeout 120 python3 op_bench.py --shape kimi-k2 --kernel-times --runs 10 >> "$out/op_bench.log" 2>&1; echo "op kernel times rc $?" | tee -a "$out/summary.log"
log done
