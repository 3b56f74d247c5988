#!/usr/bin/env bash
# Call 1: where do the megakernel's fp8 GEMM1 consumers stall, against the fed chain's? Nsight Compute's
# warp-stall sampling per SASS instruction (SourceCounters) on one forward_fp8_kernel launch of mok-bench
# kimi-k2 --fp8 (and forward_kernel without --fp8) and on fed-kimi-k2's first fed_kernel launch of mok-fp8-chain, exported as CSV (gzip).
# Run: MOK_COMMIT=<hash> bash docs/results/2026-12-03-h200-e/call1.sh (device tool, carry .deps)
set -uo pipefail
source bench/device_call.sh  # out, build_tree
call_header "steps: ncu SourceCounters on the fp8 GEMM loops (megakernel, fed) and bf16 forward; A/B kStages 3 (B) vs 4 (N)"
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
profile megakernel_bf16 forward_kernel 0 build/megakernel/mok-bench --shape kimi-k2 --runs 1 --warmup 0 --sets 1
ls -la "$out" | tee -a "$out/summary.log"
# Then what three pipeline stages cost against four (the room a half tile's staging would take): a copy of
# the tree with kStages = 3 (B) against it (N), B N B N, mok-bench --runs 5 on kimi-k2 and olmoe, bf16
# and fp8.
mkdir -p .snapS
tar --exclude=./build --exclude='./.snap*' --exclude=./.git -cf - . | tar -xf - -C .snapS
sed -i 's/inline constexpr int kStages = 4;/inline constexpr int kStages = 3;/' .snapS/megakernel/src/gemm_geometry.cuh
grep -n "kStages = " .snapS/megakernel/src/gemm_geometry.cuh | tee -a "$out/summary.log"
build_tree .snapS 16 --target mok-bench > "$out/build_s.log" 2>&1 || { tail -30 "$out/build_s.log"; exit 1; }
rm -f "$out/build_s.log"
for shape in kimi-k2 olmoe; do
  for mode in "" --fp8; do
    for tree in B N B N; do
      dir=.; [ $tree = B ] && dir=.snapS
      timeout 120 "$dir/build/megakernel/mok-bench" --shape $shape --runs 5 $mode > "$out/ab.run" 2>&1
      { echo "#### $tree ($dir) --shape $shape $mode exit $?"; cat "$out/ab.run"; } >> "$out/ab_stages.log"
      echo "ab $shape $mode $tree: $(awk -v s=$shape '$1 == s' "$out/ab.run" | tail -1)" | tee -a "$out/summary.log"
    done
  done
done
rm -f "$out/ab.run"
