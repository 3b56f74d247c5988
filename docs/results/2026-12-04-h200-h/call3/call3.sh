#!/usr/bin/env bash
# Call 3 (session 38): issue 18's and 19's tables again on every shape at 45b4b44's kernels: per shape,
# mok-bench (bf16; bench.log), torch_baseline.py --fp8 (torch's deterministic layer, its two grouped
# GEMMs alone, and its FP8 grouped GEMMs; bench.log) and mok-bench --fp8 (bench_fp8.log), uniform
# routing, one after another in that order; a shape that would not end within 560 s is left out.
#   MOK_COMMIT=<hash> bash docs/results/2026-12-04-h200-h/call3/call3.sh
set -uo pipefail
source bench/device_call.sh
call_header "mok-bench (bf16, fp8) beside torch_baseline.py --fp8, six shapes, uniform routing"
build_tree . 16 --target mok-bench >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
log "build ok" && rm -f "$out/build.log"
for s in kimi-k2 glm-5 qwen3.5-397b deepseek-v4 qwen3-30b-a3b olmoe; do
  [ "$SECONDS" -lt 480 ] || { log "out of time: no $s"; continue; }
  log "mok-bench --shape $s"
  timeout 100 build/megakernel/mok-bench --shape "$s" --routing uniform 2>>"$out/bench.err" | tee -a "$out/bench.log" | tail -1
  log "torch baseline --shape $s --fp8"
  timeout 120 python3 bench/torch_baseline.py --shape "$s" --routing uniform --fp8 2>>"$out/bench.err" |
    tee -a "$out/bench.log" | grep -E "^$s|^fp8 "
  log "mok-bench --shape $s --fp8"
  timeout 100 build/megakernel/mok-bench --shape "$s" --routing uniform --fp8 2>>"$out/bench.err" |
    tee -a "$out/bench_fp8.log" | tail -1
done
[ -s "$out/bench.err" ] || rm -f "$out/bench.err"
log done
