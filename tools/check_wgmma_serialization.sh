#!/bin/sh
# Compiles one kernel source (the arguments: nvcc, then its flags and the source) with ptxas's report
# and fails if ptxas serialized the wgmma of any kernel in it (C7515: a non-wgmma instruction may define
# an accumulator inside a wgmma pipeline stage). ptxas says so only with -v, and the build succeeds:
# the backward lost 7-12% that way once (docs/benchmarks.md, session 20). Prints each kernel's spills.
set -u
out=$("$@" -Xptxas -v 2>&1)
status=$?
if [ $status -ne 0 ]; then
  echo "$out"
  exit $status
fi
echo "$out" | grep -E "Compiling entry|spill stores"
if echo "$out" | grep -q C7515; then
  echo "$out" | grep C7515
  echo "FAIL: ptxas serialized the wgmma instructions of a kernel (C7515)"
  exit 1
fi
echo "no serialized wgmma"
