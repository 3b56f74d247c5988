#!/usr/bin/env bash
# Call 1: the deferred epilogues (GEMM1's SwiGLU and the pushes stashed whole, finished in slices during
# the next tile's K-blocks; their phases on three stages, the half tiles over the fourth) against the commit before them (.snapB, carried):
# ctest -L gpu and every golden on this tree, then mok-bench --runs 5, B N B N, on kimi-k2 and olmoe in
# bf16 and fp8.
# Run: MOK_COMMIT=<hash> bash docs/results/2026-12-03-h200-e/call1.sh (device tool, carry .deps, .snapB)
set -uo pipefail
MOK_BASELINE=.snapB MOK_SHAPES="kimi-k2 olmoe" MOK_BENCH_ARGS="--runs 5" bash bench/h200_session.sh tests ab
out=${OUT:-/tmp/mok-out}
mv "$out/ab.log" "$out/ab_bf16.log"
mv "$out/summary.log" "$out/summary_bf16.log"
MOK_BASELINE=.snapB MOK_SHAPES="kimi-k2 olmoe" MOK_BENCH_ARGS="--runs 5 --fp8" bash bench/h200_session.sh ab
mv "$out/ab.log" "$out/ab_fp8.log"
