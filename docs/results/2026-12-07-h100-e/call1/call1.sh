#!/usr/bin/env bash
# Session 69, call 1: DeepGEMM's two grouped forward GEMMs alone, its extension built by the system g++ this time
# (session 68's build by /opt/gcc's g++ segfaulted in std::regex), beside mok-bench's forward and GEMM phases on
# the six shapes, bf16 and fp8, in one call.   bash <this script>   # carry .deps (with .deps/deepgemm)
set -uo pipefail
source bench/device_call.sh
call_header "call 1: DeepGEMM built by the system g++; mok-bench six shapes bf16 and fp8"
export DG_BENCH_SRC=$PWD/.deps/deepgemm
dg=docs/results/2026-12-07-h100-d/call3/deepgemm_baseline.py
{ echo "g++ on PATH: $(command -v g++) ($(g++ --version | head -1))"; ls -l /usr/bin/g++* 2>&1; } | tee -a "$out/summary.log"
py=$(command -v python3)  # before PATH puts /usr/bin first (the system python has no torch)
sys_cxx=$(ls /usr/bin/g++-13 /usr/bin/g++ 2>/dev/null | head -1)
sys_cc=${sys_cxx/g++/gcc}
log "DeepGEMM build with CXX=$sys_cxx CC=$sys_cc (background)"
(CXX=$sys_cxx CC=$sys_cc PATH=/usr/bin:$PATH timeout 240 "$py" $dg --build-only >"$out/deepgemm_build.log" 2>&1
 echo "deepgemm build exit $?" >>"$out/summary.log") &
dg_build=$!
build_tree . 12 --target mok-bench >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
log "mok build ok"
wait $dg_build
tail -5 "$out/deepgemm_build.log"
log "DeepGEMM probe: olmoe fp8"
CXX=$sys_cxx CC=$sys_cc PATH=/usr/bin:$PATH timeout 120 "$py" $dg --shapes olmoe --precisions fp8 --no-dense --time-budget 90 >"$out/deepgemm_probe.log" 2>&1
probe=$?
echo "deepgemm probe exit $probe" | tee -a "$out/summary.log"
tail -15 "$out/deepgemm_probe.log"
[ -n "${SKIP_BENCH:-}" ] || for s in kimi-k2 glm-5 qwen3.5-397b deepseek-v4 qwen3-30b-a3b olmoe; do
  for precision in bf16 fp8; do
    args=()
    [ "$precision" = fp8 ] && args=(--fp8)
    timeout 120 build/megakernel/mok-bench --shape "$s" --runs 5 "${args[@]}" >>"$out/bench.log" 2>&1
    grep -E "^$s " "$out/bench.log" | tail -1 | tee -a "$out/summary.log"
  done
done
if [ $probe = 0 ]; then
  log "DeepGEMM six shapes"
  CXX=$sys_cxx CC=$sys_cc PATH=/usr/bin:$PATH timeout 230 "$py" $dg --time-budget 200 --json "$out/deepgemm.json" >"$out/deepgemm.log" 2>&1
  echo "deepgemm_baseline exit $?" | tee -a "$out/summary.log"
  tail -30 "$out/deepgemm.log"
fi
log "done"
