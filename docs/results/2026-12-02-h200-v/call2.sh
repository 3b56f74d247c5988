#!/usr/bin/env bash
# call 2 (session 19): .snap = fe07731 (call 1's tree, committed). op_bench on all six shapes with uniform and with
# Zipf routing, one call (issue 18's Zipf target had been measured across calls only), and with the bf16
# accumulate_into (the staged read-modify-write of call 1); then compute-sanitizer memcheck, synccheck, racecheck and
# initcheck on the GPU tests that run the staged bf16 weight-gradient epilogues and each precision's kernels.
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
cd $root/.snap
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_TORCH=ON -DPython3_EXECUTABLE="$(command -v python3)" -Drapidcheck_DIR=$rc > /tmp/build.log 2>&1 && cmake --build build -j16 --target mok_torch mok_megakernel_tests >> /tmp/build.log 2>&1
echo "build rc $?" | tee -a "$out/summary.log"
log built
export PYTHONPATH=$PWD/build/python PYTHONUNBUFFERED=1
for mode in "--routing uniform" "--routing zipf" "--accumulate bf16"; do
  echo "#### op_bench.py --shape all --runs 10 $mode" >> "$out/op_bench.log"
  timeout 100 python3 bench/op_bench.py --shape all --runs 10 $mode >> "$out/op_bench.log" 2>&1; echo "op_bench all $mode rc $?" | tee -a "$out/summary.log"
done
log "op_bench done"
filter="LayerApi.Bf16WeightGradientsAreTheFp32OnesRoundedOrAddedAsAutogradAdds:LayerApi.EveryRoutingModeMatchesTheReference:Gpu.Fp8ForwardMatchesReferenceBitForBit:Gpu.MatchesReference*"
for tool in memcheck synccheck racecheck initcheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 1 build/megakernel/tests/mok_megakernel_tests --gtest_filter="$filter" > /tmp/san.log 2>&1
  echo "$tool rc $?: $(grep 'ERROR SUMMARY' /tmp/san.log | tail -1) $(grep -E '^\[  (PASSED|FAILED)' /tmp/san.log | tr '\n' ' ')" | tee -a "$out/summary.log"
  { echo "== compute-sanitizer --tool $tool --gtest_filter=$filter"; head -c 60000 /tmp/san.log; } >> "$out/sanitize.log"
done
log done
