#!/usr/bin/env bash
# Call 2 (session 25): the FP8 half blocks' first K-step without C (wgmma scale-d = 0), so the 64
# partials are no longer zeroed by 64 moves before every half block (ptxas had folded that in 7 of
# forward_fp8_kernel's 32 groups, not in GEMM1's loop); and the op's layer cache keyed on the packed
# launch list (pack_launch). This tree with the PyTorch extension: every GPU test and golden, the Python
# tests; then mok-bench against .snapB (5eb8854), runs alternating, and mok-fp8-chain (the chain alone)
# on both.
set -uo pipefail
out=${OUT:-/tmp/mok-out}
rc_dir=$PWD/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
{ cmake -S .snapB -B .snapB/build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR="$rc_dir" &&
  cmake --build .snapB/build -j4 --target mok-bench mok-fp8-chain; } > "$out/build_baseline.log" 2>&1 &
MOK_COMMIT=${MOK_COMMIT:-unknown} MOK_TORCH_BUILD=1 bash bench/h200_session.sh tests python || exit 1
wait $! || { tail -20 "$out/build_baseline.log"; exit 1; }
run() {  # who (B: .snapB, N: this tree), flags
  local bin=build/megakernel/mok-bench
  [ "$1" = B ] && bin=.snapB/build/megakernel/mok-bench
  echo "== $*"
  timeout 60 $bin "${@:2}" --runs 5
}
{
  for who in B N B N; do run $who --shape kimi-k2 --fp8; done
  for who in B N B N; do run $who --shape olmoe --fp8; done
  for who in B N; do run $who --shape kimi-k2 --fp8 --fp8-weight-gradients; done
  for who in B N; do run $who --shape kimi-k2; done
} > "$out/scale_d_ab.log" 2>&1
grep -E "^==|uniform  " "$out/scale_d_ab.log" | tee -a "$out/summary.log"
grep -E "forward phases" "$out/scale_d_ab.log" | sed 's/.*layout place[^;]*;//' | tee -a "$out/summary.log"
grep -E "backward phases" "$out/scale_d_ab.log" | sed 's/.*tile table[^;]*;//' | tee -a "$out/summary.log"
for who in B N; do
  bin=build/megakernel/mok-fp8-chain
  [ $who = B ] && bin=.snapB/build/megakernel/mok-fp8-chain
  echo "== $who mok-fp8-chain 20000"; timeout 60 $bin 20000
done 2>&1 | tee "$out/fp8_chain.log" >> "$out/summary.log"
echo "== $(date -u +%T) done" | tee -a "$out/summary.log"
