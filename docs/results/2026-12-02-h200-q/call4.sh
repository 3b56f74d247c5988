#!/usr/bin/env bash
# call 4 (session 15): f02e288 + forward<> inlined by force (.snap; call 3's fp8 forward build had ptxas C7510,
# its wgmmas serialized) against 15790c4 (.snap0): the build logs' C7510 and spills; A/B mok-bench kimi-k2 bf16, fp8
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap), $(cat .snap0/COMMIT) (.snap0)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
for tree in .snap .snap0; do
  ( cd $root/$tree && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_FLAGS="-Xptxas -v" -Drapidcheck_DIR=$rc > "$out/build$tree.log" 2>&1 && cmake --build build -j8 --target mok-bench >> "$out/build$tree.log" 2>&1; echo "build $tree rc $?" >> "$out/summary.log" ) &
done
wait
log built
for tree in .snap .snap0; do echo "$tree C7510: $(grep -c C7510 "$out/build$tree.log")"; grep -E "Compiling entry|spill stores" "$out/build$tree.log" | grep -A1 -E "forward|backward" | grep -E "spill" | tr '\n' ' '; echo; done | tee -a "$out/summary.log"
for mode in "--fp8" ""; do
  for tree in .snap0 .snap; do
    echo "#### $tree mok-bench --shape kimi-k2 --runs 10 $mode" >> "$out/bench.log"
    ( cd $root/$tree && timeout 60 build/megakernel/mok-bench --shape kimi-k2 --runs 10 $mode >> "$out/bench.log" 2>&1; echo "bench $tree kimi-k2 $mode rc $?" >> "$out/summary.log" )
  done
done
log done
