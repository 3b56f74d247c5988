#!/usr/bin/env bash
# Call 5 (session 24): the FP8 chain's consumers take turns at the tensor core (await_turn / pass_turn in
# tile_gemm.cuh: each promotes while the other's K-steps run; the tile clock of call 4 found the fp8
# chain at about half the E4M3 rate). This tree's fp8 GPU tests and every golden, then mok-bench against
# .snapB (d02c879, without the turns), runs alternating: kimi-k2 and olmoe fp8, kimi-k2 with fp8 weight
# gradients, and kimi-k2 bf16 (unchanged code: the control).
set -uo pipefail
out=${OUT:-/tmp/mok-out}
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: ${MOK_COMMIT:-unknown}; baseline .snapB d02c879"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
rc_dir=$PWD/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
build() {  # tree, jobs, targets
  cmake -S "$1" -B "$1/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR="$rc_dir" && cmake --build "$1/build" -j"$2" --target ${@:3}
}
build .snapB 5 mok-bench > "$out/build_baseline.log" 2>&1 &
build . 11 mok_megakernel_tests mok-bench mok-verify > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
wait $! || { tail -30 "$out/build_baseline.log"; exit 1; }
log "built"
timeout 150 build/megakernel/tests/mok_megakernel_tests --gtest_filter='Gpu.Fp8*:Modes/*:LayerApi.Fp8*:LayerApi.Bf16WeightGradients*' > "$out/tests.log" 2>&1
echo "fp8 tests rc $?: $(grep -E '^\[  (PASSED|FAILED) ' "$out/tests.log" | tr '\n' ' ')" | tee -a "$out/summary.log"
timeout 60 build/verify/mok-verify --backend gpu golden/data > "$out/verify_gpu.log" 2>&1
echo "mok-verify exit $?: $(tail -1 "$out/verify_gpu.log")" | tee -a "$out/summary.log"
ab() {  # flags
  for who in B N B N; do
    bin=build/megakernel/mok-bench
    [ $who = B ] && bin=.snapB/build/megakernel/mok-bench
    echo "== $who $*"
    timeout 60 $bin "$@" --runs 5
  done
}
{
  ab --shape kimi-k2 --fp8
  ab --shape olmoe --fp8
  ab --shape kimi-k2 --fp8 --fp8-weight-gradients
  ab --shape kimi-k2
} > "$out/turns_ab.log" 2>&1
grep -E "^==|uniform  " "$out/turns_ab.log" | tee -a "$out/summary.log"
grep -E "forward phases" "$out/turns_ab.log" | sed 's/.*layout place[^;]*;//' | tee -a "$out/summary.log"
grep -E "backward phases" "$out/turns_ab.log" | sed 's/.*tile table[^;]*;//' | tee -a "$out/summary.log"
log "done"
