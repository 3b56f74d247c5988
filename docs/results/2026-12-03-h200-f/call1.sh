#!/usr/bin/env bash
# Call 1: the full check of the tree that session 27 landed (68b8646's B exponents with the stage, not
# yet run past the FP8 tests): every GPU test, every golden, racecheck / synccheck / memcheck over the fp8
# forward and backward (the new shared-memory hand-over) and the bf16 match tests, the PyTorch op's
# tests, mok-fp8-chain, then mok-bench --fp8 --runs 3 on the six shapes (no torch baseline).
# Run: MOK_COMMIT=<hash> bash docs/results/2026-12-03-h200-f/call1.sh (device tool, carry .deps)
set -uo pipefail
export MOK_TORCH_BUILD=1 MOK_SANITIZE_TOOLS="racecheck synccheck memcheck"
export MOK_SANITIZE_FILTER='Gpu.Fp8ForwardMatchesReferenceBitForBit:Gpu.Fp8BackwardMatchesReferenceBitForBit:Gpu.MatchesReference*'
bash bench/h200_session.sh tests sanitize python
source bench/device_call.sh  # out, log
log "mok-fp8-chain 2000"
timeout 60 build/megakernel/mok-fp8-chain 2000 >"$out/fp8_chain.log" 2>&1
echo "fp8-chain exit $?: $(tail -2 "$out/fp8_chain.log" | tr '\n' ' ')" | tee -a "$out/summary.log"
mv "$out/summary.log" "$out/summary_first.tmp"  # the second session's header starts a new summary
MOK_TORCH=0 MOK_ROUTINGS=uniform MOK_BENCH_ARGS="--fp8 --runs 3" bash bench/h200_session.sh bench
cat "$out/summary_first.tmp" "$out/summary.log" >"$out/summary.tmp" && mv "$out/summary.tmp" "$out/summary.log"
rm -f "$out/summary_first.tmp" "$out/build.log"  # eight files come back; the build log only matters on failure
