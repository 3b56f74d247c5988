#!/usr/bin/env bash
# Call 3 (session 25): mok-fp8-chain's new fed variant (the megakernel's produce() and consume_fp8()
# over every tile of a 16384 x 4096 x 7168 E4M3 GEMM, no epilogue) beside the chain alone: is the fp8
# chain's gap in the megakernel (2,080-2,460 cycles a K-block against the chain's 1,120) the feed's or the
# kernel's? Then Nsight Compute on the chain and the fed kernels (pipes, shared memory), and the GPU
# fuzzer on this tree (b2a592d + the tool).
set -uo pipefail
out=${OUT:-/tmp/mok-out}
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: ${MOK_COMMIT:-unknown}"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
rc_dir=$PWD/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
{ cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR="$rc_dir" &&
  cmake --build build -j16 --target mok-fp8-chain mok-fuzz; } > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
log "built"
for pass in 1 2; do timeout 60 build/megakernel/mok-fp8-chain 20000; done 2>&1 | tee "$out/fp8_chain.log" >> "$out/summary.log"
log "ncu: the chain (resident operands) and fed"
timeout 200 ncu --kernel-name regex:'chain_kernel|fed_kernel' --launch-count 12 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
  build/megakernel/mok-fp8-chain 2000 > "$out/ncu.log" 2>&1
echo "ncu exit $?" | tee -a "$out/summary.log"
grep -E "^  [a-z_]+.*kernel|SM Busy|Compute \(SM\) Throughput|Memory Throughput|Duration|Shared Memory|L2 Cache Throughput|DRAM Throughput" "$out/ncu.log" | head -60 >> "$out/summary.log"
seed=$(date +%s%N | cut -c7-16)
log "mok-fuzz --backend gpu --seed $seed --seconds 100"
timeout 150 build/fuzz/mok-fuzz --backend gpu --seed "$seed" --seconds 100 > "$out/fuzz_gpu.log" 2>&1
echo "mok-fuzz exit $?: $(tail -3 "$out/fuzz_gpu.log" | tr '\n' ' ')" | tee -a "$out/summary.log"
log "done"
