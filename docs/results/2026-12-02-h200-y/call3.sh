#!/usr/bin/env bash
# Call 3 (session 22): the landed tree whole (GPU tests, goldens, the GPU fuzzer, whose fp8 cases now
# draw fp8_weight_gradients); the bf16 kernels against 0eabecc (the stages' scales grew every kernel's
# shared memory by 4.6 KB): A/B on kimi-k2 and deepseek-v4; then kimi-k2's fp8 layer, 0eabecc against
# this tree with the option off and on, alternating.
set -uo pipefail
out=${OUT:-/tmp/mok-out}
MOK_COMMIT=${MOK_COMMIT:-unknown} MOK_BASELINE=.snapB MOK_SHAPES="kimi-k2 deepseek-v4" MOK_BENCH_ARGS="--runs 5" \
  MOK_FUZZ_SECONDS=60 bash bench/h200_session.sh tests ab fuzz
for i in 1 2; do
  echo "== B 0eabecc --fp8"
  .snapB/build/megakernel/mok-bench --shape kimi-k2 --fp8 --runs 10
  echo "== N --fp8"
  build/megakernel/mok-bench --shape kimi-k2 --fp8 --runs 10
  echo "== N --fp8 --fp8-weight-gradients"
  build/megakernel/mok-bench --shape kimi-k2 --fp8 --fp8-weight-gradients --runs 10
done > "$out/fp8_ab.log" 2>&1
grep -E "^==|uniform  |weight gradients|layer memory" "$out/fp8_ab.log" | sed 's/.*router backward[^;]*;//' | tee -a "$out/summary.log"
