#!/usr/bin/env bash
# Call 1 (session 39): the working tree over ba39601 (block 0's layout scan by runs of chunks, a warp per
# run of 32 experts; the accumulated weight gradients' NaN modelled as the canonical NaN, core
# gradient_add.h) through the GPU tests and goldens, the op's tests, then memcheck, synccheck and
# racecheck over the reduce-add test and a forward + backward of the layer.
#   MOK_COMMIT=<hash> bash docs/results/2026-12-04-h200-i/call1/call1.sh
set -uo pipefail
source bench/device_call.sh
MOK_CALL_SECONDS=${MOK_CALL_SECONDS:-520} bash bench/h200_session.sh tests python
for tool in memcheck synccheck racecheck; do
  for test in "build/megakernel/tests/mok_tma_reduce_add_test" \
    "build/megakernel/tests/mok_megakernel_tests --gtest_filter=LayerApi.AccumulatesWeightGradientsAsTheReferenceAdds"; do
    timeout 90 compute-sanitizer --tool $tool --error-exitcode 1 $test >/tmp/sanitizer.log 2>&1
    echo "$tool $test exit $?: $(grep 'ERROR SUMMARY' /tmp/sanitizer.log | tail -1), $(grep -E 'PASSED|FAILED' /tmp/sanitizer.log | head -2 | tr '\n' ' ')" |
      tee -a "$out/summary.log"
  done
done
grep -q "build ok" "$out/summary.log" && rm -f "$out/build.log"
