#!/usr/bin/env bash
# Call 5 (session 37): the bf16 reduce probe alone (bf16_reduce_probe.cu), for the next step: bf16 weight
# gradients added into the bf16 .grad by the TMA.
#   MOK_COMMIT=<hash> bash docs/results/2026-12-04-h200-g/call5/call5.sh
set -uo pipefail
source bench/device_call.sh
call_header "bf16 reduce probe"
nvcc -O2 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -I core/include \
  docs/results/2026-12-04-h200-g/call5/bf16_reduce_probe.cu -lcuda -o /tmp/bf16_reduce_probe &&
  /tmp/bf16_reduce_probe 2>&1 | tee -a "$out/summary.log"
log done
