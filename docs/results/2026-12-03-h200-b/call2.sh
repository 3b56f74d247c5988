#!/usr/bin/env bash
# Call 2 (session 24): racecheck_probe.cu under racecheck in each mode: does racecheck report hazards in
# a correct __syncthreads pattern after uneven named barriers, a barrier.sync from two paths, or setmaxnreg?
set -uo pipefail
out=${OUT:-/tmp/mok-out}
{ echo "commit: $(git rev-parse --short HEAD 2>/dev/null) + racecheck_probe.cu"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; compute-sanitizer --version | tail -1; } | tee "$out/summary.log"
d=docs/results/2026-12-03-h200-b
nvcc -gencode=arch=compute_90a,code=sm_90a -maxrregcount=168 -lineinfo -o /tmp/rprobe $d/racecheck_probe.cu || exit 1
for args in "0 1" "1 1" "1 2" "1 5" "8 1" "8 3" "2 0" "4 0" "5 1" "6 0" "7 2"; do
  timeout 60 compute-sanitizer --tool racecheck --print-limit 3 /tmp/rprobe $args > /tmp/r.log 2>&1
  echo "racecheck rc $? args $args: $(grep -E '^mode' /tmp/r.log) $(grep 'RACECHECK SUMMARY' /tmp/r.log)" | tee -a "$out/summary.log"
  { echo "== racecheck_probe $args"; head -c 4000 /tmp/r.log; } >> "$out/probe.log"
done
timeout 60 compute-sanitizer --tool synccheck /tmp/rprobe 7 2 2>&1 | tail -2 | tee -a "$out/summary.log"
