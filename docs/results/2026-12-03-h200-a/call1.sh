#!/usr/bin/env bash
# Call 1 (session 23), one build with the PyTorch extension: the fp8 weight gradients' operands quantized by
# each warpgroup on its own (three (tile, operand) units in flight per SM, three warpgroup barriers a column
# block); the tests that now also accumulate fp8 weight gradients and round them to bf16 tensors; the op's
# new launch field fp8_weight_gradients. Every GPU test and golden; kimi-k2's fp8 layer, 6e20733 against
# this tree with the option off and on; the Python tests of the op; compute-sanitizer over the fp8
# weight-gradient tests.
set -uo pipefail
out=${OUT:-/tmp/mok-out}
MOK_COMMIT=${MOK_COMMIT:-unknown} MOK_TORCH_BUILD=1 MOK_BASELINE=.snapB bash bench/h200_session.sh tests || exit 1
ab() {  # mok-bench's flags
  echo "== B 6e20733 $*"
  .snapB/build/megakernel/mok-bench "$@" --runs 10
  echo "== N $*"
  build/megakernel/mok-bench "$@" --runs 10
}
{
  ab --shape kimi-k2 --fp8
  ab --shape kimi-k2 --fp8 --fp8-weight-gradients
} > "$out/fp8_ab.log" 2>&1
grep -E "^==|uniform  |weight gradients|layer memory" "$out/fp8_ab.log" | sed 's/.*router backward[^;]*;//' | tee -a "$out/summary.log"
( cd python/tests && PYTHONPATH=$PWD/../../build/python MOK_GOLDEN_DIR=$PWD/../../golden/data timeout 150 python3 -m pytest -q -rs \
    test_cuda.py test_errors.py test_capture.py test_distributed.py test_autograd.py > "$out/pytest.log" 2>&1
  echo "pytest rc $?: $(tail -1 "$out/pytest.log")" | tee -a "$out/summary.log" )
for tool in racecheck synccheck memcheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 1 build/megakernel/tests/mok_megakernel_tests \
    --gtest_filter='LayerApi.Bf16WeightGradients*:Gpu.Fp8WeightGradientsMatchTheReference' > "$out/sanitize_$tool.log" 2>&1
  echo "$tool exit $?: $(grep 'ERROR SUMMARY' "$out/sanitize_$tool.log" | tail -1)" | tee -a "$out/summary.log"
done
