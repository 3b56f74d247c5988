#!/usr/bin/env bash
# One device call on the H200 (the device tool runs it in the repo root; logs go to $OUT):
# build with the carried rapidcheck, GPU tests, tensor-core model validation, memcheck, every golden
# through the GPU backend, a GPU fuzz run, and the kernel timings beside the PyTorch baseline.
#   MOK_COMMIT=<hash> bash bench/h200_session.sh [fuzz_seconds=240] [bench_shapes="olmoe kimi-k2"]
set -uo pipefail
out=${OUT:-/tmp/mok-out}
mkdir -p "$out"
fuzz_seconds=${1:-240}
shapes=${2:-olmoe kimi-k2}
log() { echo "== $*" | tee -a "$out/summary.log"; }
{
  echo "commit: ${MOK_COMMIT:-unknown}"
  echo "date: $(date -u +%FT%TZ)"
  echo "device: $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader)"
  echo "nvcc: $(nvcc --version | tail -1)"
} | tee "$out/summary.log"

rc_dir=.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR="$PWD/$rc_dir" >/tmp/build.log 2>&1 &&
  cmake --build build -j16 >>/tmp/build.log 2>&1 || { tail -40 /tmp/build.log; exit 1; }
log "build ok"

log "ctest -L gpu"
ctest --test-dir build -L gpu --output-on-failure 2>&1 | tee "$out/gpu_tests.log" | tail -5
log "mok-tc-validate 1e8 (mma.sync) and 1e8 (wgmma)"
build/megakernel/mok-tc-validate 1e8 2>&1 | tee "$out/tc_validate.log" | tail -1
build/megakernel/mok-tc-validate 1e8 20261130 wgmma 2>&1 | tee "$out/tc_validate_wgmma.log" | tail -1
log "compute-sanitizer memcheck (GPU tests)"
compute-sanitizer --tool memcheck --error-exitcode 1 build/megakernel/tests/mok_megakernel_tests \
  --gtest_filter='Gpu.MatchesReference*:Gpu.BatchInvariance:Gpu.RankCount*' >"$out/memcheck.log" 2>&1
echo "memcheck exit $?: $(grep 'ERROR SUMMARY' "$out/memcheck.log")" | tee -a "$out/summary.log"
log "mok-verify --backend gpu golden/data"
build/verify/mok-verify golden/data --backend gpu 2>&1 | tee "$out/verify_gpu.log" | grep -E "^(EQUAL|DIFFER|ERROR)"
echo "mok-verify exit ${PIPESTATUS[0]}" | tee -a "$out/summary.log"
log "mok-fuzz --backend gpu --seconds $fuzz_seconds"
build/fuzz/mok-fuzz --backend gpu --seed 20261129 --seconds "$fuzz_seconds" >"$out/fuzz_gpu.log" 2>&1
fuzz_rc=$?
tail -14 "$out/fuzz_gpu.log"
echo "mok-fuzz exit $fuzz_rc" | tee -a "$out/summary.log"
for s in $shapes; do
  log "mok-bench --shape $s"
  build/megakernel/mok-bench --shape "$s" --runs 5 2>&1 | tee -a "$out/bench.log" | tail -1
  log "torch baseline --shape $s"
  python3 bench/torch_baseline.py --shape "$s" 2>&1 | tee -a "$out/bench.log" | tail -1
done
