#!/usr/bin/env bash
# Call 2 (session 39): mok-bench, the working tree against ba39601 (.snapB), B N B N, bf16 on olmoe,
# qwen3-30b-a3b (whose forwards' layout scan took 0.05 and 0.10 ms in block 0, session 38) and kimi-k2.
#   MOK_COMMIT=<hash> bash docs/results/2026-12-04-h200-i/call2/call2.sh
set -uo pipefail
MOK_CALL_SECONDS=${MOK_CALL_SECONDS:-560} MOK_BASELINE=.snapB MOK_SHAPES="olmoe qwen3-30b-a3b kimi-k2" \
  MOK_AB_PRECISIONS="bf16" bash bench/h200_session.sh ab
source bench/device_call.sh
grep -E "^#### |forward phases|^[a-z0-9.-]+ +uniform" "$out/ab.log" >>"$out/summary.log"
grep -q "baseline build ok" "$out/summary.log" && rm -f "$out/build_baseline.log"
grep -q "build ok" "$out/summary.log" && rm -f "$out/build.log"
