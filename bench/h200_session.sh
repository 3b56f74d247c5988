#!/usr/bin/env bash
# One device call on the H200 (the device tool runs it in the repo root; logs go to $OUT, of which the
# tool returns at most 8 files: summary, build and each step's log below, so pick steps to fit): build with the carried rapidcheck, then the steps asked for, in the order given:
#   tests   ctest -L gpu, and every golden through the GPU backend (mok-verify)
#   model   tensor-core model validation, 1e8 outputs per instruction (mma.sync, wgmma), and the shared
#           scalar functions GPU against CPU on every input (mok-scalar-check); both in model.log
#   sanitize compute-sanitizer memcheck, racecheck, initcheck and synccheck ($MOK_SANITIZE_TOOLS) over
#           the GPU tests in $MOK_SANITIZE_FILTER (sanitize.log; each tool's error summary in summary.log;
#           initcheck on the FP8 forward is the check that its padding exponents are written; racecheck's
#           hazards across a __syncthreads() after the GEMM phases are its named-barrier artefact:
#           docs/fuzzing.md)
#   python  the PyTorch extension built against the machine's torch (-DMOK_TORCH=ON) and its tests
#           (pytest python/tests; python.log)
#   op      (after python) bench/op_bench.py: mok through its PyTorch op beside the torch layer, per
#           shape in $MOK_SHAPES, with peak memory, and the op's per-call cost (op_bench.log)
#   gather  mok-gather-probe on olmoe and kimi-k2: GEMM1 with its rows gathered from x, against the boxed
#           loads of xe (gather.log)
#   deepgemm bench/deepgemm_baseline.py: DeepGEMM's two grouped forward GEMMs alone (fp8 and bf16), per shape
#           in $MOK_SHAPES, built on the machine from the carried .deps/deepgemm (its docstring says how to make
#           it; none there: the step says so) (deepgemm.log, deepgemm.json)
#   fuzz    mok-fuzz --backend gpu for $MOK_FUZZ_SECONDS (default 120), seed $MOK_FUZZ_SEED (default:
#           a fresh one from the clock, printed)
#   profile Nsight Compute on the first three megakernel launches (forward, forward, backward) of
#           $MOK_PROFILE_SHAPE (default kimi-k2): speed of light, memory, warp stalls (ncu.log)
#   nccl    (every GPU here) mok-nccl-probe (also with NCCL_WIN_ENABLE=0: NCCL's refusal), every golden over 1 and over all GPUs, one process per GPU
#           (mok-verify --gpus), mok-procs --gpus N (against the reference), mok-bench --gpus 1 on
#           olmoe and, with N > 1, mok-bench --gpus N for the shapes in $MOK_SHAPES (nccl.log)
#   bench   mok-bench beside bench/torch_baseline.py, per shape in $MOK_SHAPES and routing in
#           $MOK_ROUTINGS (defaults: all six shapes, uniform and zipf; router, the layer's own, runs in
#           mok-bench only); $MOK_BENCH_ARGS go to mok-bench (not --shape, --routing or --fp8, which the
#           steps pass themselves: mok-bench refuses an option given twice);
#           MOK_TORCH=0 skips the baseline, MOK_TORCH_ROUTINGS limits it to those routings,
#           $MOK_TORCH_ARGS go to torch_baseline.py (--fp8: its FP8 rows, issue 19)
#   ab      A/B against a baseline tree $MOK_BASELINE (a directory holding another commit's source, built
#           here beside this one): per shape in $MOK_SHAPES and precision in $MOK_AB_PRECISIONS (bf16 or
#           fp8, fp8 adding --fp8 to the tool's arguments; default: the arguments as given), runs in the
#           order $MOK_AB_ORDER (default "B N B N"; B the baseline, N this tree), alternating so that the
#           clock's drift falls on both;
#           $MOK_AB_TOOL bench (default: mok-bench $MOK_BENCH_ARGS $MOK_AB_ARGS, ab.log; $MOK_AB_ARGS, e.g.
#           --recompute, go to the A/B's runs alone, not to the bench step's) or op (bench/op_bench.py
#           $MOK_OP_ARGS through each tree's PyTorch op, both built with it; ab.log). The baseline is an
#           ignored path (.snap*), so the device call must carry it. More trees (candidates: this tree with
#           a patch each) in $MOK_AB_TREES as LETTER=DIR pairs, e.g. "R=.snapR H=.snapH", built as the
#           baseline is and run where their letter stands in $MOK_AB_ORDER (e.g. "B N R H B N R H"); F is
#           this tree with $MOK_AB_FLAGS added (an experimental option beside the default: MOK_AB_FLAGS=--paired-blocks
#           MOK_AB_ORDER="N F N F", no baseline needed)
# MOK_CALL_SECONDS (the call's limit, e.g. 590): a step, or an A/B run, that would not end within it is not
# started, and summary.log says so (a step killed by the limit loses its log's end and the steps after it).
#   MOK_COMMIT=<hash> bash bench/h200_session.sh tests bench
#   MOK_COMMIT=<hash> MOK_BASELINE=.snapB MOK_SHAPES="kimi-k2 olmoe" bash bench/h200_session.sh tests ab
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device_call.sh"  # out, rc_dir, torch_flags, log, call_header, build_tree
shapes=${MOK_SHAPES:-kimi-k2 glm-5 qwen3.5-397b deepseek-v4 qwen3-30b-a3b olmoe}
routings=${MOK_ROUTINGS:-uniform zipf}
call_header "steps: $*"

# The PyTorch op in both builds: asked for, or for an A/B of the op.
[ "${MOK_AB_TOOL:-bench}" = op ] && MOK_TORCH_BUILD=1
with_torch=(-DMOK_TORCH=ON -DPython3_EXECUTABLE="$(command -v python3)")
[ "${MOK_TORCH_BUILD:-0}" = 1 ] && torch_flags=("${with_torch[@]}")
# The baseline's tools only (the A/B's), beside this tree's build: it takes a quarter of the cores. A baseline that
# is not a source tree stops the call at once; one that does not build leaves the other steps to run (ab says so).
baseline=${MOK_BASELINE:-}
jobs=16
# The A/B's other trees: the baseline as B, and $MOK_AB_TREES' letters (each a source tree, all built at once).
declare -A ab_trees=()
if [ -n "$baseline" ]; then
  ab_trees[B]=$baseline
  for pair in ${MOK_AB_TREES:-}; do
    letter=${pair%%=*} dir=${pair#*=}
    case $letter in B | N | F | "$pair") echo "MOK_AB_TREES: $pair is not LETTER=DIR (B, N and F are taken)" | tee -a "$out/summary.log"; exit 1 ;; esac
    ab_trees[$letter]=$dir
  done
  for letter in "${!ab_trees[@]}"; do
    dir=${ab_trees[$letter]}
    named="MOK_AB_TREES: $letter=$dir"
    [ "$letter" = B ] && named="MOK_BASELINE=$dir"
    [ -f "$dir/CMakeLists.txt" ] || { echo "$named is not a source tree (carried?)" | tee -a "$out/summary.log"; exit 1; }
    echo "A/B tree $letter: $(cat "$dir/COMMIT" 2>/dev/null || echo "$dir")" | tee -a "$out/summary.log"
  done
  targets=mok-bench
  [ "${MOK_AB_TOOL:-bench}" = op ] && targets=mok_torch
  tree_builds=()
  for letter in "${!ab_trees[@]}"; do
    dir=${ab_trees[$letter]}
    (build_tree "$dir" 4 --target "$targets" >"$out/build_$letter.log" 2>&1 || echo "$letter" >>"$out/failed_trees") &
    tree_builds+=($!)
  done
  jobs=12
fi
# Stops a process and every process below it (a tree's build: its subshell, cmake, ninja, the compilers),
# each stopped first so that it starts no child while its children are listed.
kill_tree() {
  local child
  kill -STOP "$1" 2>/dev/null
  for child in $(pgrep -P "$1"); do kill_tree "$child"; done
  kill "$1" 2>/dev/null
  kill -CONT "$1" 2>/dev/null
}
build_tree . "$jobs" >"$out/build.log" 2>&1 || {
  tail -60 "$out/build.log"
  if [ -n "$baseline" ]; then
    for pid in "${tree_builds[@]}"; do kill_tree "$pid"; done
    wait "${tree_builds[@]}"
  fi
  exit 1
}
log "build ok"
if [ -n "$baseline" ]; then
  wait "${tree_builds[@]}"
  for letter in $(cat "$out/failed_trees" 2>/dev/null); do
    tail -30 "$out/build_$letter.log"
    log "A/B tree $letter's build failed (build_$letter.log)"
    unset "ab_trees[$letter]"
  done
  rm -f "$out/failed_trees"
  [ -n "${ab_trees[B]:-}" ] && log "A/B trees built: ${!ab_trees[*]}" || baseline=
fi

# About how long a step (or one A/B run: ab-run) takes on the H200, in seconds; sanitize per tool.
step_seconds() {
  case $1 in
    tests) echo 130 ;;
    model) echo 240 ;;
    sanitize) echo $((60 * $(wc -w <<<"${MOK_SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}"))) ;;
    python) echo 150 ;;
    fuzz) echo $((${MOK_FUZZ_SECONDS:-120} + 15)) ;;
    ab | ab-run) [ "${MOK_AB_TOOL:-bench}" = op ] && echo 60 || echo 20 ;;  # ab: its first run
    # About 12 s a shape for mok-bench (--runs 5; its default of 20 takes longer) and 11 for the torch
    # baseline (session 45, an H100), 11 for op_bench.
    bench) echo $((25 * $(wc -w <<<"$shapes") * $(wc -w <<<"$routings"))) ;;
    op) echo $((15 * $(wc -w <<<"$shapes") + 20)) ;;
    gather) echo 30 ;;
    deepgemm) echo $((60 + 15 * $(wc -w <<<"$shapes"))) ;;  # its build (about 45 s) and 2 precisions a shape
    *) echo 60 ;;
  esac
}
# True when `what` (taking about $2 seconds) ends within MOK_CALL_SECONDS; else says it is left out.
time_for() {
  [ -z "${MOK_CALL_SECONDS:-}" ] && return 0
  local left=$((MOK_CALL_SECONDS - SECONDS))
  [ "$left" -ge "$2" ] && return 0
  echo "out of time: no $1 ($left s of MOK_CALL_SECONDS left, it takes about $2)" | tee -a "$out/summary.log"
  return 1
}

for step in "$@"; do
  time_for "$step" "$(step_seconds "$step")" || continue
  case $step in
    tests)
      log "ctest -L gpu"
      ctest --test-dir build -L gpu --output-on-failure --timeout 120 >"$out/gpu_tests.log" 2>&1
      grep -E "tests passed|tests failed|Failed|FAILED" "$out/gpu_tests.log" | tee -a "$out/summary.log" | head -20
      log "mok-verify --backend gpu golden/data"
      timeout 120 build/verify/mok-verify golden/data --backend gpu >"$out/verify_gpu.log" 2>&1
      echo "mok-verify exit $?: $(grep -cE '^EQUAL' "$out/verify_gpu.log") EQUAL, $(grep -cE '^SKIPPED' "$out/verify_gpu.log") SKIPPED, $(grep -cE '^(MISMATCH|ERROR)' "$out/verify_gpu.log") MISMATCH/ERROR" | tee -a "$out/summary.log"
      ;;
    model)
      log "mok-tc-validate 1e8 (mma.sync) and 1e8 (wgmma)"
      { build/megakernel/mok-tc-validate 1e8; build/megakernel/mok-tc-validate 1e8 20261130 wgmma; } >"$out/model.log" 2>&1
      grep -i "mismatch" "$out/model.log" | tail -2 | tee -a "$out/summary.log"
      build/megakernel/mok-tc-validate 1e7 20261201 wgmma-e4m3 >>"$out/model.log" 2>&1
      log "mok-scalar-check (every input)"
      timeout 300 build/megakernel/mok-scalar-check >"$out/scalar_check.tmp" 2>&1
      echo "mok-scalar-check exit $?: $(tail -1 "$out/scalar_check.tmp")" | tee -a "$out/summary.log"
      cat "$out/scalar_check.tmp" >>"$out/model.log" && rm "$out/scalar_check.tmp"
      ;;
    memcheck | sanitize)
      tools=memcheck
      [ "$step" = sanitize ] && tools=${MOK_SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}
      for tool in $tools; do
        log "compute-sanitizer $tool (GPU tests)"
        filter=${MOK_SANITIZE_FILTER:-Gpu.MatchesReference*:Gpu.BatchInvariance:Gpu.Fp8ForwardMatchesReferenceBitForBit:Gpu.Fp8BackwardMatchesReferenceBitForBit:LayerApi.*}
        # Under initcheck two shares of one GPU never meet at their barrier (one waits out its watchdog), and a
        # launch behind a stream held by a host function does not return (StreamHold's test never ends).
        initcheck_out=LayerApi.Colocated*:LayerApi.CallsBehindAnErrorFillTheirOutputsWithNan
        if [ "$tool" = initcheck ]; then [[ $filter == *-* ]] && filter+=":$initcheck_out" || filter+="-$initcheck_out"; fi
        # API errors off: mok checks each CUDA call it makes; those counted otherwise are NCCL's own probes
        # at ncclCommInitRank (cudaFuncGetAttributes, cuMemCreate), which NCCL handles.
        timeout 240 compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 1 \
          build/megakernel/tests/mok_megakernel_tests --gtest_filter="$filter" >"$out/sanitize.tmp" 2>&1
        # racecheck names its hazards in a summary of its own.
        echo "$tool exit $?: $(grep -E '(ERROR|RACECHECK) SUMMARY' "$out/sanitize.tmp" | tail -1)" | tee -a "$out/summary.log"
        { echo "== compute-sanitizer $tool"; head -c 200000 "$out/sanitize.tmp"; } >>"$out/sanitize.log" && rm "$out/sanitize.tmp"
      done
      ;;
    python)
      log "PyTorch extension (MOK_TORCH=ON) and pytest python/tests"
      torch_flags=("${with_torch[@]}")
      { build_tree . 16 && PYTHONUNBUFFERED=1 ctest --test-dir build -L python -V --timeout 500; } >"$out/python.log" 2>&1
      echo "python exit $?: $(grep -E '[0-9]+ (passed|failed)' "$out/python.log" | tail -1)" | tee -a "$out/summary.log"
      ;;
    op)
      log "bench/op_bench.py (the PyTorch op beside the torch layer)"
      for s in $shapes; do
        PYTHONPATH=build/python timeout 200 python3 bench/op_bench.py --shape "$s" ${MOK_OP_ARGS:-} 2>>"$out/bench.err" |
          tee -a "$out/op_bench.log" | tail -2
      done
      ;;
    gather)
      for s in olmoe kimi-k2; do
        log "mok-gather-probe $s"
        timeout 90 build/megakernel/mok-gather-probe "$s" >>"$out/gather.log" 2>&1
        echo "mok-gather-probe $s exit $?" | tee -a "$out/summary.log"
      done
      tail -12 "$out/gather.log"
      ;;
    deepgemm)
      if [ ! -f .deps/deepgemm/setup.py ]; then
        echo "deepgemm: no .deps/deepgemm (carried?); bench/deepgemm_baseline.py says how to make it" | tee -a "$out/summary.log"
      else
        # Its limits within the call's (MOK_CALL_SECONDS): the harness stops timing at --time-budget.
        limit=400
        [ -n "${MOK_CALL_SECONDS:-}" ] && limit=$((MOK_CALL_SECONDS - SECONDS - 10))
        log "bench/deepgemm_baseline.py --shapes ${shapes// /,} (limit ${limit} s)"
        timeout "$limit" python3 bench/deepgemm_baseline.py --shapes "${shapes// /,}" --time-budget $((limit - 60)) \
          --json "$out/deepgemm.json" >"$out/deepgemm.log" 2>&1
        echo "deepgemm_baseline exit $?" | tee -a "$out/summary.log"
        grep -E "^($(tr ' ' '|' <<<"$shapes")) |^dense peak" "$out/deepgemm.log" | tee -a "$out/summary.log"
      fi
      ;;
    fuzz)
      seed=${MOK_FUZZ_SEED:-$(date +%s%N | cut -c7-16)}
      log "mok-fuzz --backend gpu --seed $seed --seconds ${MOK_FUZZ_SECONDS:-120}"
      build/fuzz/mok-fuzz --backend gpu --seed "$seed" --seconds "${MOK_FUZZ_SECONDS:-120}" >"$out/fuzz_gpu.log" 2>&1
      echo "mok-fuzz exit $?" | tee -a "$out/summary.log"
      tail -14 "$out/fuzz_gpu.log"
      ;;
    profile)
      log "ncu --shape ${MOK_PROFILE_SHAPE:-kimi-k2} (the timed forward, the backward's forward and the backward)"
      timeout 400 ncu --kernel-name regex:'(forward|backward)_kernel' --launch-count 3 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
        build/megakernel/mok-bench --shape "${MOK_PROFILE_SHAPE:-kimi-k2}" --runs 1 --warmup 0 --sets 1 \
        >"$out/ncu.log" 2>&1
      echo "ncu exit $?" | tee -a "$out/summary.log"
      grep -E "SM Busy|Compute \(SM\) Throughput|DRAM Throughput|Memory Throughput|Duration" "$out/ncu.log" | head -20
      ;;
    nccl)
      gpus=$(nvidia-smi -L | wc -l)
      log "nccl: $gpus GPU(s): probe, goldens with --gpus 1 and --gpus $gpus, mok-bench --gpus $gpus"
      {
        timeout 120 build/megakernel/mok-nccl-probe "$gpus" 1024
        echo "probe exit $?"
        # Without NCCL's windows: the probe must print NCCL's refusal (SymmetricMemory::refusal), not fail.
        NCCL_WIN_ENABLE=0 timeout 120 build/megakernel/mok-nccl-probe "$gpus" 1024
        echo "probe with NCCL_WIN_ENABLE=0 exit $?"
        for n in $(printf '%s\n' 1 "$gpus" | sort -u); do
          timeout 300 build/verify/mok-verify golden/data --backend gpu --gpus "$n" --runs 2
          echo "mok-verify --gpus $n exit $?"
          for routing in router zipf; do
            timeout 300 build/megakernel/mok-procs --gpus "$n" --shape small --routing "$routing" --runs 2
            echo "mok-procs --gpus $n --routing $routing exit $?"
          done
        done
        # One process per GPU; with G > 1 each shape is measured on one GPU first (the scaling line).
        timeout 300 build/megakernel/mok-bench --shape olmoe --gpus 1 --runs 5
        echo "mok-bench --gpus 1 exit $?"
        if [ "$gpus" -gt 1 ]; then
          for s in $shapes; do timeout 400 build/megakernel/mok-bench --shape "$s" --gpus "$gpus" ${MOK_BENCH_ARGS:-}; done
        fi
      } >"$out/nccl.log" 2>&1
      grep -E "wrong words|exit|GB/s|^[a-z0-9.-]+ +uniform|^[a-z0-9.-]+ +zipf" "$out/nccl.log" | tee -a "$out/summary.log"
      ;;
    bench)
      for routing in $routings; do
        for s in $shapes; do
          log "mok-bench --shape $s --routing $routing"
          timeout 150 build/megakernel/mok-bench --shape "$s" --routing "$routing" ${MOK_BENCH_ARGS:-} 2>>"$out/bench.err" |
            tee -a "$out/bench.log" | tail -3
          [ "${MOK_TORCH:-1}" = 0 ] && continue
          case " ${MOK_TORCH_ROUTINGS:-${routings//router/}} " in *" $routing "*) ;; *) continue ;; esac
          log "torch baseline --shape $s --routing $routing"
          timeout 150 python3 bench/torch_baseline.py --shape "$s" --routing "$routing" ${MOK_TORCH_ARGS:-} 2>>"$out/bench.err" | tee -a "$out/bench.log" | tail -1
        done
      done
      ;;
    ab)
      order=${MOK_AB_ORDER:-B N B N}
      [ -n "$baseline" ] || [[ " $order " != *" B "* ]] || { echo "ab needs MOK_BASELINE, built" | tee -a "$out/summary.log"; continue; }
      for s in $shapes; do
        for precision in ${MOK_AB_PRECISIONS:-given}; do
          case $precision in
            given) fp8=() run=$s ;;
            bf16) fp8=() run="$s bf16" ;;
            fp8) fp8=(--fp8) run="$s fp8" ;;
            *) echo "MOK_AB_PRECISIONS: $precision is neither bf16 nor fp8" | tee -a "$out/summary.log"; continue ;;
          esac
          for tree in $order; do
            flags=()
            if [ "$tree" = N ] || [ "$tree" = F ]; then
              dir=. label=${MOK_COMMIT:-unknown}
              [ "$tree" = F ] && flags=(${MOK_AB_FLAGS:-}) label="$label ${MOK_AB_FLAGS:-}"
            elif [ -n "${ab_trees[$tree]:-}" ]; then
              dir=${ab_trees[$tree]} label=$(cat "$dir/COMMIT" 2>/dev/null || echo "$dir")
            else
              echo "MOK_AB_ORDER: $tree is neither N, F nor a built A/B tree" | tee -a "$out/summary.log"
              continue
            fi
            time_for "ab $run $tree" "$(step_seconds ab-run)" || continue
            if [ "${MOK_AB_TOOL:-bench}" = op ]; then
              PYTHONPATH=$dir/build/python timeout 200 python3 bench/op_bench.py --shape "$s" ${MOK_OP_ARGS:-} "${fp8[@]}" \
                "${flags[@]}" >"$out/ab.run" 2>&1
            else
              timeout 150 "$dir/build/megakernel/mok-bench" --shape "$s" ${MOK_BENCH_ARGS:-} ${MOK_AB_ARGS:-} "${fp8[@]}" \
                "${flags[@]}" >"$out/ab.run" 2>&1
            fi
            status=$?
            { echo "#### $tree ($label) --shape $s${fp8:+ ${fp8[*]}}"; cat "$out/ab.run"; } >>"$out/ab.log"
            echo "ab $run $tree exit $status: $(awk -v s="$s" '$1 == s' "$out/ab.run" | tail -1)" | tee -a "$out/summary.log"
            rm -f "$out/ab.run"
          done
        done
      done
      ;;
    *) echo "unknown step $step" ;;
  esac
done
[ -s "$out/bench.err" ] || rm -f "$out/bench.err"
log "done"
