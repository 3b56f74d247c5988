#!/usr/bin/env bash
# Call 4 (session 24): the tile clock (tile_clock.patch in .snapT: cycles per tile of the job, the chain
# of K-blocks with its waits, and the epilogue, per GEMM phase, blocks 0 and 77, each consumer) on
# kimi-k2 and olmoe, bf16, fp8 and fp8 with fp8 weight gradients; then this tree's mok-fuzz --backend gpu
# for 100 s on a fresh seed, and synccheck over every launch mode of the fp8 weight gradients. And the
# per-row phase's two passes apart: kimi-k2 and olmoe with d topk_w's pass left out (.snapR1), then with
# the SwiGLU backward's (.snapR2): wrong results, their phase times only.
set -uo pipefail
out=${OUT:-/tmp/mok-out}
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: ${MOK_COMMIT:-unknown} (.snapT: + tile_clock.patch)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
rc_dir=$PWD/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
build() {  # tree, jobs, targets
  cmake -S "$1" -B "$1/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR="$rc_dir" && cmake --build "$1/build" -j"$2" --target ${@:3}
}
for r in R1 R2; do
  mkdir -p .snap$r && tar --exclude=./build --exclude='./.snap*' -cf - . | tar -xf - -C .snap$r
done
sed -i 's/^    expert_topk_weight_grad(pipe, p, cycle);$//' .snapR1/megakernel/src/backward.cu
sed -i 's/^    expert_row_grad<kFp8>(p, cycle);$//' .snapR2/megakernel/src/backward.cu
build .snapT 4 mok-bench > "$out/build_tile_clock.log" 2>&1 &
build .snapR1 3 mok-bench > /tmp/build_r1.log 2>&1 &
build .snapR2 3 mok-bench > /tmp/build_r2.log 2>&1 &
build . 6 mok_megakernel_tests mok-fuzz > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
wait || true
for b in .snapT .snapR1 .snapR2; do [ -x $b/build/megakernel/mok-bench ] || echo "$b not built" | tee -a "$out/summary.log"; done
tail -3 /tmp/build_r*.log > "$out/build_row_passes.log"

log "built"
# racecheck_probe.cu's further modes: uneven counts where every warpgroup passed some (17 3: warpgroup 0
# one, 1 and 2 three each; 24 2: 0 three, 1 and 2 two each), and bar.red.and (32 2).
nvcc -gencode=arch=compute_90a,code=sm_90a -maxrregcount=168 -lineinfo -o /tmp/rprobe docs/results/2026-12-03-h200-b/racecheck_probe.cu &&
  for args in "0 1" "1 1" "8 2" "17 3" "24 2" "32 2"; do
    timeout 60 compute-sanitizer --tool racecheck --print-limit 2 /tmp/rprobe $args > /tmp/r.log 2>&1
    echo "racecheck rc $? args $args: $(grep -E '^mode' /tmp/r.log) $(grep 'RACECHECK SUMMARY' /tmp/r.log)" | tee -a "$out/summary.log"
  done
for flags in "--shape kimi-k2" "--shape kimi-k2 --fp8" "--shape kimi-k2 --fp8 --fp8-weight-gradients" "--shape olmoe" "--shape olmoe --fp8"; do
  echo "== mok-bench $flags --runs 1 --warmup 0 --sets 1"
  timeout 60 .snapT/build/megakernel/mok-bench $flags --runs 1 --warmup 0 --sets 1
done > "$out/tile_clock.log" 2>&1
grep -E "^==|uniform  " "$out/tile_clock.log" | tee -a "$out/summary.log"
for flags in "--shape kimi-k2" "--shape olmoe"; do
  for b in build .snapR1/build .snapR2/build; do
    echo "== $b mok-bench $flags --runs 5"
    timeout 60 $b/megakernel/mok-bench $flags --runs 5
  done
done > "$out/row_passes.log" 2>&1
grep -E "^==|uniform  " "$out/row_passes.log" | tee -a "$out/summary.log"
grep "backward phases" "$out/row_passes.log" | sed 's/.*expert dy W2[^;]*;//' | tee -a "$out/summary.log"
seed=$(date +%s%N | cut -c7-16)
log "mok-fuzz --backend gpu --seed $seed --seconds 100"
timeout 150 build/fuzz/mok-fuzz --backend gpu --seed "$seed" --seconds 100 > "$out/fuzz_gpu.log" 2>&1
echo "mok-fuzz exit $?: $(tail -3 "$out/fuzz_gpu.log" | tr '\n' ' ')" | tee -a "$out/summary.log"
for tool in synccheck; do
  timeout 90 compute-sanitizer --tool $tool --error-exitcode 1 build/megakernel/tests/mok_megakernel_tests \
    --gtest_filter='Modes/Fp8WeightGradients.*:Gpu.Fp8WeightGradientsOfTinyDyMatchTheReference' > /tmp/san.log 2>&1
  echo "$tool rc $?: $(grep 'ERROR SUMMARY' /tmp/san.log | tail -1) $(grep -E '^\[  (PASSED|FAILED) ' /tmp/san.log | tr '\n' ' ')" | tee -a "$out/summary.log"
  { echo "== compute-sanitizer --tool $tool"; head -c 20000 /tmp/san.log; } >> "$out/sanitize.log"
done
log "done"
