#!/usr/bin/env bash
# Call 4 (session 37): the training path through the PyTorch op with call 3's tree: the extension built
# against the machine's torch, its tests (pytest python/tests: accumulate_into among them), then
# bench/op_bench.py beside the deterministic torch layer, kimi-k2 with the weight gradients added into
# fp32 accumulators (--accumulate fp32: the TMA's reduce-add) and into .grad by autograd, olmoe with
# --accumulate fp32.
#   MOK_COMMIT=<hash> bash docs/results/2026-12-04-h200-g/call4/call4.sh   (carry .deps)
set -uo pipefail
source bench/device_call.sh
call_header "python tests, op_bench --accumulate fp32 (kimi-k2, olmoe) and without (kimi-k2)"
torch_flags=(-DMOK_TORCH=ON -DPython3_EXECUTABLE="$(command -v python3)")
build_tree . 16 >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
log "build ok"
rm -f "$out/build.log"
PYTHONUNBUFFERED=1 ctest --test-dir build -L python -V --timeout 300 >"$out/python.log" 2>&1
echo "python exit $?: $(grep -E '[0-9]+ (passed|failed)' "$out/python.log" | tail -1)" | tee -a "$out/summary.log"
for run in "kimi-k2 --accumulate fp32" "kimi-k2" "olmoe --accumulate fp32"; do
  log "op_bench --shape $run"
  PYTHONPATH=build/python timeout 150 python3 bench/op_bench.py --shape $run >>"$out/op_bench.log" 2>&1
  echo "op_bench $run exit $?" | tee -a "$out/summary.log"
done
grep -E "^(kimi-k2|olmoe)|mok:|torch" "$out/op_bench.log" | tee -a "$out/summary.log" | head -30
log done
