#!/usr/bin/env bash
# bench/h200_session.sh's `ab` step without a GPU: cmake, nvidia-smi, nvcc, python3 and both trees' mok-bench
# stubbed, so only the script's own logic runs. The runs alternate in MOK_AB_ORDER per shape, each tree runs its own
# build and is labelled by its own commit, a run's summary line is its own output (not an earlier run's), the
# baseline builds only the A/B's tool (with the PyTorch op for an op A/B), a missing, unbuildable or unbuilt
# baseline is said, a failed build stops the trees building beside it, summary.log holds the call's MOK_* settings, candidate trees (MOK_AB_TREES) run where their letters stand and one that does not build is
# left out, and with MOK_CALL_SECONDS neither a step nor an A/B run starts that would not end in time.
set -uo pipefail
script=$(cd "$(dirname "$0")/.." && pwd)/h200_session.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
mkdir -p bench stub base cand
cp "$script" "$(dirname "$script")/device_call.sh" bench/
echo base-commit >base/COMMIT
echo cand-commit >cand/COMMIT
touch base/CMakeLists.txt cand/CMakeLists.txt
for tree in build base/build cand/build; do
  mkdir -p "$tree/megakernel"
  printf '#!/bin/sh\necho "$2 uniform %s $*"\n' "$tree" >"$tree/megakernel/mok-bench"
done
# cmake fails on the source trees named in FAIL_TREES and sleeps on those in SLOW_TREES (a build in progress;
# its process id in slow.pid); a failing tree first waits for a slow one to have started, so that the failure
# meets a build in progress.
printf '#!/bin/sh\necho cmake "$@"\ncase " ${FAIL_TREES:-} " in *" $2 "*) [ -z "${SLOW_TREES:-}" ] || while [ ! -s "%s/slow.pid" ]; do sleep 0.1; done; exit 2 ;; esac\ncase " ${SLOW_TREES:-} " in *" $2 "*) echo $$ >"%s/slow.pid"; exec sleep 57 ;; esac\nexit 0\n' "$work" "$work" >stub/cmake
printf '#!/bin/sh\necho stub\n' >stub/nvidia-smi
cp stub/nvidia-smi stub/nvcc
printf '#!/bin/sh\necho "op_bench $* from $PYTHONPATH"\n' >stub/python3
chmod +x stub/* build/megakernel/mok-bench base/build/megakernel/mok-bench cand/build/megakernel/mok-bench
# The session script with this run's settings only (none inherited from the caller's environment).
run() {
  rm -rf out
  env -u MOK_BASELINE -u MOK_AB_TREES -u MOK_AB_TOOL -u MOK_AB_ORDER -u MOK_TORCH_BUILD -u MOK_BENCH_ARGS -u MOK_OP_ARGS \
    -u MOK_CALL_SECONDS -u MOK_AB_FLAGS \
    PATH="$work/stub:$PATH" OUT="$work/out" MOK_COMMIT=new-commit MOK_SHAPES="kimi-k2 olmoe" "$@" \
    bash bench/h200_session.sh ab >/dev/null
}
fail() {
  echo "FAIL: $*"
  exit 1
}
# The A/B's mok-bench runs as ab.log holds them: each run's header and the stub's line, joined by '|'.
bench_runs() { grep -E '^####|uniform' out/ab.log | tr '\n' '|'; }

run MOK_BASELINE=base MOK_BENCH_ARGS="--runs 5" || fail "the session script failed"
got=$(bench_runs)
want=""
for s in kimi-k2 olmoe; do
  for t in B N B N; do
    [ $t = B ] && want+="#### B (base-commit) --shape $s|$s uniform base/build --shape $s --runs 5|"
    [ $t = N ] && want+="#### N (new-commit) --shape $s|$s uniform build --shape $s --runs 5|"
  done
done
[ "$got" = "$want" ] || fail "mok-bench A/B order: got $got"
grep -q -- "--build base/build -j4 --target mok-bench$" out/build_B.log || fail "baseline targets"
grep -q -- "-DMOK_TORCH=ON" out/build_B.log out/build.log && fail "the op is built for a mok-bench A/B"
grep -q "^env: MOK_BENCH_ARGS=--runs 5$" out/summary.log || fail "the call's settings are not in summary.log"
grep -q "^env: MOK_COMMIT" out/summary.log && fail "MOK_COMMIT is said twice in summary.log"

# A candidate tree C beside the baseline: built as the baseline is, run where C stands, labelled by its commit.
run MOK_BASELINE=base MOK_AB_TREES="C=cand" MOK_AB_ORDER="B N C" || fail "the session script failed"
got=$(grep -E '^####' out/ab.log | tr '\n' '|')
want=""
for s in kimi-k2 olmoe; do
  want+="#### B (base-commit) --shape $s|#### N (new-commit) --shape $s|#### C (cand-commit) --shape $s|"
done
[ "$got" = "$want" ] || fail "A/B with a candidate tree: got $got"
grep -q "^ab olmoe C exit 0: olmoe uniform cand/build --shape olmoe$" out/summary.log ||
  fail "the candidate's summary line: $(grep '^ab' out/summary.log)"
grep -q -- "--build cand/build -j4 --target mok-bench$" out/build_C.log || fail "candidate targets"
# One that does not build is left out, and said; the others run.
run MOK_BASELINE=base MOK_AB_TREES="C=cand" MOK_AB_ORDER="B C" FAIL_TREES=cand || fail "the session script failed"
grep -q "A/B tree C's build failed" out/summary.log || fail "a failed candidate build is not said"
grep -q "MOK_AB_ORDER: C is neither N, F nor a built A/B tree" out/summary.log || fail "an unbuilt candidate ran"
[ "$(grep -c '^#### B' out/ab.log)" -eq 2 ] || fail "the baseline did not run beside a failed candidate"
# F: this tree with MOK_AB_FLAGS added, beside it without them; no baseline is needed where B does not run.
run MOK_AB_FLAGS="--paired-blocks" MOK_AB_ORDER="N F" MOK_BENCH_ARGS="--runs 5" || fail "the session script failed"
got=$(bench_runs)
want=""
for s in kimi-k2 olmoe; do
  want+="#### N (new-commit) --shape $s|$s uniform build --shape $s --runs 5|"
  want+="#### F (new-commit --paired-blocks) --shape $s|$s uniform build --shape $s --runs 5 --paired-blocks|"
done
[ "$got" = "$want" ] || fail "A/B of this tree's flags: got $got"
grep -q "ab needs MOK_BASELINE" out/summary.log && fail "an A/B without B asked for a baseline"
run MOK_BASELINE=base MOK_AB_TREES="F=cand" && fail "a candidate named F did not stop the call"
run MOK_BASELINE=base MOK_AB_TREES="N=cand" && fail "a candidate named N did not stop the call"
grep -q "MOK_AB_TREES: N=cand is not LETTER=DIR" out/summary.log || fail "a candidate named N is not said"
run MOK_BASELINE=base MOK_AB_TREES="C=nowhere" && fail "a missing candidate tree did not stop the call"
grep -q "MOK_AB_TREES: C=nowhere is not a source tree" out/summary.log || fail "a missing candidate tree is not said"

# Per precision: each shape's bf16 and fp8 runs, fp8 adding --fp8 to the arguments; an unknown one is said.
run MOK_BASELINE=base MOK_AB_PRECISIONS="fp8 bf16 fp4" MOK_AB_ORDER="B N" MOK_BENCH_ARGS="--runs 5" ||
  fail "the session script failed"
got=$(bench_runs)
want=""
for s in kimi-k2 olmoe; do
  want+="#### B (base-commit) --shape $s --fp8|$s uniform base/build --shape $s --runs 5 --fp8|"
  want+="#### N (new-commit) --shape $s --fp8|$s uniform build --shape $s --runs 5 --fp8|"
  want+="#### B (base-commit) --shape $s|$s uniform base/build --shape $s --runs 5|"
  want+="#### N (new-commit) --shape $s|$s uniform build --shape $s --runs 5|"
done
[ "$got" = "$want" ] || fail "mok-bench A/B per precision: got $got"
grep -q "^ab olmoe fp8 N exit 0: olmoe uniform build --shape olmoe --runs 5 --fp8$" out/summary.log ||
  fail "a precision's summary line: $(grep '^ab' out/summary.log)"
grep -q "MOK_AB_PRECISIONS: fp4 is neither bf16 nor fp8" out/summary.log || fail "an unknown precision is not said"

# A baseline run that prints nothing: its summary line has no result, not the other tree's.
printf '#!/bin/sh\nexit 3\n' >base/build/megakernel/mok-bench
run MOK_BASELINE=base MOK_AB_ORDER="N B" || fail "the session script failed"
grep -q "^ab kimi-k2 B exit 3: $" out/summary.log || fail "a failed run's summary: $(grep '^ab' out/summary.log)"
rm base/COMMIT  # labelled by its path, not by this tree's commit
run MOK_BASELINE=base MOK_AB_ORDER="B" || fail "the session script failed"
grep -q "^#### B (base) --shape kimi-k2$" out/ab.log || fail "the baseline's label: $(grep '^####' out/ab.log)"

run MOK_BASELINE=base MOK_AB_TOOL=op MOK_AB_ORDER="N B" MOK_OP_ARGS="--kernel-times" || fail "the session script failed"
got=$(grep -v '^####' out/ab.log | tr '\n' '|')
want=""
for s in kimi-k2 olmoe; do
  want+="op_bench bench/op_bench.py --shape $s --kernel-times from ./build/python|"
  want+="op_bench bench/op_bench.py --shape $s --kernel-times from base/build/python|"
done
[ "$got" = "$want" ] || fail "op A/B order: got $got"
grep -q -- "-DMOK_TORCH=ON" out/build_B.log || fail "the baseline is not configured with the op"
grep -q -- "--target mok_torch$" out/build_B.log || fail "the baseline's op is not built"
grep -q -- "-DMOK_TORCH=ON" out/build.log || fail "this tree's op is not built"

run MOK_BASELINE=base FAIL_TREES=base || fail "a failed baseline build stopped the other steps"
grep -q "A/B tree B's build failed" out/summary.log || fail "a failed baseline build is not said"
grep -q "ab needs MOK_BASELINE" out/summary.log || fail "ab ran without a built baseline"

# This tree's build failing stops the call and the trees still building beside it (no cmake left running).
start=$SECONDS
rm -f slow.pid
run MOK_BASELINE=base FAIL_TREES=. SLOW_TREES=base && fail "a failed build did not stop the call"
[ -s slow.pid ] || fail "the baseline's slow build never started"
[ $((SECONDS - start)) -lt 30 ] || fail "the call waited for the baseline's build"
# Alive: neither gone nor a zombie (killed, not yet reaped), given half a second a try to die after its SIGTERM.
alive() { [[ $(ps -o stat= -p "$1" 2>/dev/null) == [^Z]* ]]; }
for _ in 1 2 3 4 5 6; do alive "$(cat slow.pid)" || break; sleep 0.5; done
alive "$(cat slow.pid)" && fail "the baseline's build was left running"

run MOK_BASELINE=no-such-tree && fail "a missing baseline tree did not stop the call"
grep -q "MOK_BASELINE=no-such-tree is not a source tree" out/summary.log || fail "a missing baseline tree is not said"
run || fail "the session script failed"
grep -q "ab needs MOK_BASELINE" out/summary.log || fail "a missing baseline is not said"

# MOK_CALL_SECONDS: a step that would not end within it is not started, nor is an A/B run; each is said.
run MOK_BASELINE=base MOK_CALL_SECONDS=1 || fail "the session script failed"
grep -q "^out of time: no ab (" out/summary.log || fail "a step past the limit is not said: $(cat out/summary.log)"
[ -e out/ab.log ] && fail "a step past the limit ran"
printf '#!/bin/sh\nsleep 2\necho "$2 uniform"\n' >build/megakernel/mok-bench  # 2 s a run; a run wants 20 left
run MOK_BASELINE=base MOK_CALL_SECONDS=23 || fail "the session script failed"
ran=$(grep -c '^####' out/ab.log) said=$(grep -c '^out of time: no ab .* [BN] (' out/summary.log)
[ "$ran" -ge 1 ] && [ "$said" -ge 1 ] && [ $((ran + said)) -eq 8 ] ||
  fail "A/B runs past the limit: $ran ran, $said said out of time, of 8"
echo "h200_session.sh ab: ok"
