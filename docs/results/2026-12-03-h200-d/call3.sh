#!/usr/bin/env bash
# Call 3: does the fp8 chain wait for its stages? The tile clock (tile_clock_mhz.patch) plus stage_waits.patch
# (each consumer's cycles in the full-stage waits of consume_fp8, in the megakernel's tile clock and in
# mok-fp8-chain's fed variants), kimi-k2 and olmoe fp8.
# Run: MOK_COMMIT=<hash> bash docs/results/2026-12-03-h200-d/call3.sh (device tool, carry .deps)
set -uo pipefail
source bench/device_call.sh  # out, build_tree
call_header "steps: the fp8 chain's waits for full stages (tile clock, mok-fp8-chain)"
rm -rf .snapW && mkdir .snapW && tar --exclude=./build --exclude='./.snap*' --exclude=./.git -cf - . | tar -xf - -C .snapW || exit 1
git apply --directory=.snapW docs/results/2026-12-03-h200-c/tile_clock_mhz.patch &&
  git apply --directory=.snapW docs/results/2026-12-03-h200-d/stage_waits.patch || exit 1
build_tree .snapW 16 --target mok-bench mok-fp8-chain > "$out/build_W.log" 2>&1 || { tail -30 "$out/build_W.log"; exit 1; }
rm -f "$out/build_W.log"
timeout 60 .snapW/build/megakernel/mok-fp8-chain 20000 2>&1 | tee "$out/fp8_chain.log" | grep fed >> "$out/summary.log"
for args in "kimi-k2 --fp8" "olmoe --fp8" "kimi-k2 --fp8"; do
  echo "== $args"
  timeout 60 .snapW/build/megakernel/mok-bench --shape $args --runs 1 --warmup 0 --sets 1
done > "$out/tile_clock_waits.log" 2>&1
grep -E "^==|TILECLK phase [89] .*block 0 wg|uniform  " "$out/tile_clock_waits.log" | tee -a "$out/summary.log"
