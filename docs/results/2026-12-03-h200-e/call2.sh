#!/usr/bin/env bash
# Call 2: where do the megakernel's fp8 GEMM1 consumers stall, against the fed chain's? Nsight Compute's
# warp-stall sampling per SASS instruction (SourceCounters) on one forward_fp8_kernel launch of mok-bench
# kimi-k2 --fp8 and on fed-kimi-k2's first fed_kernel launch of mok-fp8-chain, exported as CSV (gzip).
# Run: MOK_COMMIT=<hash> bash docs/results/2026-12-03-h200-e/call2.sh (device tool, carry .deps)
set -uo pipefail
source bench/device_call.sh  # out, build_tree
call_header "steps: ncu SourceCounters on the fp8 GEMM loops (fed, megakernel)"
build_tree . 16 --target mok-bench mok-fp8-chain > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
rm -f "$out/build.log"
profile() {  # name, kernel regex, launches to skip, command...
  local name=$1 kernel=$2 skip=$3
  shift 3
  timeout 150 ncu --kernel-name "regex:$kernel" --launch-skip "$skip" --launch-count 1 --section SourceCounters \
    --section WarpStateStats -o "$out/$name" -f "$@" > "$out/ncu_$name.log" 2>&1
  echo "ncu $name exit $?" | tee -a "$out/summary.log"
  timeout 60 ncu -i "$out/$name.ncu-rep" --page source --print-source sass --csv 2>&1 | gzip > "$out/${name}_sass.csv.gz"
  timeout 30 ncu -i "$out/$name.ncu-rep" --section WarpStateStats 2>&1 | tail -40 >> "$out/ncu_$name.log"
  rm -f "$out/$name.ncu-rep"
}
profile fed fed_kernel 4 build/megakernel/mok-fp8-chain 2000
profile megakernel forward_fp8_kernel 0 build/megakernel/mok-bench --shape kimi-k2 --fp8 --runs 1 --warmup 0 --sets 1
ls -la "$out" | tee -a "$out/summary.log"
