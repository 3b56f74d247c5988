#!/usr/bin/env bash
# Call 6 (session 38), timing only: what GEMM1's h stores cost the small shapes' forward. The tree is
# 662741e with skip_h_store.patch applied (the SwiGLU epilogue stores a, not h: the backward's results
# are wrong, so no test runs); mok-bench against 662741e (.snapB), B N B N, on olmoe and qwen3-30b-a3b,
# whose forward GEMM1 took 37% and 31% longer than the backward's dx GEMM of the same size (call 4, 5).
#   MOK_COMMIT=662741e+skip_h_store.patch bash docs/results/2026-12-04-h200-h/call6/call6.sh
set -uo pipefail
MOK_CALL_SECONDS=${MOK_CALL_SECONDS:-230} MOK_BASELINE=.snapB MOK_SHAPES="olmoe qwen3-30b-a3b" \
  bash bench/h200_session.sh ab
source bench/device_call.sh
grep -E "^#### |forward phases" "$out/ab.log" >>"$out/summary.log"
grep -q "baseline build ok" "$out/summary.log" && rm -f "$out/build_baseline.log"
grep -q "build ok" "$out/summary.log" && rm -f "$out/build.log"
