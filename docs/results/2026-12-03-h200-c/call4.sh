#!/usr/bin/env bash
# Call 4 (session 25): call 3 found the megakernel's fp8 chain fed by its own produce() at 1,170 cycles a
# K-block (1,635 TFLOP/s) on one expert with every code 1.0, against 2,080-2,460 in the megakernel. Is it
# the data (random codes) or the weights' traffic (kimi-k2's GEMM1: 32 experts of 2048 rows, each its own
# 29 MB of W1)? mok-fp8-chain's fed variants, twice.
set -uo pipefail
out=${OUT:-/tmp/mok-out}
{ echo "commit: ${MOK_COMMIT:-unknown}"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
rc_dir=$PWD/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
{ cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR="$rc_dir" &&
  cmake --build build -j16 --target mok-fp8-chain; } > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
echo "== $(date -u +%T) built" | tee -a "$out/summary.log"
for pass in 1 2; do timeout 60 build/megakernel/mok-fp8-chain 20000; echo "rc $?"; done 2>&1 | tee "$out/fp8_chain.log" >> "$out/summary.log"
nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv >> "$out/summary.log"
