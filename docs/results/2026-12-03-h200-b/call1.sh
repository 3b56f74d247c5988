#!/usr/bin/env bash
# Call 1 (session 24): which launch mode of the fp8 weight gradients racecheck reports hazards in
# (session 23: 261 in grad_operands.cuh over the whole test). The test is now one per mode
# (Modes/Fp8WeightGradients.MatchTheReference/<mode>); racecheck runs each alone, then the fp8 backward's
# launch modes without the option and the LayerApi bf16-gradient tests (clean in session 23) beside them.
set -uo pipefail
out=${OUT:-/tmp/mok-out}
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown) + the per-mode test (uncommitted)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
rc=$PWD/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR="$rc" > "$out/build.log" 2>&1 &&
  cmake --build build -j16 --target mok_megakernel_tests >> "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
log "built"
t=build/megakernel/tests/mok_megakernel_tests
race() {  # filter, seconds
  timeout "$2" compute-sanitizer --tool racecheck --error-exitcode 1 --print-limit 6 $t --gtest_filter="$1" > /tmp/race.log 2>&1
  echo "racecheck rc $? $1: $(grep 'RACECHECK SUMMARY' /tmp/race.log | tail -1) $(grep -E '^\[  (PASSED|FAILED) ' /tmp/race.log | tr '\n' ' ')" | tee -a "$out/summary.log"
  { echo "== racecheck --gtest_filter=$1"; grep -v "^=========     and" /tmp/race.log | head -c 12000; } >> "$out/racecheck.log"
}
for m in one_rank one_tile_ring recompute_one_tile_ring colocated_shares weights_quantized_once; do
  race "Modes/Fp8WeightGradients.MatchTheReference/$m" 80
done
race "Gpu.Fp8WeightGradientsOfTinyDyMatchTheReference" 60
race "LayerApi.Bf16WeightGradients*" 80
race "Gpu.Fp8BackwardAcrossLaunchModesMatchesTheReference" 150
log "done"
