#!/usr/bin/env bash
# Call 3: B's scale exponents of the fp8 chain by shuffles from 32-lane windows (one coalesced load a lane
# per 32 K-blocks) instead of two loads a K-block (call 2's stall sampling: the exponents' loads and
# their addresses stall the megakernel's loop) against the commit before (.snapB, carried): the FP8 GPU
# tests and every golden on this tree, then mok-bench --runs 5 --fp8, B N B N, on kimi-k2 and olmoe.
# Run: MOK_COMMIT=<hash> bash docs/results/2026-12-03-h200-e/call3.sh (device tool, carry .deps, .snapB)
set -uo pipefail
out=${OUT:-/tmp/mok-out}
MOK_BASELINE=.snapB MOK_SHAPES="kimi-k2 olmoe" MOK_BENCH_ARGS="--runs 5 --fp8" bash bench/h200_session.sh ab
{
  timeout 120 build/megakernel/tests/mok_megakernel_tests --gtest_filter='*Fp8*:*fp8*' 2>&1 | tail -5
  timeout 120 build/verify/mok-verify golden/data --backend gpu 2>&1 | grep -cE '^EQUAL'
} | tee -a "$out/summary.log"
