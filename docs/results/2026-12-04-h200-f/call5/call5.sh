#!/usr/bin/env bash
# Call 5: the landing tree's mok-bench beside bench/torch_baseline.py (uniform routing), kimi-k2 then
# olmoe, as bench/h200_session.sh's bench step runs them, with only mok-bench built (the session's
# device time was nearly spent).
#   MOK_COMMIT=<hash> bash docs/results/2026-12-04-h200-f/call5/call5.sh   (.deps carried)
set -uo pipefail
source bench/device_call.sh
call_header "mok-bench beside torch_baseline.py, uniform routing"
build_tree . 16 --target mok-bench >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
log "build ok"
for s in kimi-k2 olmoe; do
  log "mok-bench --shape $s --routing uniform"
  timeout 100 build/megakernel/mok-bench --shape "$s" --routing uniform 2>>"$out/bench.err" | tee -a "$out/bench.log" | tail -3
  log "torch baseline --shape $s --routing uniform"
  timeout 100 python3 bench/torch_baseline.py --shape "$s" --routing uniform 2>>"$out/bench.err" | tee -a "$out/bench.log" | tail -1
done
log done
