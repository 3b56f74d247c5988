#!/usr/bin/env bash
# Call 2. (1) A from registers in the fp8 chain (Fp8A::registers: ldmatrix once a K-block for both halves,
# a sixth less shared-memory traffic): mok-fp8-chain's fed-kimi-k2 against fed-kimi-k2-a-regs; .snapR (this
# tree with kFp8A = registers) bit for bit (ctest -L gpu, goldens) and mok-bench B N B N against this tree.
# (2) Does the megakernel's fp8 chain (1,749 cycles a K-block in GEMM1, call 1, against 1,440 fed alone)
# lose cycles to the epilogue beside it? The tile clock (.snapT: tile_clock_mhz.patch) against the tile
# clock with the ring phases' epilogues left out (.snapE: no_ring_epilogue.patch, every accumulator read).
# Run: MOK_COMMIT=<hash> bash docs/results/2026-12-03-h200-d/call2.sh (device tool, carry .deps)
set -uo pipefail
source bench/device_call.sh  # out, build_tree
call_header "steps: A from registers (fed chain, tests, A/B); tile clock with and without the ring epilogues"
for v in R T E; do rm -rf .snap$v && mkdir .snap$v && git ls-files -z | xargs -0 tar -cf - | tar -x -C .snap$v || exit 1; done
sed -i 's/inline constexpr Fp8A kFp8A = Fp8A::shared;/inline constexpr Fp8A kFp8A = Fp8A::registers;/' \
  .snapR/megakernel/src/tile_gemm.cuh && grep -q "kFp8A = Fp8A::registers" .snapR/megakernel/src/tile_gemm.cuh &&
  git apply --directory=.snapT docs/results/2026-12-03-h200-c/tile_clock_mhz.patch &&
  git apply --directory=.snapE docs/results/2026-12-03-h200-c/tile_clock_mhz.patch &&
  git apply --directory=.snapE docs/results/2026-12-03-h200-d/no_ring_epilogue.patch || exit 1
build_tree . 4 --target mok-bench mok-fp8-chain > "$out/build_main.log" 2>&1 &
build_tree .snapR 6 > "$out/build_R.log" 2>&1 &
for v in T E; do build_tree .snap$v 3 --target mok-bench > "$out/build_$v.log" 2>&1 & done
wait
for f in build/megakernel/mok-fp8-chain .snapR/build/megakernel/mok-bench .snapT/build/megakernel/mok-bench \
  .snapE/build/megakernel/mok-bench; do [ -x $f ] || { echo "missing $f"; tail -30 "$out"/build_*.log; exit 1; }; done
rm -f "$out"/build_*.log
timeout 60 build/megakernel/mok-fp8-chain 20000 2>&1 | tee "$out/fp8_chain.log" | grep fed-kimi >> "$out/summary.log"
log "ctest -L gpu in .snapR"
(cd .snapR/build && timeout 200 ctest -L gpu --output-on-failure > "$out/gpu_tests_R.log" 2>&1)
echo "ctest exit $?: $(grep -E 'tests passed' "$out/gpu_tests_R.log")" | tee -a "$out/summary.log"
timeout 60 .snapR/build/verify/mok-verify --backend gpu golden/data > "$out/verify_R.log" 2>&1
echo "mok-verify exit $?: $(tail -1 "$out/verify_R.log")" | tee -a "$out/summary.log"
for pass in 1 2; do
  for args in "kimi-k2 --fp8" "olmoe --fp8"; do
    for v in main R; do
      bin=build/megakernel/mok-bench; [ $v = R ] && bin=.snapR/build/megakernel/mok-bench
      echo "== pass $pass $v: $args"
      timeout 60 $bin --shape $args --runs 5
    done
  done
done > "$out/a_regs_ab.log" 2>&1
grep -E "^==|uniform  |GEMM1|forward phases" "$out/a_regs_ab.log" | tee -a "$out/summary.log"
for args in "kimi-k2 --fp8" "kimi-k2" "olmoe --fp8"; do
  for v in T E; do
    echo "== $v: $args"
    timeout 60 .snap$v/build/megakernel/mok-bench --shape $args --runs 1 --warmup 0 --sets 1
  done
done > "$out/tile_clock_epilogue.log" 2>&1
grep -E "^==|TILECLK phase [89] .*block 0 wg 1|uniform  " "$out/tile_clock_epilogue.log" | tee -a "$out/summary.log"
