#!/usr/bin/env bash
# call 1 (session 13): main (.snap) GPU tests, goldens, the op's GPU tests; main against .snapW (only warp 0 of the
# producer warpgroup walks the tile list) bf16 all shapes and fp8 kimi-k2/olmoe; .snapclk: clock64 per K-block
# phase of the consumers (fp8 and bf16), one forward each (diagnostic, printf)
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: $(cat .snap/COMMIT) (.snap); .snapW = it with warps 1-3 of the producer not walking tiles; .snapclk = it with tile clocks"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
( cd .snap && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_TORCH=ON -DPython3_EXECUTABLE="$(command -v python3)" -Drapidcheck_DIR=$rc > "$out/build.log" 2>&1 && cmake --build build -j10 >> "$out/build.log" 2>&1; echo "build .snap rc $?: $(grep -c C7510 "$out/build.log") C7510" | tee -a "$out/summary.log" ) &
for t in .snapW .snapclk; do
( cd $t && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$rc > "$out/build$t.log" 2>&1 && cmake --build build -j3 --target mok-bench >> "$out/build$t.log" 2>&1; echo "build $t rc $?: $(grep -c C7510 "$out/build$t.log") C7510" | tee -a "$out/summary.log" ) &
done
wait
log built
cd "$root/.snapclk"
for a in "--shape kimi-k2 --fp8" "--shape kimi-k2" "--shape olmoe --fp8" "--shape olmoe"; do
  echo "#### mok-bench $a --runs 1" >> "$out/tile_clock.log"
  timeout 60 build/megakernel/mok-bench $a --runs 1 > "$out/clk.tmp" 2>&1; echo "clk $a rc $?" | tee -a "$out/summary.log"
  grep -v TILECLK "$out/clk.tmp" >> "$out/tile_clock.log"; grep TILECLK "$out/clk.tmp" | head -40 >> "$out/tile_clock.log"; rm -f "$out/clk.tmp"
done
log "clocks done"
cd "$root/.snap"
ctest --test-dir build -L gpu --output-on-failure --timeout 120 > "$out/gpu_tests.log" 2>&1
echo "ctest -L gpu rc $?: $(grep -E 'tests passed|tests failed' "$out/gpu_tests.log")" | tee -a "$out/summary.log"
grep -E "\*\*\*Failed|Timeout|Not Run" "$out/gpu_tests.log" | head -20 | tee -a "$out/summary.log"
timeout 150 build/verify/mok-verify golden/data --backend gpu > "$out/verify.log" 2>&1
echo "verify rc $?: $(grep -cE '^EQUAL' "$out/verify.log") EQUAL, $(grep -cE '^(MISMATCH|ERROR)' "$out/verify.log") MISMATCH/ERROR" | tee -a "$out/summary.log"
( cd python/tests && PYTHONPATH=$PWD/../../build/python MOK_GOLDEN_DIR=$PWD/../../golden/data timeout 200 python3 -m pytest -q test_cuda.py test_errors.py > "$out/pytest.log" 2>&1; echo "pytest rc $?: $(tail -1 "$out/pytest.log")" | tee -a "$out/summary.log" )
log "tests done"
for t in .snap .snapW; do
  echo "#### $t mok-bench --shape all --runs 10" >> "$out/bench.log"
  timeout 120 "$root/$t/build/megakernel/mok-bench" --shape all --runs 10 >> "$out/bench.log" 2>&1; echo "bench bf16 $t rc $?" | tee -a "$out/summary.log"
done
for shape in kimi-k2 olmoe; do for t in .snap .snapW; do
  echo "#### $t mok-bench --shape $shape --runs 10 --fp8" >> "$out/bench.log"
  timeout 60 "$root/$t/build/megakernel/mok-bench" --shape $shape --runs 10 --fp8 >> "$out/bench.log" 2>&1; echo "bench fp8 $shape $t rc $?" | tee -a "$out/summary.log"
done; done
log done
