#!/usr/bin/env bash
# Call 2 (session 37): the accumulated fp32 weight gradients added by the TMA's reduce-add (this tree)
# against d9fb982 (.snapB, their load-add-store from the accumulator layout). Steps: the GPU tests (the
# new TmaReduceAdd test among them) and goldens; the A/B with mok-bench --accumulate (kimi-k2, olmoe,
# B N B N); memcheck and synccheck over the tests that accumulate and over TmaReduceAdd; one pair of
# runs without --accumulate (kimi-k2 bf16 and fp8: the stores' path, whose code ptxas allocated anew),
# and this tree's fp8 weight gradients (--fp8 --fp8-weight-gradients) beside it; racecheck's hazard
# report (threads, blocks, addresses) on Gpu.MatchesReferenceBitForBit.
#   MOK_COMMIT=<hash> bash docs/results/2026-12-04-h200-g/call2/call2.sh   (carry .deps .snapB)
set -uo pipefail
MOK_BASELINE=.snapB MOK_SHAPES="kimi-k2 olmoe" MOK_BENCH_ARGS="--accumulate" MOK_CALL_SECONDS=400 \
  bash bench/h200_session.sh tests ab
source bench/device_call.sh
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
bench() {  # $1 label, $2 tree, further arguments to mok-bench
  local label=$1 tree=$2
  shift 2
  timeout 150 "$tree/build/megakernel/mok-bench" --shape kimi-k2 "$@" >"$out/run.tmp" 2>&1
  echo "$label exit $?: $(awk '$1 == "kimi-k2"' "$out/run.tmp" | tail -1)" | tee -a "$out/summary.log"
  { echo "#### $label: $tree mok-bench --shape kimi-k2 $*"; cat "$out/run.tmp"; } >>"$out/ab.log"
}
bench "stores B bf16" .snapB
bench "stores N bf16" .
bench "stores B fp8" .snapB --fp8
bench "stores N fp8" . --fp8
bench "fp8 weight gradients N" . --fp8 --fp8-weight-gradients
rm -f "$out/run.tmp"
timeout 120 compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 30 --report-api-errors no \
  "$tests/mok_megakernel_tests" --gtest_filter=Gpu.MatchesReferenceBitForBit >"$out/racecheck.tmp" 2>&1
echo "racecheck (hazard report) exit $?: $(grep -h 'RACECHECK SUMMARY' "$out/racecheck.tmp" | tail -1)" | tee -a "$out/summary.log"
head -c 300000 "$out/racecheck.tmp" >"$out/racecheck.log" && rm "$out/racecheck.tmp"
log done
