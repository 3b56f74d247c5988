#!/usr/bin/env bash
# Call 2 (session 22): the fp8 weight gradients with their scales carried by the stage (ColumnScales)
# and the operands' loads one column block ahead: their tests, the fp8 backward with the option on and
# off alternating (kimi-k2, olmoe), memcheck and synccheck over the new test.
set -uo pipefail
out=${OUT:-/tmp/mok-out}
MOK_COMMIT=${MOK_COMMIT:-unknown} bash bench/h200_session.sh || exit 1
build/megakernel/tests/mok_megakernel_tests --gtest_filter='Gpu.Fp8*:LayerApi.Fp8*' > "$out/tests.log" 2>&1
echo "tests rc $?" | tee -a "$out/summary.log"
grep -E "^\[  (PASSED|FAILED) " "$out/tests.log" | tee -a "$out/summary.log"
for shape in kimi-k2 olmoe; do
  for i in 1 2; do
    for flag in "" --fp8-weight-gradients; do
      echo "== $shape --fp8 $flag"
      build/megakernel/mok-bench --shape "$shape" --fp8 $flag --runs 10
    done
  done
done > "$out/fp8_grads.log" 2>&1
grep -E "^==|uniform  |weight gradients" "$out/fp8_grads.log" | sed 's/.*router backward[^;]*;//' | tee -a "$out/summary.log"
for tool in memcheck synccheck; do
  timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 1 build/megakernel/tests/mok_megakernel_tests \
    --gtest_filter='Gpu.Fp8WeightGradientsMatchTheReference' > "$out/sanitize_$tool.log" 2>&1
  echo "$tool exit $?: $(grep 'ERROR SUMMARY' "$out/sanitize_$tool.log" | tail -1)" | tee -a "$out/summary.log"
done
