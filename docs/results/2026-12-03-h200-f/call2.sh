#!/usr/bin/env bash
# Call 2: (1) mbarrier_probe.cu under racecheck in each mode (does racecheck see an mbarrier's ordering?
# call 1's racecheck reports the b_exps hand-over); (2) the consumers' K-block count broadcast at each
# GEMM phase (gemm_tiles: the stage index and the wgmma descriptors back in uniform registers) against
# the commit before (.snapB, carried): every GPU test and golden on this tree, then mok-bench --runs 5,
# B N B N, on kimi-k2 and olmoe, bf16 and --fp8.
# Run: MOK_COMMIT=<hash> bash docs/results/2026-12-03-h200-f/call2.sh (device tool, carry .deps, .snapB)
set -uo pipefail
source bench/device_call.sh  # out, log, call_header, build_tree
call_header "steps: racecheck probe, build, GPU tests, goldens, A/B against $(cat .snapB/COMMIT)" \
  "$(compute-sanitizer --version | tail -1)"
d=docs/results/2026-12-03-h200-f
build_tree .snapB 6 --target mok-bench >"$out/build_baseline.log" 2>&1 &
baseline=$!
nvcc -std=c++20 -I megakernel/include -gencode=arch=compute_90a,code=sm_90a -lineinfo -o /tmp/mprobe $d/mbarrier_probe.cu || exit 1
for mode in 0 1 2 3 4; do
  timeout 60 compute-sanitizer --tool racecheck --print-limit 2 /tmp/mprobe $mode 64 >/tmp/r.log 2>&1
  echo "racecheck rc $? mode $mode: $(grep -E '^mode' /tmp/r.log) $(grep 'RACECHECK SUMMARY' /tmp/r.log)" | tee -a "$out/summary.log"
  { echo "== mbarrier_probe $mode 64"; head -c 3000 /tmp/r.log; } >>"$out/probe.log"
done
build_tree . 10 >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
wait $baseline || { tail -30 "$out/build_baseline.log"; exit 1; }
log "builds ok"
ctest --test-dir build -L gpu --output-on-failure --timeout 120 >"$out/gpu_tests.log" 2>&1
grep -E "tests passed|tests failed|Failed|FAILED" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
echo "goldens EQUAL: $(timeout 120 build/verify/mok-verify golden/data --backend gpu 2>&1 | grep -cE '^EQUAL')" | tee -a "$out/summary.log"
for shape in kimi-k2 olmoe; do
  for precision in bf16 fp8; do
    flags=(--shape "$shape" --runs 5)
    [ $precision = fp8 ] && flags+=(--fp8)
    for tree in B N B N; do
      dir=.; [ $tree = B ] && dir=.snapB
      timeout 90 "$dir/build/megakernel/mok-bench" "${flags[@]}" >"$out/ab.run" 2>&1
      { echo "#### $tree ($dir) ${flags[*]} exit $?"; cat "$out/ab.run"; } >>"$out/ab.log"
      echo "ab $precision $tree: $(awk -v s=$shape '$1 == s' "$out/ab.run" | tail -1) | $(grep -o 'expert GEMM1 [0-9.]*;  expert GEMM2 [0-9.]*' "$out/ab.run")" | tee -a "$out/summary.log"
    done
  done
done
rm -f "$out/ab.run"
log "done"
