#!/usr/bin/env bash
# Session 69, call 4: the fp8 ring phases (GEMM2, dy W2, the dx push) in narrow 128 x 128 tiles, one wgmma group a
# K-block (kFp8NarrowRingTiles = true in this tree), against the baseline tree .snapB (d58a11c, 128 x 256 tiles):
# the GPU tests and goldens on the narrow build, mok-bench fp8 A/B on kimi-k2 and olmoe (B N B N), then
# mok-fp8-chain 20000 with its fed-kimi-k2-n128 row.
#   bash docs/results/2026-12-07-h100-e/call4/call4.sh   # carry .deps and .snapB
set -uo pipefail
export MOK_BASELINE=.snapB MOK_SHAPES="kimi-k2 olmoe" MOK_AB_PRECISIONS=fp8 MOK_BENCH_ARGS="--runs 5" MOK_CALL_SECONDS=${MOK_CALL_SECONDS:-440}
bash bench/h200_session.sh tests ab
source bench/device_call.sh
log "mok-fp8-chain 20000"
timeout 120 build/megakernel/mok-fp8-chain 20000 >"$out/fp8_chain.log" 2>&1
echo "mok-fp8-chain exit $?" | tee -a "$out/summary.log"
cat "$out/fp8_chain.log" | tee -a "$out/summary.log"
