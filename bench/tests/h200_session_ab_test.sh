#!/usr/bin/env bash
# bench/h200_session.sh's `ab` step without a GPU: cmake, nvidia-smi, nvcc, python3 and both trees' mok-bench
# stubbed, so only the script's own logic runs. The runs alternate in MOK_AB_ORDER per shape, each tree runs its own
# build, the baseline builds only the A/B's tool (with the PyTorch op for an op A/B), and a missing baseline is said.
set -euo pipefail
script=$(cd "$(dirname "$0")/.." && pwd)/h200_session.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
mkdir -p bench stub base
cp "$script" bench/
echo base-commit >base/COMMIT
for tree in build base/build; do
  mkdir -p "$tree/megakernel"
  printf '#!/bin/sh\necho "$2 uniform %s $*"\n' "$tree" >"$tree/megakernel/mok-bench"
done
printf '#!/bin/sh\necho cmake "$@"\n' >stub/cmake
printf '#!/bin/sh\necho stub\n' >stub/nvidia-smi
cp stub/nvidia-smi stub/nvcc
printf '#!/bin/sh\necho "op_bench $* from $PYTHONPATH"\n' >stub/python3
chmod +x stub/* build/megakernel/mok-bench base/build/megakernel/mok-bench
run() { PATH="$work/stub:$PATH" OUT="$work/out" MOK_COMMIT=new-commit MOK_SHAPES="kimi-k2 olmoe" "$@" \
  bash bench/h200_session.sh ab >/dev/null; }
fail() { echo "FAIL: $*"; exit 1; }

run env MOK_BASELINE=base MOK_BENCH_ARGS="--runs 5"
got=$(grep -E '^####|uniform' out/ab.log | tr '\n' '|')
want=""
for s in kimi-k2 olmoe; do
  for t in B N B N; do
    [ $t = B ] && want+="#### B (base-commit) --shape $s|$s uniform base/build --shape $s --runs 5|"
    [ $t = N ] && want+="#### N (new-commit) --shape $s|$s uniform build --shape $s --runs 5|"
  done
done
[ "$got" = "$want" ] || fail "mok-bench A/B order: got $got"
grep -q -- "--build base/build -j4 --target mok-bench$" out/build_baseline.log || fail "baseline targets"

rm -rf out
run env MOK_BASELINE=base MOK_AB_TOOL=op MOK_AB_ORDER="N B" MOK_OP_ARGS="--kernel-times"
got=$(grep -v '^####' out/ab.log | tr '\n' '|')
want=""
for s in kimi-k2 olmoe; do
  want+="op_bench bench/op_bench.py --shape $s --kernel-times from ./build/python|"
  want+="op_bench bench/op_bench.py --shape $s --kernel-times from base/build/python|"
done
[ "$got" = "$want" ] || fail "op A/B order: got $got"
grep -q -- "-DMOK_TORCH=ON" out/build_baseline.log || fail "the baseline is not configured with the op"
grep -q -- "--target mok_torch$" out/build_baseline.log || fail "the baseline's op is not built"
grep -q -- "-DMOK_TORCH=ON" out/build.log || fail "this tree's op is not built"

rm -rf out
run env
grep -q "ab needs MOK_BASELINE" out/summary.log || fail "a missing baseline is not said"
echo "h200_session.sh ab: ok"
