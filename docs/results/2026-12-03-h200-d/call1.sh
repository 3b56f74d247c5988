#!/usr/bin/env bash
# Prepared in session 25 for the next session's first device call (not run here). First the landing
# tree whole (its last changes ran on no GPU: the op's launch fields as an enum, mok-fp8-chain's fixes,
# tc_validate's first-K-step mode): every GPU test (with the new ctest
# tc_model_validation_wgmma_e4m3_n128_first), every golden, the PyTorch extension and its tests. Then
# does the fp8 chain lose its cycles to the feed at the top clock? mok-fp8-chain (the fed variants with
# their promotions, each row's SM clock recorded, the timed launch after an idle quarter second), the
# first-K-step probe at 1e8 outputs, and the tile clock with the clock recorded (tile_clock_mhz.patch in
# .snapT: sums in memory, no printf, so no serialized wgmmas; it spills more than HEAD, forward_fp8 488
# bytes of stores against 308, so compare its phase times with call 1's) on kimi-k2 fp8 and bf16.
# Run: MOK_COMMIT=<hash> bash docs/results/2026-12-03-h200-c/next_call.sh (device tool, carry .deps,
# timeout_s 600: call 2's tests and python took about 5 minutes, the rest adds 2-3)
set -uo pipefail
source bench/device_call.sh  # out, build_tree
rm -rf .snapT && mkdir .snapT && tar --exclude=./build --exclude='./.snap*' -cf - . | tar -xf - -C .snapT &&
  git apply --directory=.snapT docs/results/2026-12-03-h200-c/tile_clock_mhz.patch || exit 1
build_tree .snapT 4 --target mok-bench > "$out/build_tile_clock.log" 2>&1 &
MOK_COMMIT=${MOK_COMMIT:-unknown} MOK_TORCH_BUILD=1 bash bench/h200_session.sh tests python || exit 1
# The device tool returns 8 files: the tile clock's build log only when it failed.
if wait $!; then rm -f "$out/build_tile_clock.log"; else tail -30 "$out/build_tile_clock.log"; exit 1; fi
for pass in 1 2; do timeout 90 build/megakernel/mok-fp8-chain 20000; echo "rc $?"; done 2>&1 | tee "$out/fp8_chain.log" >> "$out/summary.log"
timeout 120 build/megakernel/mok-tc-validate 1e8 20261203 wgmma-e4m3-n128-first > "$out/tc_first.log" 2>&1
echo "tc-validate n128-first exit $?: $(tail -1 "$out/tc_first.log")" | tee -a "$out/summary.log"
for flags in "--fp8" ""; do
  echo "== kimi-k2 $flags"
  timeout 90 .snapT/build/megakernel/mok-bench --shape kimi-k2 $flags --runs 1 --warmup 0 --sets 1
done > "$out/tile_clock.log" 2>&1
grep -E "^==|TILECLK phase [89] |uniform  " "$out/tile_clock.log" | awk '!seen[$0]++' | tee -a "$out/summary.log"
