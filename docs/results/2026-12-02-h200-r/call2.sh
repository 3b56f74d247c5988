#!/usr/bin/env bash
# call 2 (session 16): why the bf16 backward's weight gradients lost 0.8 ms (call 1): backward.cu compiled on the GPU
# machine as its build does (host g++ 13), with ptxas -v and the intermediates kept, for .snap (exp_f32_moderate)
# and .snap0 (5f701b4); the objects and .snap's preprocessed source and PTX come back for a local comparison
set -uo pipefail
out=$OUT; root=$PWD
{ echo "commit: $(cat .snap/COMMIT) (.snap), $(cat .snap0/COMMIT) (.snap0)"; echo "date: $(date -u +%FT%TZ)"; g++ --version | head -1; } | tee "$out/summary.log"
rc=$root/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
obj=megakernel/CMakeFiles/mok_megakernel.dir/src/backward.cu.o
for t in .snap .snap0; do
  ( cd $root/$t && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR=$rc > /dev/null 2>&1
    cmd=$(cd build && ninja -t commands $obj | tail -1); cmd="${cmd% -o *}"; cmd="${cmd//-MD -MT $obj -MF $obj.d/}"
    mkdir -p /tmp/k$t; cd build && eval "$cmd -Xptxas -v --keep --keep-dir /tmp/k$t -o /tmp/k$t/backward.o" > "$out/ptxas$t.log" 2>&1
    echo "$t nvcc rc $?" >> "$out/summary.log"; cp /tmp/k$t/backward.o "$out/backward$t.o" ) &
done
wait
gzip -c /tmp/k.snap/backward.cpp1.ii > "$out/backward.snap.cpp1.ii.gz"
gzip -c /tmp/k.snap/backward.ptx > "$out/backward.snap.ptx.gz"
ls -la /tmp/k.snap | tee -a "$out/summary.log"
grep -E "spill|Used" "$out"/ptxas*.log | tee -a "$out/summary.log"
