#!/usr/bin/env bash
# Call 1: the whole check of session 28's landing tree (the K-block counts broadcast, every consumer thread
# releasing the stage): every GPU test and golden, racecheck / synccheck / memcheck over the fp8 forward,
# backward and weight gradients and the bf16 match tests, the PyTorch op's tests; then Nsight Compute's
# warp-stall sampling per SASS instruction on one kimi-k2 forward_fp8_kernel launch (the GEMM1 loop after
# the broadcast), mok-fp8-chain, mok-bench --fp8 --runs 3 on the six shapes and the GPU fuzzer, as time
# allows.
# Run: MOK_COMMIT=<hash> bash docs/results/2026-12-03-h200-g/call1.sh (device tool, carry .deps)
set -uo pipefail
start=$SECONDS
export MOK_TORCH_BUILD=1 MOK_SANITIZE_TOOLS="racecheck synccheck memcheck"
export MOK_SANITIZE_FILTER='Gpu.MatchesReference*:Gpu.Fp8ForwardMatchesReferenceBitForBit:Gpu.Fp8BackwardMatchesReferenceBitForBit:LayerApi.Bf16WeightGradients*:LayerApi.Fp8BackwardSectionsOverOneAnother*'
bash bench/h200_session.sh tests sanitize python
source bench/device_call.sh  # out, log
{ echo "#### mok-verify golden/data --backend gpu"; cat "$out/verify_gpu.log"; } >>"$out/gpu_tests.log" && rm "$out/verify_gpu.log"
log "ncu SourceCounters: kimi-k2 forward_fp8_kernel, first launch"
timeout 150 ncu --kernel-name regex:forward_fp8_kernel --launch-count 1 --section SourceCounters --section WarpStateStats \
  -o /tmp/megakernel -f build/megakernel/mok-bench --shape kimi-k2 --fp8 --runs 1 --warmup 0 --sets 1 >"$out/ncu_megakernel.log" 2>&1
echo "ncu exit $?" | tee -a "$out/summary.log"
timeout 60 ncu -i /tmp/megakernel.ncu-rep --page source --print-source sass --csv 2>&1 | gzip >"$out/megakernel_sass.csv.gz"
timeout 30 ncu -i /tmp/megakernel.ncu-rep --section WarpStateStats 2>&1 | tail -40 >>"$out/ncu_megakernel.log"
log "mok-fp8-chain 2000"
timeout 60 build/megakernel/mok-fp8-chain 2000 >/tmp/chain.log 2>&1
echo "fp8-chain exit $?: $(tail -2 /tmp/chain.log | tr '\n' ' ')" | tee -a "$out/summary.log"
{ echo "#### mok-fp8-chain 2000"; cat /tmp/chain.log; } >>"$out/bench.log"
for s in kimi-k2 glm-5 qwen3.5-397b deepseek-v4 qwen3-30b-a3b olmoe; do
  [ $((SECONDS - start)) -lt 470 ] || { log "out of time: no mok-bench $s"; continue; }
  log "mok-bench --shape $s --fp8 --runs 3"
  timeout 60 build/megakernel/mok-bench --shape "$s" --fp8 --runs 3 2>&1 | tee -a "$out/bench.log" | tail -1 >>"$out/summary.log"
done
left=$((540 - (SECONDS - start)))
if [ $left -gt 30 ]; then
  seed=$(date +%s%N | cut -c7-16)
  log "mok-fuzz --backend gpu --seed $seed --seconds $((left - 15))"
  build/fuzz/mok-fuzz --backend gpu --seed "$seed" --seconds $((left - 15)) >"$out/fuzz_gpu.log" 2>&1
  echo "mok-fuzz exit $?: $(tail -3 "$out/fuzz_gpu.log" | tr '\n' ' ')" | tee -a "$out/summary.log"
fi
rm -f "$out/build.log"
log "done"
