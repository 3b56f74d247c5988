"""The baseline of docs/design.md (performance protocol): a torchtitan-style MoE layer on torch.nn.functional.grouped_mm in
deterministic mode, bf16, timed forward and forward+backward with CUDA events (median of --runs after
--warmup, inputs rotated over several sets so the L2 cache does not flatter), plus the bf16 matmul
peak measured in the same process, and the layer's two grouped GEMMs alone (inputs already
permuted: no routing, permutation, SwiGLU or combine), the floor a fused forward must reach. Prints
one table row per shape and routing.

    python3 bench/torch_baseline.py [--shape NAME|all] [--routing uniform|zipf] [--runs 20]
"""
import argparse
import statistics

import torch
import torch.nn.functional as F

from shapes import SHAPES



def routing(T, E, k, kind, gen):
    """k distinct experts per token: uniform, or Zipf(1.2) over expert ids; weights normalised."""
    probs = torch.ones(E) if kind == "uniform" else 1.0 / torch.arange(1, E + 1, dtype=torch.float64) ** 1.2
    idx = torch.multinomial(probs.float().expand(T, E), k, replacement=False, generator=gen)
    w = torch.rand(T, k, generator=gen) + 0.05
    return idx.int().cuda(), (w / w.sum(1, keepdim=True)).cuda()


def moe(x, w1, w2, idx, w):
    """y = sum_j w_j * SwiGLU_e_j(x); w1 [E, H, 2I], w2 [E, I, H] (grouped_mm's layout)."""
    T, k = idx.shape
    flat = idx.flatten()
    order = torch.argsort(flat, stable=True)
    offs = torch.cumsum(torch.bincount(flat, minlength=w1.shape[0]), 0).to(torch.int32)
    h = F.grouped_mm(x[order // k], w1, offs=offs)
    gate, up = h.chunk(2, dim=-1)
    ys = F.grouped_mm(F.silu(gate) * up, w2, offs=offs)
    slots = torch.empty_like(ys)
    slots[order] = ys
    return (slots.view(T, k, -1).float() * w.unsqueeze(-1)).sum(1).to(x.dtype)


def gemm_operands(x, idx, E, I):
    """The grouped GEMMs' inputs without the layer around them: x's rows in expert order, a random
    [N k, I] intermediate, and the groups' ends."""
    flat = idx.flatten()
    order = torch.argsort(flat, stable=True)
    offs = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
    xs = x.detach()[order // idx.shape[1]].contiguous()
    return xs, torch.randn(xs.shape[0], I, device="cuda").bfloat16(), offs


def median_ms(fn, warmup, runs):
    for _ in range(warmup):
        fn(0)
    times = []
    for i in range(runs):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(i)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def matmul_peak_tflops():
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = median_ms(lambda i: a @ b, 3, 10)
    return 2 * n**3 / (ms * 1e9)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="all")
    p.add_argument("--routing", default="uniform", choices=["uniform", "zipf"])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--sets", type=int, default=3, help="input sets rotated between runs")
    args = p.parse_args()
    torch.use_deterministic_algorithms(True)
    peak = matmul_peak_tflops()
    print(f"bf16 matmul peak (torch 8192^3, random data): {peak:.0f} TFLOP/s")
    print(f"{'shape':15} {'routing':8} {'fwd ms':>9} {'fwd+bwd ms':>11} {'fwd TF/s':>9} {'f+b TF/s':>9} {'fwd %pk':>8} "
          f"{'GEMMs ms':>9} {'GEMMs %pk':>9}")
    gen = torch.Generator().manual_seed(2026)
    for name, (H, I, E, k, T) in SHAPES.items():
        if args.shape not in ("all", name):
            continue
        w1 = (torch.randn(E, H, 2 * I, device="cuda") / H**0.5).bfloat16().requires_grad_()
        w2 = (torch.randn(E, I, H, device="cuda") / I**0.5).bfloat16().requires_grad_()
        sets = []
        for _ in range(args.sets):
            x = torch.randn(T, H, device="cuda").bfloat16().requires_grad_()
            sets.append((x, torch.randn(T, H, device="cuda").bfloat16(), *routing(T, E, k, args.routing, gen)))

        def forward(i):
            x, _, idx, w = sets[i % len(sets)]
            with torch.no_grad():
                moe(x, w1, w2, idx, w)

        def forward_backward(i):
            x, dy, idx, w = sets[i % len(sets)]
            moe(x, w1, w2, idx, w).backward(dy)

        gemm_sets = [gemm_operands(x, idx, E, I) for x, _, idx, _ in sets]

        def gemms_alone(i):
            xs, a, offs = gemm_sets[i % len(gemm_sets)]
            with torch.no_grad():
                F.grouped_mm(xs, w1, offs=offs)
                F.grouped_mm(a, w2, offs=offs)

        fwd = median_ms(forward, args.warmup, args.runs)
        fb = median_ms(forward_backward, args.warmup, args.runs)
        gemms = median_ms(gemms_alone, args.warmup, args.runs)
        flops = 6.0 * T * k * H * I
        print(f"{name:15} {args.routing:8} {fwd:9.2f} {fb:11.2f} {flops / (fwd * 1e9):9.1f} "
              f"{3 * flops / (fb * 1e9):9.1f} {100 * flops / (fwd * 1e9) / peak:7.1f}% {gemms:9.2f} "
              f"{100 * flops / (gemms * 1e9) / peak:8.1f}%", flush=True)
        del w1, w2, sets, gemm_sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
