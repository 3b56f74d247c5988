#!/usr/bin/env bash
# Session 68, call 5: DeepGEMM's segfault (call 3) narrowed: its JIT's own trace (DG_JIT_DEBUG), a native backtrace
# (segvbt.c, preloaded), NVCC against NVRTC; then kimi-k2 and olmoe, mok-bench bf16 and fp8 beside
# bench/torch_baseline.py --fp8 (torch's fp8 grouped GEMMs alone); DeepGEMM's GEMMs on both where NVRTC ran.
#   bash docs/results/2026-12-07-h100-d/call5/call5.sh   # carry .deps (with .deps/deepgemm)
set -uo pipefail
source bench/device_call.sh
here=docs/results/2026-12-07-h100-d
dg=$here/call3/deepgemm_baseline.py
call_header "call 5: DeepGEMM's segfault narrowed; kimi-k2 and olmoe, mok fp8 beside torch's fp8 GEMMs"
(build_tree . 8 --target mok-bench >"$out/build.log" 2>&1; echo $? >"$out/build.rc") &
builder=$!
gcc -O1 -g -fPIC -shared -o /tmp/libsegvbt.so "$here/call5/segvbt.c" -ldl || log "segvbt did not build"
log "DeepGEMM build"
timeout 100 python3 "$dg" --build-only >"$out/deepgemm_build.log" 2>&1
echo "DeepGEMM build exit $?" | tee -a "$out/summary.log"
nvrtc_ok=1
for nvrtc in 0 1; do
  log "DeepGEMM olmoe fp8, DG_JIT_USE_NVRTC=$nvrtc, DG_JIT_DEBUG=1, segvbt"
  DG_JIT_USE_NVRTC=$nvrtc DG_JIT_DEBUG=1 LD_PRELOAD=/tmp/libsegvbt.so timeout 45 stdbuf -oL -eL \
    python3 "$dg" --shapes olmoe --precisions fp8 --jit-workers 0 --no-dense --time-budget 30 >"$out/deepgemm_nvrtc$nvrtc.log" 2>&1
  status=$?
  echo "DeepGEMM DG_JIT_USE_NVRTC=$nvrtc exit $status" | tee -a "$out/summary.log"
  [ "$nvrtc" = 1 ] && nvrtc_ok=$status
  grep -E "segvbt|pc in|NVCC|NVRTC|Loading|Launch|Error|error" "$out/deepgemm_nvrtc$nvrtc.log" | head -12
done
wait "$builder"
log "mok-bench build exit $(cat "$out/build.rc")"
for s in kimi-k2 olmoe; do
  for precision in bf16 fp8; do
    args=()
    [ "$precision" = fp8 ] && args=(--fp8)
    timeout 40 build/megakernel/mok-bench --shape "$s" --runs 5 "${args[@]}" >>"$out/bench.log" 2>&1
    grep -E "^$s " "$out/bench.log" | tail -1 | sed "s/^/$precision /" | tee -a "$out/summary.log"
  done
  log "torch_baseline --shape $s --fp8"
  timeout 45 python3 bench/torch_baseline.py --shape "$s" --runs 20 --fp8 >>"$out/bench.log" 2>&1
  grep -E "^(fp8 )?$s " "$out/bench.log" | tail -2 | tee -a "$out/summary.log"
done
if [ "$nvrtc_ok" = 0 ] && [ "$SECONDS" -lt 200 ]; then
  log "DeepGEMM kimi-k2 and olmoe, NVRTC"
  DG_JIT_USE_NVRTC=1 timeout 70 python3 "$dg" --shapes kimi-k2,olmoe --time-budget 55 >"$out/deepgemm.log" 2>&1
  echo "DeepGEMM exit $?" | tee -a "$out/summary.log"
  tail -14 "$out/deepgemm.log"
fi
log "done"
