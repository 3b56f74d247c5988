#!/usr/bin/env bash
# call 3: the FP8 forward with epilogue warps (.snapv: ddd9a60 + epilogue_warps.patch + __forceinline__ on its new
# functions) against 913d0c7 (.snap); first whether ptxas still serializes the variant's wgmmas (C7510), and why
set -uo pipefail
out=$OUT; root=$PWD
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }
{ echo "commit: 913d0c7 (.snap) vs ddd9a60 + epilogue_warps.patch + forceinline (.snapv)"; echo "date: $(date -u +%FT%TZ)";
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cmake --version | head -1; g++ --version | head -1; } | tee "$out/summary.log"
rc=.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
for t in .snap .snapv; do
  ( cd $t && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$PWD/$rc > "$out/build$t.log" 2>&1 && cmake --build build -j8 --target mok-bench >> "$out/build$t.log" 2>&1; echo "build $t rc $?" | tee -a "$out/summary.log" ) &
done
wait
log built
for t in .snap .snapv; do echo "$t: $(grep -c C7510 "$out/build$t.log") C7510 lines" | tee -a "$out/summary.log"; done
cd "$root/.snapv/build"
obj=megakernel/CMakeFiles/mok_megakernel.dir/src/forward.cu.o
cmd=$(ninja -t commands $obj | tail -1); echo "$cmd" > "$out/forward_cmd.txt"
cmd="${cmd%% -o *}"; cmd="${cmd//-MD -MT $obj -MF $obj.d/}"; cmd="${cmd/ -c / -ptx }"
( eval "$cmd -o /tmp/fwdv.ptx" ) >> "$out/forward_cmd.txt" 2>&1
echo "ptx calls: $(grep -c 'call' /tmp/fwdv.ptx)" | tee -a "$out/summary.log"
grep -n "call\|^.visible .entry\|^.func\|^.weak .func" /tmp/fwdv.ptx | head -60 >> "$out/forward_cmd.txt"
cd "$root"
for i in 1 2; do for t in .snap .snapv; do
  echo "#### $t round $i mok-bench --shape all --runs 10 --fp8" >> "$out/bench.log"
  timeout 120 "$root/$t/build/megakernel/mok-bench" --shape all --runs 10 --fp8 >> "$out/bench.log" 2>&1
  echo "bench $t round $i rc $?" | tee -a "$out/summary.log"
done; done
log done
