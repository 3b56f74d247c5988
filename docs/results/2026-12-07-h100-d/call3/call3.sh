#!/usr/bin/env bash
# Session 68, call 3: mok-bench's GEMM phases on the six shapes, bf16 and fp8, beside DeepGEMM's two grouped
# forward GEMMs alone (bench/deepgemm_baseline.py then, kept beside this script; DeepGEMM 54e2261 from the carried
# .deps/deepgemm, DEPS_PROVENANCE.txt) in one call. DeepGEMM's first GEMM call segfaulted: no DeepGEMM timing.
#   bash docs/results/2026-12-07-h100-d/call3/call3.sh   # carry .deps
set -uo pipefail
source bench/device_call.sh
call_header "call 3: mok-bench six shapes bf16 and fp8, then DeepGEMM's grouped GEMMs alone"
build_tree . 16 --target mok-bench >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
log "build ok"
for s in kimi-k2 glm-5 qwen3.5-397b deepseek-v4 qwen3-30b-a3b olmoe; do
  for precision in bf16 fp8; do
    args=()
    [ "$precision" = fp8 ] && args=(--fp8)
    log "mok-bench --shape $s $precision"
    timeout 120 build/megakernel/mok-bench --shape "$s" --runs 5 "${args[@]}" >>"$out/bench.log" 2>&1
    grep -E "^$s " "$out/bench.log" | tail -1 | tee -a "$out/summary.log"
  done
done
log "DeepGEMM"
timeout 300 python3 bench/deepgemm_baseline.py --time-budget 240 >"$out/deepgemm.log" 2>&1
echo "deepgemm_baseline exit $?" | tee -a "$out/summary.log"
tail -30 "$out/deepgemm.log"
log "done"
