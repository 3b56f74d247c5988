#!/usr/bin/env bash
# Call 3 (session 23): the GPU fuzzer over the tree of calls 1-2 (its fp8 cases draw fp8_weight_gradients),
# then the GEMM1 epilogue's SwiGLU batch (expert_up.cuh's kBatch): 16 words (this tree) against 8 (.snapC,
# the tree of calls 1-2), bf16 and fp8 forward on kimi-k2 and qwen3-30b-a3b, alternating.
set -uo pipefail
out=${OUT:-/tmp/mok-out}
MOK_COMMIT=${MOK_COMMIT:-unknown} MOK_BASELINE=.snapC MOK_FUZZ_SECONDS=60 bash bench/h200_session.sh fuzz || exit 1
ab() {  # shape, then mok-bench's flags
  local shape=$1
  shift
  echo "== B kBatch 8 $shape $*"
  .snapC/build/megakernel/mok-bench --shape "$shape" "$@" --runs 10
  echo "== N kBatch 16 $shape $*"
  build/megakernel/mok-bench --shape "$shape" "$@" --runs 10
}
{
  for i in 1 2; do
    for shape in kimi-k2 qwen3-30b-a3b; do
      ab "$shape"
      ab "$shape" --fp8
    done
  done
} > "$out/batch_ab.log" 2>&1
grep -E "^==|uniform  |forward phases" "$out/batch_ab.log" | sed 's/given routing.*pull/pull/' | tee -a "$out/summary.log"
