#!/usr/bin/env bash
# call 3 (session 19), on call 2's warm machine and build (.snap = fe07731): op_bench on all six shapes in the fp8
# mode, then uniform and Zipf again (a second side-by-side pair). The command as run (the device tool's one line):
cd .snap && export PYTHONPATH=$PWD/build/python PYTHONUNBUFFERED=1 && echo "commit: $(cat COMMIT), date: $(date -u +%FT%TZ)" > $OUT/summary.log && for mode in "--fp8" "--routing uniform" "--routing zipf"; do echo "#### op_bench.py --shape all --runs 10 $mode" >> $OUT/op_bench.log; timeout 100 python3 bench/op_bench.py --shape all --runs 10 $mode >> $OUT/op_bench.log 2>&1; echo "op_bench all $mode rc $?" >> $OUT/summary.log; done; cat $OUT/summary.log
