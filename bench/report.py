"""Turns a bench.log of bench/h200_session.sh (mok-bench and torch_baseline.py rows, side by side)
into the markdown table of docs/benchmarks.md and its PNG chart; torch_baseline.py --fp8's rows (issue
19), where the log has them, into a second table (the log may hold only those).

    python3 bench/report.py docs/results/<run>/bench.log [--png docs/benchmarks.png]
"""
import argparse
import re
import sys

from shapes import SHAPES

PEAK = re.compile(r"bf16 matmul peak \((cuBLAS|torch) .*\): (\d+) TFLOP/s")
FP8_PEAK = re.compile(r"fp8 matmul peak \((cuBLAS|torch) .*?\): (\d+) TFLOP/s")
NUMBER = r"([\d.]+)"
# torch_baseline.py's fp8 row: "fp8 SHAPE ROUTING" and these columns ('-': none); FP8_LEGEND there says what each is.
FP8_KEYS = ("rw", "rw_pk", "rwf", "rwf_pk", "loop", "graph", "graph_pk", "q_act", "q_w", "qb_act", "qb_w", "bf16")


def parse(path):
    """{(shape, routing): {"mok": {...}, "torch": {...}}} from the log's result rows."""
    rows, source, peak = {}, None, None
    for line in open(path):
        m = PEAK.search(line)
        if m:
            source, peak = ("mok" if m.group(1) == "cuBLAS" else "torch"), float(m.group(2))
            continue
        fields = line.split()
        if len(fields) < 5 or line.startswith(("shape", " ")) or not re.fullmatch(NUMBER, fields[2]):
            continue
        key = (fields[0], fields[1])
        values = [float(v.rstrip("%")) for v in fields[2:]]
        if source == "mok":
            fwd, _, fb = values[0], values[1], values[2]
        else:
            fwd, fb = values[0], values[1]
        if source in rows.get(key, {}):  # a second run of the shape (an --fp8 or other-option row): not this table's
            sys.exit(f"report.py: {path} holds two {source} rows of {key[0]} {key[1]}; give it one run's log")
        rows.setdefault(key, {})[source] = {"fwd": fwd, "fb": fb, "peak": peak}
    return {k: v for k, v in rows.items() if "mok" in v and "torch" in v}


def parse_fp8(path):
    """{(shape, routing): {key: float or None, "peak": fp8 peak}} from torch_baseline.py --fp8's rows."""
    rows, peak = {}, None
    for line in open(path):
        m = FP8_PEAK.search(line)
        if m:
            peak = float(m.group(2))
            continue
        fields = line.split()
        if len(fields) != 3 + len(FP8_KEYS) or fields[0] != "fp8" or not re.fullmatch(NUMBER + "%?|-", fields[3]):
            continue
        values = [None if v == "-" else float(v.rstrip("%")) for v in fields[3:]]
        rows[(fields[1], fields[2])] = dict(zip(FP8_KEYS, values), peak=peak)
    return rows


def fp8_table(rows):
    def ms(r, key, pk=None):
        if r[key] is None:
            return "–"
        return f"{r[key]:.3f}" + (f" ({r[pk]:.0f}%)" if pk and r[pk] is not None else "")

    peaks = sorted({r["peak"] for r in rows.values() if r["peak"]})
    out = [f"FP8 forward GEMMs alone, torch (E4M3 operands quantized beforehand; % of the FP8 dense peak, "
           f"torch _scaled_mm 8192³: {', '.join(f'{p:.0f}' for p in peaks) or '?'} TFLOP/s):", "",
           "| shape | routing | bf16 GEMMs ms | FP8 row-wise ms (% peak) | vs bf16 | row-wise fast accum ms (% peak) "
           "| block-scaled loop ms, eager / graph (% peak) | quant act / W ms, row-wise | quant act / W ms, block |",
           "|---|---|---|---|---|---|---|---|---|"]
    for (shape, routing), r in rows.items():
        speedup = f"{r['bf16'] / r['rw']:.2f}×" if r["bf16"] and r["rw"] else "–"
        out.append(f"| {shape} | {routing} | {ms(r, 'bf16')} | {ms(r, 'rw', 'rw_pk')} | {speedup} "
                   f"| {ms(r, 'rwf', 'rwf_pk')} | {ms(r, 'loop')} / {ms(r, 'graph', 'graph_pk')} "
                   f"| {ms(r, 'q_act')} / {ms(r, 'q_w')} | {ms(r, 'qb_act')} / {ms(r, 'qb_w')} |")
    return "\n".join(out)


def table(rows, flops_of):
    out = ["| shape | routing | mok fwd ms | torch fwd ms | fwd speed-up | mok fwd TFLOP/s (% peak) "
           "| mok fwd+bwd ms | torch fwd+bwd ms | fwd+bwd speed-up | mok fwd+bwd TFLOP/s (% peak) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for (shape, routing), r in rows.items():
        m, t = r["mok"], r["torch"]
        f = flops_of(shape)
        fwd_tf, fb_tf = f / (m["fwd"] * 1e9), 3 * f / (m["fb"] * 1e9)
        out.append(f"| {shape} | {routing} | {m['fwd']:.2f} | {t['fwd']:.2f} | {t['fwd'] / m['fwd']:.2f}× "
                   f"| {fwd_tf:.0f} ({100 * fwd_tf / m['peak']:.0f}%) | {m['fb']:.2f} | {t['fb']:.2f} "
                   f"| {t['fb'] / m['fb']:.2f}× | {fb_tf:.0f} ({100 * fb_tf / m['peak']:.0f}%) |")
    return "\n".join(out)




def flops(shape):
    H, I, _, k, T = SHAPES[shape]
    return 6.0 * T * k * H * I


def chart(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = [s for s in SHAPES if (s, "uniform") in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    # Only the routings measured beside torch get bars (a call may run the baseline on balanced only).
    series = [(routing, what, label) for routing, what, label in [
        ("uniform", "fwd", "fwd, balanced"), ("zipf", "fwd", "fwd, Zipf"),
        ("uniform", "fb", "fwd+bwd, balanced"), ("zipf", "fb", "fwd+bwd, Zipf")]
        if any((s, routing) in rows for s in shapes)]
    width = 0.8 / len(series)
    top = 0.0
    for i, (routing, what, label) in enumerate(series):
        speedup = [rows[(s, routing)]["torch"][what] / rows[(s, routing)]["mok"][what]
                   if (s, routing) in rows else 0 for s in shapes]
        left.bar([x + (i - (len(series) - 1) / 2) * width for x in range(len(shapes))], speedup, width, label=label)
        top = max([top, *speedup])
    left.set_ylim(0, 1.35 * max(top, 1.6))  # room for the legend above the bars
    left.axhline(1.0, color="black", linewidth=0.8)
    left.axhline(1.6, color="gray", linestyle="--", linewidth=0.8, label="target fwd 1.6×")
    left.axhline(1.5, color="gray", linestyle=":", linewidth=0.8, label="target fwd+bwd 1.5×")
    left.set_xticks(range(len(shapes)), shapes, rotation=20)
    left.set_ylabel("speed-up over deterministic torch grouped_mm (×)")
    left.set_title("mok vs PyTorch 2.11 (same device call)")
    left.legend(fontsize=8)
    for i, (what, label, scale) in enumerate([("fwd", "fwd", 1), ("fb", "fwd+bwd", 3)]):
        pct = [100 * scale * flops(s) / (rows[(s, "uniform")]["mok"][what] * 1e9) / rows[(s, "uniform")]["mok"]["peak"]
               for s in shapes]
        right.bar([x + (i - 0.5) * 0.35 for x in range(len(shapes))], pct, 0.35, label=f"mok {label}")
    right.axhline(70, color="gray", linestyle="--", linewidth=0.8, label="target fwd 70% (kimi-k2)")
    right.axhline(60, color="gray", linestyle=":", linewidth=0.8, label="target fwd+bwd 60% (kimi-k2)")
    right.set_ylim(0, 100)
    right.set_xticks(range(len(shapes)), shapes, rotation=20)
    right.set_ylabel("% of the measured bf16 matmul peak (cuBLAS 8192³)")
    right.set_title("mok, balanced routing")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("log")
    p.add_argument("--png")
    args = p.parse_args()
    rows = parse(args.log)
    rows8 = parse_fp8(args.log)
    if not rows and not rows8:
        sys.exit(f"report.py: no mok/torch row pairs and no fp8 rows in {args.log}")
    if rows:
        print(table(rows, flops))
    if rows8:
        print("\n" if rows else "", end="")
        print(fp8_table(rows8))
    if args.png and rows:
        chart(rows, args.png)


if __name__ == "__main__":
    main()
