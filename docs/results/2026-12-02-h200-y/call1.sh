#!/usr/bin/env bash
# Call 1 (session 22): the fp8 weight gradients (LaunchConfig::fp8_weight_gradients) on the GPU for the
# first time: their tests and the fp8 tests around them; the fp8 backward with the option off against
# 0eabecc (the A/B step), then on and off in this build alternating, kimi-k2 and olmoe.
set -uo pipefail
out=${OUT:-/tmp/mok-out}
MOK_COMMIT=${MOK_COMMIT:-unknown} MOK_BASELINE=.snapB MOK_SHAPES="kimi-k2" MOK_BENCH_ARGS="--fp8 --runs 10" \
  bash bench/h200_session.sh ab || exit 1
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
grep -E "^==|^$|kimi-k2|olmoe" "$out/fp8_grads.log" | grep -E "^==|uniform" | tee -a "$out/summary.log"
