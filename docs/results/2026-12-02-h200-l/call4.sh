#!/usr/bin/env bash
# call 4 (session 14): main: mok-bench fp8 and bf16 on all six shapes, and the torch baseline with its fp8 GEMMs,
# side by side in one call (uniform routing)
set -uo pipefail
out=$OUT; root=$PWD; t0=$(date +%s)
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
cd .snap
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$rc > "$out/build.log" 2>&1 && cmake --build build -j16 --target mok-bench >> "$out/build.log" 2>&1
echo "build rc $?" | tee -a "$out/summary.log"
log built
timeout 170 build/megakernel/mok-bench --shape all --runs 10 --fp8 > "$out/mok_fp8.log" 2>&1; echo "mok fp8 rc $?" | tee -a "$out/summary.log"
log "fp8 done"
timeout 170 build/megakernel/mok-bench --shape all --runs 10 > "$out/mok_bf16.log" 2>&1; echo "mok bf16 rc $?" | tee -a "$out/summary.log"
log "bf16 done"
left=$(( 585 - ($(date +%s) - t0) ))
( cd bench && PYTHONUNBUFFERED=1 timeout $left python3 torch_baseline.py --fp8 --routing uniform --runs 10 > "$out/torch_fp8.log" 2>&1; echo "torch rc $? (limit ${left}s)" | tee -a "$out/summary.log" )
log done
