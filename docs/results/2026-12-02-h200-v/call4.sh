#!/usr/bin/env bash
# call 4 (session 19): .snap (see COMMIT). The op beside torch's layer with one shared expert as wide as a routed
# one in both layers (op_bench --shared, new): bf16 with autograd's .grad, bf16 with the bf16 accumulate_into, fp8.
# DeepSeek-V3 and Kimi-K2 have one such; the tables so far ran without.
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
cd $root/.snap
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_TORCH=ON -DPython3_EXECUTABLE="$(command -v python3)" -Drapidcheck_DIR=$rc > /tmp/build.log 2>&1 && cmake --build build -j16 --target mok_torch >> /tmp/build.log 2>&1
echo "build rc $?" | tee -a "$out/summary.log"
log built
export PYTHONPATH=$PWD/build/python PYTHONUNBUFFERED=1
for mode in "" "--accumulate bf16" "--fp8"; do
  echo "#### op_bench.py --shape all --runs 10 --shared $mode" >> "$out/op_bench.log"
  timeout 100 python3 bench/op_bench.py --shape all --runs 10 --shared $mode >> "$out/op_bench.log" 2>&1; echo "op_bench all --shared $mode rc $?" | tee -a "$out/summary.log"
done
log done
