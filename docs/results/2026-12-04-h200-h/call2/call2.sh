#!/usr/bin/env bash
# Call 2 (session 38): 45b4b44 (bf16 weight gradients added into the caller's by the TMA's reduce-add)
# through the GPU tests and goldens, the op's tests (autograd's bits with accumulate_into bf16), the op's
# A/B against c0cde97 (the staged load-add-store) with --accumulate bf16 on kimi-k2 and olmoe, then
# memcheck over TmaReduceAdd and the layer tests that add bf16 gradients.
#   MOK_COMMIT=<hash> bash docs/results/2026-12-04-h200-h/call2/call2.sh
set -uo pipefail
source bench/device_call.sh
MOK_CALL_SECONDS=${MOK_CALL_SECONDS:-515} MOK_BASELINE=.snapB MOK_AB_TOOL=op MOK_OP_ARGS="--accumulate bf16" \
  MOK_SHAPES="kimi-k2 olmoe" bash bench/h200_session.sh tests python ab
for test in "build/megakernel/tests/mok_tma_reduce_add_test" \
  "build/megakernel/tests/mok_megakernel_tests --gtest_filter=LayerApi.Bf16*"; do
  timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 $test >/tmp/memcheck.log 2>&1
  echo "memcheck $test exit $?: $(grep 'ERROR SUMMARY' /tmp/memcheck.log | tail -1), $(grep -E 'PASSED|FAILED' /tmp/memcheck.log | head -2 | tr '\n' ' ')" |
    tee -a "$out/summary.log"
done
grep -q "baseline build ok" "$out/summary.log" && rm -f "$out/build_baseline.log"
grep -q "build ok" "$out/summary.log" && rm -f "$out/build.log"
