#!/bin/sh
# CI's fuzz budget: about a minute of mok-fuzz over every property, half on a fixed seed (the same
# cases every run) and half on a fresh seed, printed so that a failure can be rerun.
#   ci_fuzz.sh MOK_FUZZ REPRO_DIR
fuzz="$1"
repros="$2"
status=0
echo "mok-fuzz fixed seed: 1"
"$fuzz" --seed 1 --seconds 30 --repro-dir "$repros" || status=1
seed=$(date +%s)
echo "mok-fuzz fresh seed: $seed (rerun: mok-fuzz --seed $seed --seconds 30)"
"$fuzz" --seed "$seed" --seconds 30 --repro-dir "$repros" || status=1
exit $status
