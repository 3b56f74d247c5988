#!/usr/bin/env bash
# Call 1 (session 38): the GPU tests and goldens on 3deb189 (bf16 weight gradients stored by TMA, with
# 2a1e82c and 8f6f5a7 not run before), the op's A/B against bf58f4e (autograd's bf16 .grad: the path
# the change moves) on kimi-k2 and olmoe, the op's tests if time allows, and session 37's bf16 reduce
# probe (is the TMA's bf16 reduce-add autograd's add?), run while the trees build.
#   MOK_COMMIT=<hash> bash docs/results/2026-12-04-h200-h/call1/call1.sh
set -uo pipefail
source bench/device_call.sh
probe=docs/results/2026-12-04-h200-g/call5/bf16_reduce_probe.cu
{ nvcc -O2 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -I core/include "$probe" -lcuda -o /tmp/bf16_reduce_probe &&
  /tmp/bf16_reduce_probe; echo "probe exit $?"; } >/tmp/probe.log 2>&1 &
probe_pid=$!
MOK_CALL_SECONDS=${MOK_CALL_SECONDS:-560} MOK_BASELINE=.snapB MOK_AB_TOOL=op MOK_SHAPES="kimi-k2 olmoe" \
  bash bench/h200_session.sh tests ab python
wait "$probe_pid"
{ echo "== bf16 reduce probe ($probe)"; cat /tmp/probe.log; } >>"$out/summary.log"
# The device tool returns at most 8 files: the build logs go when the builds passed.
grep -q "baseline build ok" "$out/summary.log" && rm -f "$out/build_baseline.log"
grep -q "build ok" "$out/summary.log" && rm -f "$out/build.log"
