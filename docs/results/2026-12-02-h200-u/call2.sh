#!/usr/bin/env bash
# call 2 (session 18): the working tree over c7fdae2 (.snap: accumulate_into takes bf16 accumulators, added as
# autograd adds): GPU tests (LayerApi.Bf16WeightGradientsAreTheFp32OnesRoundedOrAddedAsAutogradAdds), goldens in both
# modes, the op's GPU tests (test_bf16_accumulate_into_on_gpu_gives_autograds_grad_bits); op_bench on all six shapes
# with --accumulate bf16, then plain with Zipf routing; mok-bench --fp8 on all six shapes with --sustained 2
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
cd $root/.snap
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_TORCH=ON -DPython3_EXECUTABLE="$(command -v python3)" -Drapidcheck_DIR=$rc > /tmp/build.log 2>&1 && cmake --build build -j14 >> /tmp/build.log 2>&1
echo "build rc $?" | tee -a "$out/summary.log"
grep -E "warning|error" /tmp/build.log | grep -v "nccl_device\|stl_algobase\|Warray-bounds" | head -5 | tee -a "$out/summary.log"
log built
timeout 150 ctest --test-dir build -L gpu --output-on-failure --timeout 140 > "$out/gpu_tests.log" 2>&1
echo "ctest -L gpu rc $?: $(grep -E 'tests passed|tests failed' "$out/gpu_tests.log")" | tee -a "$out/summary.log"
grep -E "\*\*\*Failed|Timeout|Not Run" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
build/megakernel/tests/mok_megakernel_tests --gtest_filter='*Bf16WeightGradients*' 2>&1 | tail -3 | tee -a "$out/summary.log"
for m in off on; do
  echo "#### mok-verify golden/data --backend gpu --recompute $m" >> "$out/verify.log"
  timeout 100 build/verify/mok-verify golden/data --backend gpu --recompute $m >> "$out/verify.log" 2>&1
  echo "goldens recompute $m rc $?: $(grep -cE '^EQUAL' "$out/verify.log") EQUAL so far, $(grep -cE '^(MISMATCH|ERROR)' "$out/verify.log") MISMATCH/ERROR" | tee -a "$out/summary.log"
done
( cd python/tests && PYTHONPATH=$PWD/../../build/python MOK_GOLDEN_DIR=$PWD/../../golden/data timeout 150 python3 -m pytest -q -rs test_cuda.py test_errors.py > "$out/pytest.log" 2>&1; echo "pytest rc $?: $(tail -1 "$out/pytest.log")" | tee -a "$out/summary.log" )
grep -E "bf16_accumulate" "$out/pytest.log" | head -3 | tee -a "$out/summary.log"
log "tests done"
export PYTHONPATH=$PWD/build/python PYTHONUNBUFFERED=1
timeout 100 python3 bench/op_bench.py --shape all --runs 10 --accumulate bf16 > "$out/op_bench.log" 2>&1; echo "op_bench all --accumulate bf16 rc $?" | tee -a "$out/summary.log"
timeout 100 python3 bench/op_bench.py --shape all --runs 10 --routing zipf >> "$out/op_bench.log" 2>&1; echo "op_bench all --routing zipf rc $? (appended)" | tee -a "$out/summary.log"
log "op_bench done"
timeout 170 build/megakernel/mok-bench --shape all --runs 10 --sustained 2 --fp8 > "$out/mok_sustained_fp8.log" 2>&1; echo "mok-bench all --fp8 --sustained 2 rc $?" | tee -a "$out/summary.log"
log done
