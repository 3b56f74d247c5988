#!/usr/bin/env bash
# Call 4: compute-sanitizer racecheck on Gpu.MatchesReferenceBitForBit in this tree (d38941c with the
# fp32 weight gradients' TMA stores) and in the baseline .snapB (d38941c): call 3's racecheck reported
# hazards in combine_dx's router chain, code the change does not touch; did they come before it?
#   MOK_COMMIT=<hash> bash docs/results/2026-12-04-h200-f/call4/call4.sh   (.deps and .snapB carried)
set -uo pipefail
source bench/device_call.sh
call_header "racecheck, this tree and .snapB ($(cat .snapB/COMMIT))"
build_tree . 8 --target mok_megakernel_tests >"$out/build.log" 2>&1 &
build_tree .snapB 8 --target mok_megakernel_tests >"$out/build_baseline.log" 2>&1 &
wait
log "builds done"
for tree in .snapB .; do
  name=$([ "$tree" = . ] && echo this || echo baseline)
  timeout 200 compute-sanitizer --tool racecheck --report-api-errors no --error-exitcode 1 \
    "$tree/build/megakernel/tests/mok_megakernel_tests" --gtest_filter=Gpu.MatchesReferenceBitForBit \
    >"$out/racecheck_$name.log" 2>&1
  echo "$name racecheck exit $?: $(grep -h 'RACECHECK SUMMARY' "$out/racecheck_$name.log" | tail -1)" | tee -a "$out/summary.log"
done
log done
