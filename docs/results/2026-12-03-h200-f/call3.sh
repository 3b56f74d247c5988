#!/usr/bin/env bash
# Call 3 (cut to the session's last device minutes): every consumer thread releases the stage (the empty
# barrier counts 256 arrivals, not 8 warps' lane 0 after a __syncwarp: call 2's mbarrier_probe mode 4,
# the one racecheck sees) against call 2's tree (.snapB, carried): every golden, racecheck and synccheck
# over the fp8 forward and backward and the bf16 match tests, every GPU test, then as time allows
# mok-bench --runs 5 on kimi-k2: --fp8 B N B N, bf16 B N.
# Run: MOK_COMMIT=<hash> bash docs/results/2026-12-03-h200-f/call3.sh (device tool, carry .deps, .snapB)
set -uo pipefail
source bench/device_call.sh  # out, log, call_header, build_tree
start=$SECONDS
call_header "steps: build, goldens, racecheck, synccheck, GPU tests, A/B against $(cat .snapB/COMMIT)"
build_tree .snapB 6 --target mok-bench >"$out/build_baseline.log" 2>&1 &
baseline=$!
build_tree . 10 >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
log "build ok"
echo "goldens EQUAL: $(timeout 120 build/verify/mok-verify golden/data --backend gpu 2>&1 | grep -cE '^EQUAL')" | tee -a "$out/summary.log"
filter='Gpu.Fp8ForwardMatchesReferenceBitForBit:Gpu.Fp8BackwardMatchesReferenceBitForBit:Gpu.MatchesReference*'
for tool in racecheck synccheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 1 build/megakernel/tests/mok_megakernel_tests \
    --gtest_filter="$filter" >/tmp/s.log 2>&1
  echo "$tool exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/s.log | tail -1) $(grep -c '^\[       OK' /tmp/s.log) tests OK" | tee -a "$out/summary.log"
  { echo "== compute-sanitizer $tool"; head -c 20000 /tmp/s.log; } >>"$out/sanitize.log"
done
ctest --test-dir build -L gpu --output-on-failure --timeout 120 >"$out/gpu_tests.log" 2>&1
grep -E "tests passed|tests failed|Failed|FAILED" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
wait $baseline || { tail -30 "$out/build_baseline.log"; exit 1; }
log "baseline build ok"
for run in "fp8 B" "fp8 N" "fp8 B" "fp8 N" "bf16 B" "bf16 N"; do
  read -r precision tree <<<"$run"
  [ $((SECONDS - start)) -lt 275 ] || { log "out of time: no $precision $tree run"; continue; }
  dir=.; [ $tree = B ] && dir=.snapB
  flags=(--shape kimi-k2 --runs 5)
  [ $precision = fp8 ] && flags+=(--fp8)
  timeout 40 "$dir/build/megakernel/mok-bench" "${flags[@]}" >"$out/ab.run" 2>&1
  { echo "#### $tree ($dir) ${flags[*]} exit $?"; cat "$out/ab.run"; } >>"$out/ab.log"
  echo "ab $precision $tree: $(awk '$1 == "kimi-k2"' "$out/ab.run" | tail -1) | $(grep -o 'expert GEMM1 [0-9.]*;  expert GEMM2 [0-9.]*' "$out/ab.run")" | tee -a "$out/summary.log"
done
rm -f "$out/ab.run"
log "done"
