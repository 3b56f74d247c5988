#!/usr/bin/env bash
# call 2 (session 14): main with the op's backward given the forward's fp8_weights: the op's GPU tests; the op beside
# torch's layer, bf16 and fp8, on kimi-k2 and olmoe; synccheck on the fp8 tests; ncu source counters of the fp8 forward
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
( cd python/tests && PYTHONPATH=$PWD/../../build/python MOK_GOLDEN_DIR=$PWD/../../golden/data timeout 150 python3 -m pytest -q test_cuda.py test_errors.py > "$out/pytest.log" 2>&1; echo "pytest rc $?: $(tail -1 "$out/pytest.log")" | tee -a "$out/summary.log" )
grep -E "FAILED|Error" "$out/pytest.log" | head -10 | tee -a "$out/summary.log"
log "pytest done"
for shape in kimi-k2 olmoe; do for mode in "" "--fp8"; do
  echo "#### bench/op_bench.py --shape $shape --runs 10 $mode" >> "$out/op_bench.log"
  ( cd bench && PYTHONPATH=$PWD/../build/python PYTHONUNBUFFERED=1 timeout 120 python3 op_bench.py --shape $shape --runs 10 $mode >> "$out/op_bench.log" 2>&1; echo "op_bench $shape $mode rc $?" | tee -a "$out/summary.log" )
done; done
log "op_bench done"
timeout 150 compute-sanitizer --tool synccheck --error-exitcode 1 build/megakernel/tests/mok_megakernel_tests \
  --gtest_filter='Gpu.Fp8ForwardMatchesReferenceBitForBit:Gpu.Fp8BackwardMatchesReferenceBitForBit' > "$out/sanitize.log" 2>&1
echo "synccheck rc $?: $(grep 'ERROR SUMMARY' "$out/sanitize.log" | tail -1) $(grep -E 'PASSED|FAILED' "$out/sanitize.log" | tail -1)" | tee -a "$out/summary.log"
log "synccheck done"
timeout 200 ncu --clock-control none --kernel-name regex:forward_fp8_kernel --launch-skip 2 --launch-count 1 \
  --section SourceCounters --section WarpStateStats --section SpeedOfLight -f -o /tmp/fwd_fp8 \
  build/megakernel/mok-bench --shape kimi-k2 --runs 1 --fp8 > "$out/ncu.log" 2>&1; echo "ncu rc $?" | tee -a "$out/summary.log"
ncu --import /tmp/fwd_fp8.ncu-rep --page details --csv > "$out/ncu_details.csv" 2>> "$out/ncu.log"
ncu --import /tmp/fwd_fp8.ncu-rep --page source --csv --print-source sass 2>> "$out/ncu.log" | gzip > "$out/ncu_source_sass.csv.gz"
ls -la /tmp/fwd_fp8.ncu-rep "$out" | tee -a "$out/summary.log"
log done
