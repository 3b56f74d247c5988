#!/usr/bin/env bash
# Spill instructions (ptxas's "SpillRefill" annotation) of one kernel of an object, by source line, and how many lie
# near the weight-gradient phase (within 300 instructions of the SASS whose line info is backward.cu's weight_grads).
# Usage: spills_by_line.sh OBJECT KERNEL_SYMBOL_PART WEIGHT_GRADS_LINE_REGEX (e.g. backward.cu.o 15backward_kernel
# '^backward.cu:3[3-5][0-9]$'). Needs cuobjdump and nvdisasm (CUDA 13) on PATH; objects built with -lineinfo.
set -euo pipefail
obj=$1 kernel=$2 region=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && cuobjdump -xelf all "$(realpath "$obj")" > /dev/null)
nvdisasm -g -c "$tmp"/*.cubin | awk -v k="$kernel" '/\.text\./{fn=$1} fn ~ k' > "$tmp/k.dis"
awk -v region="$region" '
  /## File/ { match($0, /"[^"]+"/); f = substr($0, RSTART + 1, RLENGTH - 2); sub(/.*\//, "", f)
              match($0, /line [0-9]+/); loc = f ":" substr($0, RSTART + 5, RLENGTH - 5) }
  /^[ \t]+\/\*[0-9a-f]+\*\// { n++; if (loc ~ region) { if (!first) first = n; last = n } }
  /SpillRefill/ { at[n] = loc; count[loc]++; total++ }
  END { for (l in count) printf "%s %d\n", l, count[l] | "sort"; close("sort")
        near = 0; for (i in at) if (i + 0 >= first - 300 && i + 0 <= last + 300) near++
        printf "total spill instructions %d; near the weight gradients (SASS %d-%d) %d\n", total, first, last, near }' "$tmp/k.dis"
