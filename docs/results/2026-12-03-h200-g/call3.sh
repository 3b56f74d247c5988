#!/usr/bin/env bash
# Call 3: the GEMM pipeline's shared memory addressed as shared (aligned_dynamic_smem: LDS / STS where
# its ordinary loads and stores had been generic LD / ST) against 383acad (.snapB, carried): every golden, every GPU
# test, racecheck / synccheck / initcheck over the fp8 forward and backward and the bf16 match test,
# mok-fp8-chain 2000 of both trees, then mok-bench --runs 5, B N B N alternating: kimi-k2 --fp8,
# kimi-k2 bf16, olmoe --fp8, olmoe bf16 (as time allows).
# Run: MOK_COMMIT=<hash> bash docs/results/2026-12-03-h200-g/call3.sh (device tool, carry .deps, .snapB)
set -uo pipefail
source bench/device_call.sh  # out, log, call_header, build_tree
start=$SECONDS
call_header "steps: build, goldens, GPU tests, sanitizers, mok-fp8-chain, A/B against $(cat .snapB/COMMIT)"
build_tree .snapB 4 --target mok-bench mok-fp8-chain >"$out/build_baseline.log" 2>&1 &
baseline=$!
build_tree . 12 >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
log "build ok"
timeout 120 build/verify/mok-verify golden/data --backend gpu >"$out/verify_gpu.log" 2>&1
echo "mok-verify exit $?: $(grep -cE '^EQUAL' "$out/verify_gpu.log") EQUAL, $(grep -cE '^(MISMATCH|ERROR)' "$out/verify_gpu.log") MISMATCH/ERROR" | tee -a "$out/summary.log"
ctest --test-dir build -L gpu --output-on-failure --timeout 120 >"$out/gpu_tests.log" 2>&1
grep -E "tests passed|tests failed|Failed|FAILED" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
{ echo "#### mok-verify golden/data --backend gpu"; cat "$out/verify_gpu.log"; } >>"$out/gpu_tests.log" && rm "$out/verify_gpu.log"
filter='Gpu.Fp8ForwardMatchesReferenceBitForBit:Gpu.Fp8BackwardMatchesReferenceBitForBit:Gpu.MatchesReference*'
for tool in racecheck synccheck initcheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 1 build/megakernel/tests/mok_megakernel_tests \
    --gtest_filter="$filter" >/tmp/s.log 2>&1
  echo "$tool exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/s.log | tail -1) $(grep -c '^\[       OK' /tmp/s.log) tests OK" | tee -a "$out/summary.log"
  { echo "== compute-sanitizer $tool"; head -c 20000 /tmp/s.log; } >>"$out/sanitize.log"
done
wait $baseline || { tail -30 "$out/build_baseline.log"; exit 1; }
log "baseline build ok"
for tree in B N; do
  dir=.; [ $tree = B ] && dir=.snapB
  timeout 60 "$dir/build/megakernel/mok-fp8-chain" 2000 >"$out/ab.run" 2>&1
  { echo "#### $tree ($dir) mok-fp8-chain 2000 exit $?"; cat "$out/ab.run"; } >>"$out/ab.log"
  echo "fp8-chain $tree: $(grep -E '^(chain|fed-kimi-k2) ' "$out/ab.run" | tr -s ' ' | cut -d' ' -f1-2 | tr '\n' ' ')" | tee -a "$out/summary.log"
done
for run in "kimi-k2 fp8 B" "kimi-k2 fp8 N" "kimi-k2 fp8 B" "kimi-k2 fp8 N" "kimi-k2 bf16 B" "kimi-k2 bf16 N" \
  "kimi-k2 bf16 B" "kimi-k2 bf16 N" "olmoe fp8 B" "olmoe fp8 N" "olmoe fp8 B" "olmoe fp8 N" "olmoe bf16 B" \
  "olmoe bf16 N" "olmoe bf16 B" "olmoe bf16 N"; do
  read -r shape precision tree <<<"$run"
  [ $((SECONDS - start)) -lt 470 ] || { log "out of time: no $shape $precision $tree run"; continue; }
  dir=.; [ "$tree" = B ] && dir=.snapB
  flags=(--shape "$shape" --runs 5)
  [ "$precision" = fp8 ] && flags+=(--fp8)
  timeout 60 "$dir/build/megakernel/mok-bench" "${flags[@]}" >"$out/ab.run" 2>&1
  { echo "#### $tree ($dir) ${flags[*]} exit $?"; cat "$out/ab.run"; } >>"$out/ab.log"
  echo "ab $shape $precision $tree: $(awk -v s="$shape" '$1 == s' "$out/ab.run" | tail -1) | $(grep -o 'expert GEMM1 [0-9.]*;  expert GEMM2 [0-9.]*' "$out/ab.run") | $(grep -o 'dx push [0-9.]*' "$out/ab.run") | $(grep -o 'weight gradients[^;]*[0-9.]*' "$out/ab.run")" | tee -a "$out/summary.log"
done
rm -f "$out/ab.run" "$out/build.log" "$out/build_baseline.log"
log "done"
