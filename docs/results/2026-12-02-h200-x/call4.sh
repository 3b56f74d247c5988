#!/usr/bin/env bash
# call 4 (session 21; 251 s of device time left): .snap = the landed tree: 1da79f3 with the router-weight gradient's
# relay and results walks merged (relay_router_weight_grad<kResults>, as the shared expert's relayed phases are) and
# the host tests on the CPU. Builds the GPU test executable alone and runs the tests that run the relay (colocated
# shares) and the one-GPU backward tests of both precisions.
set -uo pipefail
out=$OUT; root=$PWD
{ echo "commit: $(cat .snap/COMMIT) (.snap)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
cd $root/.snap
timeout 120 bash -c "cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$rc > /tmp/build.log 2>&1 && cmake --build build -j16 --target mok_megakernel_tests >> /tmp/build.log 2>&1"
echo "build rc $?" | tee -a "$out/summary.log"
filter="Gpu.Colocated*:LayerApi.Colocated*:Gpu.Fp8BackwardAcrossLaunchModesMatchesTheReference:Gpu.MatchesReferenceBitForBit:Gpu.Fp8BackwardMatchesReferenceBitForBit"
timeout 45 build/megakernel/tests/mok_megakernel_tests --gtest_filter="$filter" > "$out/gpu_tests.log" 2>&1
echo "tests rc $?: $(grep -E '^\[  (PASSED|FAILED)' "$out/gpu_tests.log" | tr '\n' ' ')" | tee -a "$out/summary.log"
echo "== $(date -u +%T) done" | tee -a "$out/summary.log"
