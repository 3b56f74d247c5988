"""Where one loop of a kernel spends its cycles, from Nsight Compute's warp-stall sampling per SASS
instruction (the source page as CSV: `ncu -i X.ncu-rep --page source --print-source sass --csv`,
gzipped or not).

A loop is the instructions from its first to its last address (offsets from the kernel's first
instruction: the top and the branch back to it, as `--loops` lists them); an iteration is one execution
of its most executed instruction by one warp (a consumer warp's K-block, in a GEMM loop). The sampler
visits each warp every P cycles, and a warp is "selected" one cycle per instruction it issues, so
P = instructions / selected samples of the loop, and a stall reason's samples times P / iterations are
its cycles an iteration. `--top N` lists the N instructions with the most, `--opcodes` the cycles and
instructions an iteration of each opcode, `--split A,B,..` those of the loop's parts [FIRST, A), [A, B),
.. [.., LAST]. The CSV must hold one kernel.

    python3 bench/ncu_loop_stalls.py SASS.csv.gz FIRST LAST [--top N] [--opcodes] [--split A,B]  # one loop
    python3 bench/ncu_loop_stalls.py SASS.csv.gz --loops                 # its hottest backward branches
"""
import argparse
import collections
import csv
import gzip
import re

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def load(path):
    """The kernel's instructions: dicts of the CSV's columns plus 'offset', 'samples' and 'executed'."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = [r for r in csv.reader(f)]
    header = next((r for r in rows if r and r[0] == "Address"), None)
    if header is None or SAMPLES not in header or EXECUTED not in header:
        raise SystemExit(f"{path}: no '{SAMPLES}' / '{EXECUTED}' columns (ncu's SourceCounters section, "
                         "its source page as CSV)")
    instructions = []
    for row in rows[rows.index(header) + 1:]:
        if len(row) != len(header) or not row[0].startswith("0x"):
            continue
        d = dict(zip(header, row))
        d["address"] = int(d["Address"], 16)
        d["samples"] = int(d[SAMPLES] or 0)
        d["executed"] = int(d[EXECUTED] or 0)
        instructions.append(d)
    if not instructions:
        raise SystemExit(f"{path}: no SASS rows (is it ncu's source page, --print-source sass --csv?)")
    base = instructions[0]["address"]
    for d in instructions:
        d["offset"] = d["address"] - base
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    return instructions, reasons


def stalls_of(d, reasons):
    """An instruction's samples by reason; those of reasons the CSV has no column for (a few %) as "other"."""
    named = {r[len("stall_"):]: int(d[r] or 0) for r in reasons}
    named["other"] = d["samples"] - sum(named.values())
    return named


def loop_cycles(instructions, reasons, first, last):
    """(iterations, instructions an iteration, P, {reason: cycles an iteration}, the loop's rows)."""
    rows = [d for d in instructions if first <= d["offset"] <= last and d["executed"] > 0]
    if not rows:
        raise SystemExit(f"no executed instruction in [{first:#x}, {last:#x}]")
    iterations = max(d["executed"] for d in rows)
    executed = sum(d["executed"] for d in rows)
    stalls = collections.Counter()
    for d in rows:
        stalls.update(stalls_of(d, reasons))
    if stalls["selected"] == 0:
        raise SystemExit("the loop has no 'selected' samples: too few to scale")
    period = executed / stalls["selected"]
    cycles = {r: v * period / iterations for r, v in stalls.items()}
    return iterations, executed / iterations, period, cycles, rows


def opcode(d):
    """An instruction's opcode without its predicate and modifiers (QGMMA, FFMA, ...)."""
    words = d["Source"].split()
    return (words[1] if words[0].startswith("@") else words[0]).split(".")[0]


def grouped(rows, key, scale):
    """{group: [cycles an iteration, instructions executed]} of rows grouped by key(row)."""
    groups = collections.defaultdict(lambda: [0.0, 0])
    for d in rows:
        g = groups[key(d)]
        g[0] += d["samples"] * scale
        g[1] += d["executed"]
    return groups


def split_offsets(ap, text, first, last):
    """--split's offsets, each inside (FIRST, LAST], in increasing order; else an error naming the bad one."""
    offsets = []
    for word in text.split(","):
        try:
            at = int(word, 0)
        except ValueError:
            ap.error(f"--split: {word!r} is not an offset")
        if not first < at <= last:
            ap.error(f"--split: {word} is outside the loop ({first:#x}, {last:#x}]")
        offsets.append(at)
    if offsets != sorted(set(offsets)):
        ap.error("--split: the offsets must increase")
    return offsets


def backward_branches(instructions):
    """(top, branch, executed) of each executed branch back to a lower address, the most executed first."""
    found = []
    for d in instructions:
        m = re.search(r"BRA (0x[0-9a-f]+)", d["Source"])
        if m and d["executed"] > 0:
            target = int(m.group(1), 16) - (d["address"] - d["offset"])
            if target < d["offset"]:
                found.append((target, d["offset"], d["executed"]))
    return sorted(found, key=lambda f: -f[2])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("first", nargs="?", type=lambda s: int(s, 0), help="the loop's first offset (0x...)")
    ap.add_argument("last", nargs="?", type=lambda s: int(s, 0), help="its last offset (0x...)")
    ap.add_argument("--top", type=int, default=0, help="also the N instructions with the most cycles")
    ap.add_argument("--loops", action="store_true", help="list the hottest backward branches")
    ap.add_argument("--opcodes", action="store_true", help="also the cycles and instructions of each opcode")
    ap.add_argument("--split", default="", help="also those of the loop's parts, split at these offsets (0x..,0x..)")
    a = ap.parse_args()
    instructions, reasons = load(a.csv)
    if (a.first is None) != (a.last is None):
        ap.error("give both FIRST and LAST")
    if a.loops or a.first is None:
        for top, branch, executed in backward_branches(instructions)[:12]:
            print(f"{top:#x} .. {branch:#x}  executed {executed}")
        return
    iterations, per_iteration, period, cycles, rows = loop_cycles(instructions, reasons, a.first, a.last)
    print(f"loop {a.first:#x} .. {a.last:#x}: {iterations} iterations, {per_iteration:.1f} instructions an "
          f"iteration, a sample every {period:.0f} cycles, {sum(cycles.values()):.0f} cycles an iteration")
    for r, c in sorted(cycles.items(), key=lambda kv: -kv[1]):
        if c >= 0.5:
            print(f"  {r:18s} {c:7.1f}")
    scale = period / iterations
    for d in sorted(rows, key=lambda d: -d["samples"])[:a.top]:
        named = stalls_of(d, reasons)
        worst = max(named, key=named.get)
        print(f"  {d['offset']:#8x} {d['samples'] * scale:7.1f}  {worst:16s} {d['Source'].strip()[:64]}")
    if a.opcodes:
        for op, (c, n) in sorted(grouped(rows, opcode, scale).items(), key=lambda kv: -kv[1][0]):
            print(f"  {op:12s} {c:7.1f} cycles {n / iterations:6.1f} instructions")
    if a.split:
        bounds = [a.first] + split_offsets(ap, a.split, a.first, a.last)
        part = lambda d: max(b for b in bounds if b <= d["offset"])
        for b, (c, n) in sorted(grouped(rows, part, scale).items()):
            print(f"  from {b:#x}: {c:7.1f} cycles {n / iterations:6.1f} instructions")


if __name__ == "__main__":
    main()
