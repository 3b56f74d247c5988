#!/usr/bin/env bash
# Call 3 (session 39): the landing tree (the layout scan's warps, the canonical NaN, encode_maps from the
# GradOutputs, the chunk buffers as bytes, two GPU cases with E 72 and 400) through the GPU tests and
# goldens and the op's tests; then mok-bench on olmoe in fp8 and qwen3-30b-a3b in bf16 (the scan's phase),
# and racecheck over the bit-for-bit cases (the scan's shared memory with E 72 and 400).
#   MOK_COMMIT=<hash> bash docs/results/2026-12-04-h200-i/call3/call3.sh
set -uo pipefail
source bench/device_call.sh
MOK_CALL_SECONDS=${MOK_CALL_SECONDS:-430} bash bench/h200_session.sh tests python
log "mok-bench, this tree"
for args in "--shape olmoe --fp8" "--shape qwen3-30b-a3b"; do
  timeout 60 build/megakernel/mok-bench $args >>"$out/bench.log" 2>&1
  echo "mok-bench $args exit $?" | tee -a "$out/summary.log"
done
grep -E "^[a-z0-9.-]+ +uniform|forward phases" "$out/bench.log" >>"$out/summary.log"
timeout 100 compute-sanitizer --tool racecheck --error-exitcode 1 build/megakernel/tests/mok_megakernel_tests \
  --gtest_filter=Gpu.MatchesReferenceBitForBit >/tmp/racecheck.log 2>&1
echo "racecheck Gpu.MatchesReferenceBitForBit exit $?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' /tmp/racecheck.log | tail -1), $(grep -E 'PASSED|FAILED' /tmp/racecheck.log | head -2 | tr '\n' ' ')" |
  tee -a "$out/summary.log"
grep -q "build ok" "$out/summary.log" && rm -f "$out/build.log"
