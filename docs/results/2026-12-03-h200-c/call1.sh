#!/usr/bin/env bash
# Call 1 (session 25): completion turns in the FP8 chain (results/2026-12-03-h200-b/completion_turns.patch
# applied to 5eb8854: a consumer issues its half block only once the other's group has completed, so each
# promotes under the other's K-steps). Every GPU test and golden on this tree, then mok-bench against
# .snapB (5eb8854 as committed), runs alternating: kimi-k2 and olmoe fp8, kimi-k2 with fp8 weight
# gradients, kimi-k2 bf16 (unchanged code: the control); last, synccheck over the fp8 chains' tests.
set -uo pipefail
out=${OUT:-/tmp/mok-out}
rc_dir=$PWD/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
{ cmake -S .snapB -B .snapB/build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR="$rc_dir" &&
  cmake --build .snapB/build -j4 --target mok-bench; } > "$out/build_baseline.log" 2>&1 &
MOK_COMMIT=${MOK_COMMIT:-unknown} bash bench/h200_session.sh tests || exit 1
wait $! || { tail -20 "$out/build_baseline.log"; exit 1; }
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
echo "== $(date -u +%T) synccheck (fp8 chains)" | tee -a "$out/summary.log"
timeout 120 compute-sanitizer --tool synccheck --error-exitcode 1 build/megakernel/tests/mok_megakernel_tests \
  --gtest_filter='Gpu.Fp8ForwardMatchesReferenceBitForBit:Modes/Fp8WeightGradients.MatchTheReference/one_rank' > "$out/synccheck.log" 2>&1
echo "synccheck exit $?: $(grep 'ERROR SUMMARY' "$out/synccheck.log" | tail -1)" | tee -a "$out/summary.log"
echo "== $(date -u +%T) done" | tee -a "$out/summary.log"
