# Session 60, call 3: the backward under uniform and zipf routing in Nsight Compute (L2 hit rate, DRAM
# bytes, tensor pipe), olmoe then qwen3-30b-a3b: where Zipf's weight gradients lose their time.
# bash docs/results/2026-12-06-h100-i/call3/call3.sh (from the repo root, .deps carried)
source bench/device_call.sh
call_header "steps: mok-bench build, ncu of the backward (uniform, zipf)"
build_tree . 16 --target mok-bench >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
log "build ok"
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct
metrics=$metrics,lts__t_sectors_op_read.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed
for s in olmoe qwen3-30b-a3b; do
  for r in uniform zipf; do
    log "ncu backward_kernel --shape $s --routing $r"
    timeout 120 ncu --kernel-name regex:'backward_kernel' --launch-count 1 --metrics "$metrics" \
      build/megakernel/mok-bench --shape "$s" --routing "$r" --runs 1 --warmup 0 --sets 1 >"$out/ncu_${s}_$r.log" 2>&1
    echo "ncu exit $?" | tee -a "$out/summary.log"
    grep -E "backward_kernel|duration|dram__|lts__|sm__pipe" "$out/ncu_${s}_$r.log" | tee -a "$out/summary.log"
  done
done
log "done"
