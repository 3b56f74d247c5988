#!/usr/bin/env bash
# Call 1 (session 37): d9fb982 with accumulated_prefetch.patch (results/2026-12-04-h200-f) as this tree,
# .snapB = d9fb982. Steps: the TMA reduce-add probe (tma_reduce_probe.cu: is it the IEEE add?), the GPU
# tests and goldens, the A/B of the prefetch with mok-bench --accumulate, then racecheck on
# Gpu.MatchesReferenceBitForBit in three builds: this tree at detect level info, .snapR1 (chain_gemm's and
# combine_dx's barriers as barrier.sync, the form that allows threads to arrive from different
# instructions) and .snapR2 (combine_dx's router tiles StaticTiles, not claimed).
#   MOK_COMMIT=<hash> bash docs/results/2026-12-04-h200-g/call1/call1.sh   (carry .deps .snapB .snapR1 .snapR2)
set -uo pipefail
source bench/device_call.sh
here=docs/results/2026-12-04-h200-g/call1
for tree in .snapR1 .snapR2; do
  build_tree "$tree" 3 --target mok_megakernel_tests >"$out/build_${tree#.snap}.log" 2>&1 &
done
nvcc -O2 -std=c++20 -gencode=arch=compute_90a,code=sm_90a "$here/tma_reduce_probe.cu" -lcuda -o /tmp/tma_reduce_probe &&
  /tmp/tma_reduce_probe >"$out/probe.log" 2>&1
echo "probe exit $?" >>"$out/probe.log"
MOK_BASELINE=.snapB MOK_SHAPES="kimi-k2 olmoe" MOK_BENCH_ARGS="--accumulate" MOK_CALL_SECONDS=420 \
  bash bench/h200_session.sh tests ab
cat "$out/probe.log" >>"$out/summary.log"
wait
racecheck() {  # $1 label, $2 tree, further arguments to compute-sanitizer
  local name=$1 tree=$2
  shift 2
  timeout 90 compute-sanitizer --tool racecheck --report-api-errors no --error-exitcode 1 "$@" \
    "$tree/build/megakernel/tests/mok_megakernel_tests" --gtest_filter=Gpu.MatchesReferenceBitForBit \
    >"$out/racecheck_$name.log" 2>&1
  echo "racecheck $name exit $?: $(grep -h 'RACECHECK SUMMARY' "$out/racecheck_$name.log" | tail -1)" | tee -a "$out/summary.log"
}
racecheck this_info . --racecheck-detect-level info
racecheck barrier_sync .snapR1
racecheck static_tiles .snapR2
log done
