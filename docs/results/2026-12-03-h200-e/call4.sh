#!/usr/bin/env bash
# Call 4: B's scale exponents of the fp8 chain brought with the stage: the producer stores them beside it
# (GemmSmem::b_exps) before the stage's arrival, so the consumers' loop loads only A's two (call 2: the
# exponent loads stall it) against the commit before (.snapB, carried): the FP8 GPU tests and every golden
# on this tree, then mok-bench --runs 5 --fp8, B N B N, on kimi-k2 (cut to fit the session's last minutes).
# Run: MOK_COMMIT=<hash> bash docs/results/2026-12-03-h200-e/call4.sh (device tool, carry .deps, .snapB)
set -uo pipefail
source bench/device_call.sh  # out, log, call_header, build_tree
call_header "steps: build, FP8 GPU tests, goldens, A/B kimi-k2 --fp8 against $(cat .snapB/COMMIT)"
build_tree .snapB 6 --target mok-bench > "$out/build_baseline.log" 2>&1 &
build_tree . 10 --target mok-bench mok_megakernel_tests mok-verify > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
wait $! || { tail -30 "$out/build_baseline.log"; exit 1; }
log "builds ok"
timeout 90 build/megakernel/tests/mok_megakernel_tests --gtest_filter='*Fp8*:*fp8*' 2>&1 | tail -3 | tee -a "$out/summary.log"
echo "goldens EQUAL: $(timeout 60 build/verify/mok-verify golden/data --backend gpu 2>&1 | grep -cE '^EQUAL')" | tee -a "$out/summary.log"
for tree in B N B N; do
  dir=.; [ $tree = B ] && dir=.snapB
  timeout 60 "$dir/build/megakernel/mok-bench" --shape kimi-k2 --runs 5 --fp8 > "$out/ab.run" 2>&1
  { echo "#### $tree ($dir) exit $?"; cat "$out/ab.run"; } >> "$out/ab.log"
  echo "ab $tree: $(awk '$1 == "kimi-k2"' "$out/ab.run" | tail -1) | $(grep -o 'expert GEMM1 [0-9.]*;  expert GEMM2 [0-9.]*' "$out/ab.run")" | tee -a "$out/summary.log"
done
rm -f "$out/ab.run"
