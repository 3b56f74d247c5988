#!/bin/bash
# Session 41's crash-hunt findings on the host tools, run again after the fixes (development machine,
# no GPU): each command and its exit status. Run from the repository root with build-h built;
# scratch files go to $TMP_DIR (default /tmp/ch41).
T=${TMP_DIR:-/tmp/ch41}; B=build-h; mkdir -p $T/data $T/sig; rm -f $T/data/* $T/sig/* $T/sig/.??* 2>/dev/null
run() { echo "\$ $*"; timeout 60 "$@" > $T/out 2>&1; local rc=$?; sed -n '1,4p' $T/out | cut -c1-200; echo "exit $rc"; echo; }
echo "## 1. a case name longer than the report's column (mok-golden check aborted: exit 2, basic_string::_M_create)"
printf 'name = a_case_name_of_21_chr\nranks = 1\ntokens_per_rank = 4\n' > $T/long.txt
run $B/golden/mok-golden generate --config $T/long.txt --out $T/data/long.h5
run $B/golden/mok-golden check --name long --dir $T/data
echo "## 2. a name with an escape code (was accepted and printed raw)"
printf 'name = x\033[2Jy\n' > $T/escape.txt
run $B/golden/mok-golden generate --config $T/escape.txt --out $T/escape.h5
echo "## 3. ring_rows = 0 in a case file (was refused later, without the file)"
printf 'name = ring\nring_rows = 0\n' > $T/ring.txt
run $B/golden/mok-golden generate --config $T/ring.txt --out $T/ring.h5
echo "## 4. SIGHUP during a write (left .o.h5.tmp.PID.0)"
printf 'experts = 512\ntop_k = 512\ntokens_per_rank = 2\nname = big\n' > $T/big.txt
$B/golden/mok-golden generate --config $T/big.txt --out $T/sig/o.h5 > /dev/null 2>&1 & p=$!; sleep 2.5; kill -HUP $p; wait $p
echo "killed by SIGHUP: exit $?; left in the folder: $(ls -A $T/sig | tr '\n' ' ')"; echo
echo "## 5. mok-verify: an unknown option last, and -q (said to need a value; taken for a golden)"
run $B/verify/mok-verify golden/data/smoke.h5 --backend reference --bogus
run $B/verify/mok-verify golden/data/smoke.h5 --backend reference -q
echo "## 6. mok-fuzz: --cases with --seconds (--cases was ignored), --replay with --seed (ignored)"
run $B/fuzz/mok-fuzz --cases 5 --seconds 5 --list
run $B/fuzz/mok-fuzz --replay golden/data/smoke.h5 --seed 3
echo "## 7. mok-procs --gpus 12abc (ran with 12)"
run $B/megakernel/mok-procs --gpus 12abc
echo "## 8. not fixed: a golden edited and sealed again crashes the reader inside HDF5 (docs/golden-format.md)"
python3 docs/results/2026-12-05-cpu-a/repro_flip.py golden/data/smoke.h5 $T/resealed.h5 1405 128
run $B/verify/mok-verify $T/resealed.h5 --backend reference
