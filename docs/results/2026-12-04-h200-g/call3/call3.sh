#!/usr/bin/env bash
# Call 3 (session 37): call 2's tree with the fp32 gradient maps encoded for accumulation too (call 2's
# accumulating runs met empty maps: an illegal instruction) against d9fb982 (.snapB). Steps: the GPU
# tests and goldens; memcheck and synccheck over the tests that accumulate and over TmaReduceAdd;
# racecheck on racecheck_named_barriers.cu (does the tool count one warpgroup's named barrier as a step
# of the block's?); the A/B with mok-bench --accumulate (kimi-k2, olmoe, B N B N).
#   MOK_COMMIT=<hash> bash docs/results/2026-12-04-h200-g/call3/call3.sh   (carry .deps .snapB)
set -uo pipefail
source bench/device_call.sh
here=docs/results/2026-12-04-h200-g/call3
nvcc -O2 -gencode=arch=compute_90a,code=sm_90a "$here/racecheck_named_barriers.cu" -o /tmp/racecheck_named_barriers
MOK_BASELINE=.snapB MOK_SHAPES="kimi-k2 olmoe" MOK_BENCH_ARGS="--accumulate" MOK_CALL_SECONDS=430 \
  bash bench/h200_session.sh tests ab
grep -q "build ok" "$out/summary.log" && rm -f "$out/build.log"
grep -q "baseline build ok" "$out/summary.log" && rm -f "$out/build_baseline.log"
tests=build/megakernel/tests
filter=Gpu.MatchesReferenceBitForBit:LayerApi.AccumulatesWeightGradientsAsTheReferenceAdds:LayerApi.ColocatedInterleavedMicroBatchesMatchTheReference:Gpu.Fp8BackwardMatchesReferenceBitForBit
for tool in memcheck synccheck; do
  for run in "$tests/mok_megakernel_tests --gtest_filter=$filter" "$tests/mok_tma_reduce_add_test"; do
    timeout 120 compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 1 $run >"$out/sanitize.tmp" 2>&1
    echo "$tool ${run%% *} exit $?: $(grep 'ERROR SUMMARY' "$out/sanitize.tmp" | tail -1)" | tee -a "$out/summary.log"
    { echo "== compute-sanitizer $tool $run"; head -c 100000 "$out/sanitize.tmp"; } >>"$out/sanitize.log"
  done
done
rm -f "$out/sanitize.tmp"
for named in 0 1 2 17; do
  timeout 60 compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 4 /tmp/racecheck_named_barriers \
    "$named" >"$out/racecheck.tmp" 2>&1
  echo "racecheck, $named named barriers first: $(grep -h 'RACECHECK SUMMARY' "$out/racecheck.tmp" | tail -1)" | tee -a "$out/summary.log"
  { echo "== named barriers $named"; head -c 20000 "$out/racecheck.tmp"; } >>"$out/racecheck.log"
done
rm -f "$out/racecheck.tmp"
log done
