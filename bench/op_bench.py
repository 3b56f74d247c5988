"""mok through its PyTorch op beside the deterministic torch layer, in one process (docs/benchmarks.md).

Per shape: the forward (no_grad, which mok.moe runs in recompute mode: no saved activations, no h written;
before session 64 the saving mode's forward) and forward+backward (autograd through mok.moe: mok::forward, then
mok::backward_consuming, under --compile mok::backward, with --accumulate mok::backward_accumulate; the weight
gradients written in bf16 by its epilogue) timed with CUDA events
(median of --runs after --warmup, inputs rotated over --sets), the peak memory of each step
(torch.cuda.max_memory_allocated over the step, minus what was allocated before it), and the same for
bench/torch_baseline.py's grouped_mm layer. Both get the same given routing (uniform or Zipf), or with
--routing router each runs its own router (softmax top-k, renormalized: mok's chains, torch's logits one
fp32 matmul that saves the bf16 x, RouterLogits), and with --shared the same shared expert. % of peak:
against the bf16 8192^3 peak, fp8 against twice it.
Then the op's own cost: per call on a small problem, eager op against the same op replayed from a
CUDA graph (which has no host work), and the host time to enqueue one call.

    python3 bench/op_bench.py [--shape NAME|all] [--routing uniform|zipf|router] [--runs 20] [--ring-rows R] [--fp8]
                              [--accumulate [fp32|bf16]] [--recompute] [--shared] [--compile]
    python3 bench/op_bench.py --kernel-times [--shape NAME] [--values normal|uniform]
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import mok
from shapes import SHAPES
from torch_baseline import matmul_peak_tflops, median_ms, moe as torch_moe, routing as draw_routing


def peak_mib(step):
    """Peak memory of one step above what was allocated before it, in MiB."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step(0)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def draw(shape, std, values="normal"):
    """Random values of standard deviation std: normal, or uniform (mok-bench's inputs, ref::make_problem)."""
    if values == "uniform":
        return (torch.rand(shape, device="cuda") * 2 - 1) * (std * 3**0.5)
    return torch.randn(shape, device="cuda") * std


def mok_layer(H, I, E, k, precision="bf16", values="normal", shared_intermediate=0):
    """The layer's config and weights; uniform values in ref::make_problem's ranges (the router's twice the
    experts')."""
    config = mok.MoEConfig(experts=E, hidden=H, intermediate=I, top_k=k, precision=precision,
                           shared_intermediate=shared_intermediate)
    router = draw((E, H), (2 if values == "uniform" else 1) / H**0.5, values).requires_grad_()
    w1 = draw((E, 2 * I, H), 1 / H**0.5, values).bfloat16().requires_grad_()
    w2 = draw((E, H, I), 1 / I**0.5, values).bfloat16().requires_grad_()
    return config, router, w1, w2


# Where each --accumulate mode puts the weight gradients.
GRADIENTS = {None: "into .grad by autograd", "fp32": "added into fp32 accumulators (accumulate_into)",
             "bf16": "added into the weights' bf16 .grad by the backward (accumulate_into)"}


def grad_accumulators(accumulate, router, w1, w2, shared=None):
    """accumulate_into for an --accumulate mode: fp32 zeros, or the weights' own bf16 .grad (made here), as
    a step of gradient accumulation over micro-batches, and the router's fp32 zeros where it routes (router
    not None); None: autograd adds the gradients into .grad."""
    weights = (w1, w2, *(shared or ()))
    if accumulate == "fp32":
        acc = [torch.zeros_like(t, dtype=torch.float32) for t in weights]
    elif accumulate == "bf16":
        for t in weights:
            t.grad = torch.zeros_like(t)
        acc = [t.grad for t in weights]
    else:
        return None
    router_acc = torch.zeros_like(router) if router is not None else None
    return mok.GradAccumulators(router_acc, acc[0], acc[1], tuple(acc[2:]) if shared else None)


class RouterLogits(torch.autograd.Function):
    """torch's router logits in fp32, x [T, H] bf16 saved rather than its fp32 copy (as Megatron-Core's
    RouterGatingLinearFunction), so that torch's peaks hold no more for the router than mok's."""

    @staticmethod
    def forward(ctx, x, router):
        ctx.save_for_backward(x, router)
        return x.float() @ router.t()

    @staticmethod
    def backward(ctx, d_logits):
        x, router = ctx.saved_tensors
        return (d_logits @ router).to(x.dtype), d_logits.t() @ x.float()


def shared_expert(x, s1, s2):
    """torch's shared expert beside its routed layer: SwiGLU(x s1) s2, s1 [H, 2Is], s2 [Is, H]."""
    gate, up = (x @ s1).chunk(2, dim=-1)
    return (F.silu(gate) * up) @ s2


def compiled(layer, compile, fullgraph):
    """The layer as called: itself, or with --compile through torch.compile (compiled at the first warm-up
    call, so no timed step compiles)."""
    return torch.compile(layer, fullgraph=fullgraph) if compile else layer


def time_shape(name, args, peak):
    if args.compile:  # each shape's compiled steps anew: a shape's config is a constant of its graphs, and one
        torch.compiler.reset()  # code object's recompiles across the six shapes would pass Dynamo's limit
    H, I, E, k, T = SHAPES[name]
    Is = I if args.shared else 0  # one shared expert as wide as a routed one
    gen = torch.Generator().manual_seed(2026)
    config, router, w1, w2 = mok_layer(H, I, E, k, "fp8" if args.fp8 else "bf16", shared_intermediate=Is)
    shared = (draw((2 * Is, H), 1 / H**0.5).bfloat16().requires_grad_(),
              draw((H, Is), 1 / Is**0.5).bfloat16().requires_grad_()) if Is else None
    # The fp8 mode's weights, quantized once as after an optimizer step (not in the steps' times or peaks):
    # the forward and its backward read them.
    fp8_weights = mok.quantize_weights(w1, w2, config=config, shared=shared, tokens_per_rank=T,
                                       ring_rows=args.ring_rows, recompute=args.recompute) if args.fp8 else None
    tw1 = (torch.randn(E, H, 2 * I, device="cuda") / H**0.5).bfloat16().requires_grad_()
    tw2 = (torch.randn(E, I, H, device="cuda") / I**0.5).bfloat16().requires_grad_()
    ts = tuple(t.detach().t().contiguous().requires_grad_() for t in shared) if Is else None
    routes = args.routing == "router"  # each layer its own router; else both the same given routing
    trouter = router.detach().clone().requires_grad_() if routes else None
    sets = []
    for _ in range(args.sets):
        x = torch.randn(T, H, device="cuda").bfloat16().requires_grad_()
        idx, w = None, None
        if not routes:
            idx, w = draw_routing(T, E, k, args.routing, gen)
            idx, w = idx.contiguous(), w.float().contiguous()
        sets.append((x, torch.randn(T, H, device="cuda").bfloat16(), idx, w))

    accumulators = grad_accumulators(args.accumulate, router if routes else None, w1, w2, shared)

    def mok_call_of(x, idx, w, accumulate_into):
        routing = {} if routes else {"routing": (idx, w), "replay": "full"}
        return mok.moe(x, router, w1, w2, config=config, shared=shared, **routing, ring_rows=args.ring_rows,
                       recompute=args.recompute, fp8_weights=fp8_weights, accumulate_into=accumulate_into)

    mok_call = compiled(mok_call_of, args.compile, fullgraph=True)

    def mok_step(i, backward):
        x, dy, idx, w = sets[i % len(sets)]
        if not backward:
            with torch.no_grad():
                mok_call(x, idx, w, None)
            return
        mok_call(x, idx, w, accumulators).backward(dy)

    def torch_layer(x, idx, w):
        if routes:  # softmax over the fp32 logits, top-k, renormalized: mok's default router
            w, idx = torch.softmax(RouterLogits.apply(x, trouter), dim=-1).topk(k, dim=-1)
            w, idx = w / w.sum(-1, keepdim=True), idx.int()
        y = torch_moe(x, tw1, tw2, idx, w)
        return y + shared_expert(x, *ts) if Is else y

    # The routing's bincount has a size that depends on the data: a graph break, so not fullgraph.
    torch_call = compiled(torch_layer, args.compile, fullgraph=False)

    def torch_step(i, backward):
        x, dy, idx, w = sets[i % len(sets)]
        if not backward:
            with torch.no_grad():
                torch_call(x, idx, w)
            return
        torch_call(x, idx, w).backward(dy)

    row = {}
    for who, step in (("mok", mok_step), ("torch", torch_step)):
        row[who] = (median_ms(lambda i: step(i, False), args.warmup, args.runs),
                    median_ms(lambda i: step(i, True), args.warmup, args.runs),
                    peak_mib(lambda i: step(i, False)), peak_mib(lambda i: step(i, True)))
    flops = 6.0 * T * (k * I + Is) * H
    (mf, mb, mmf, mmb), (tf, tb, tmf, tmb) = row["mok"], row["torch"]
    print(f"{name:15} {args.routing:8} {mf:8.2f} {tf:8.2f} {tf / mf:6.2f}x {mb:9.2f} {tb:9.2f} {tb / mb:6.2f}x "
          f"{100 * flops / (mf * 1e9) / peak:6.1f}% {100 * 3 * flops / (mb * 1e9) / peak:6.1f}% "
          f"{mmf:9.0f} {tmf:9.0f} {mmb:9.0f} {tmb:9.0f}", flush=True)
    if args.fp8:
        print(f"  {name}: fp8, the quantized weights (W and W^T, held beside the steps) "
              f"{fp8_weights.numel() / 2**20:.0f} MiB", flush=True)
    else:  # what the op allocates in a forward, by the layer's own sizes: beside the peak, nothing is added
        ints, floats = config.pack(tokens_per_rank=T)
        # The forward column's steps run under no_grad, which the op runs in recompute mode (mok.moe).
        ws_forward = mok._C.workspace_bytes(ints, floats, mok.config.pack_launch(args.ring_rows, recompute=True))[0]
        # The f+b step's backward: autograd's mok::backward_consuming (compiled: mok::backward), or
        # mok::backward_accumulate.
        ws_backward = mok._C.workspace_bytes(ints, floats, mok.config.pack_launch(
            args.ring_rows, recompute=args.recompute))[3 if args.accumulate else 1 if args.compile else 2]
        logits = T * E * 4 if routes else 0  # [T, E] fp32: an output, saved for the backward; d logits as large
        returned = T * H * 2 + 2 * T * k * 4 + logits
        outputs = mok._C.saved_bytes(ints, floats, args.recompute) + returned  # the f+b step's forward
        forward_outputs = mok._C.saved_bytes(ints, floats, True) + returned
        print(f"  {name}: the layer's forward bytes under no_grad (workspace {ws_forward / 2**20:.0f} + saved and "
              f"outputs {forward_outputs / 2**20:.0f}) = {(ws_forward + forward_outputs) / 2**20:.0f} MiB; backward "
              f"workspace {ws_backward / 2**20:.0f} MiB", flush=True)
        # The f+b step's peak against the op's own tensors at the backward: what autograd or the op adds
        # beyond them (a zero gradient of saved's size did, before session 17: docs/benchmarks.md).
        # A given routing (replay="full") gives the router no gradient; with its own, its fp32 one.
        gradients = T * H * 2 + T * k * 4 + logits  # dx, d topk_w, d logits
        gradients += 0 if args.accumulate else 2 * sum(t.numel() for t in (w1, w2, *(shared or ())))
        gradients += 4 * router.numel() if routes and not args.accumulate else 0
        print(f"  {name}: f+b peak beyond saved and outputs, the backward workspace and the input and weight "
              f"gradients: {mmb - (outputs + ws_backward + gradients) / 2**20:.0f} MiB", flush=True)
    del router, trouter, w1, w2, shared, tw1, tw2, ts, sets, fp8_weights, accumulators
    torch.cuda.empty_cache()


def op_overhead(args):
    """The op's cost per call on a small problem: eager minus graph replay, and host enqueue time."""
    H, I, E, k, T = 2048, 1024, 64, 8, 256
    config, router, w1, w2 = mok_layer(H, I, E, k)
    x = torch.randn(T, H, device="cuda").bfloat16()
    idx, w = draw_routing(T, E, k, "uniform", torch.Generator().manual_seed(1))
    idx, w = idx.contiguous(), w.float().contiguous()
    with torch.no_grad():
        call = lambda: mok.moe(x, router, w1, w2, config=config, routing=(idx, w), replay="full")  # noqa: E731
        for _ in range(10):
            call()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        eager = median_ms(lambda i: call(), args.warmup, 200)
        replay = median_ms(lambda i: graph.replay(), args.warmup, 200)
        # The op alone, its lists packed once: what mok.moe adds in Python is the difference.
        ints, floats = config.pack(tokens_per_rank=T)
        op_args = (x, router, None, w1, w2, None, None, idx, w, ints, floats, 2, mok.config.pack_launch())
        op = lambda: torch.ops.mok.forward(*op_args)  # noqa: E731
        host, host_op = host_us(call), host_us(op)
        with torch.enable_grad():  # a training call: the autograd Function records the backward
            trained = w1.detach().requires_grad_()
            host_grad = host_us(lambda: mok.moe(x, router, trained, w2, config=config, routing=(idx, w),
                                                replay="full"))
        # A yardstick from the same host: one elementwise kernel through the dispatcher from Python.
        small = torch.ones(16, device="cuda")
        host_add = host_us(lambda: torch.add(small, 1))
    print(f"op overhead (H {H}, I {I}, E {E}, k {k}, T {T}): eager {eager * 1e3:.1f} us, graph replay "
          f"{replay * 1e3:.1f} us, difference {(eager - replay) * 1e3:.1f} us per call; host enqueue "
          f"{host:.1f} us (mok.moe), {host_op:.1f} us (torch.ops.mok.forward alone), {host_grad:.1f} us "
          f"(mok.moe under autograd, w1 requiring grad), {host_add:.1f} us "
          "(torch.add of 16 floats, the host's yardstick) (medians of 200)", flush=True)
    if args.host_profile:
        with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(100):
                op()
            torch.cuda.synchronize()
        print("host time of 100 calls of torch.ops.mok.forward, by operator (torch.profiler, CPU):")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12), flush=True)


def host_us(call, n=200):
    """Median host time to enqueue one call, from an idle device, in microseconds."""
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def kernel_times(args):
    """One shape's op forward (no_grad) and forward+backward (autograd) with each --accumulate mode's
    weight gradients, one after another: every device kernel's time (torch.profiler) beside the step's
    CUDA-event time, and the forward's CUDA-graph replay, to tell a slower kernel from work around it."""
    name = "olmoe" if args.shape == "all" else args.shape
    H, I, E, k, T = SHAPES[name]
    config, router, w1, w2 = mok_layer(H, I, E, k, values=args.values)
    std = 3**-0.5 if args.values == "uniform" else 1.0
    x = draw((T, H), std, args.values).bfloat16().requires_grad_()
    dy = draw((T, H), std, args.values).bfloat16()
    idx, w = draw_routing(T, E, k, "uniform", torch.Generator().manual_seed(1))
    idx, w = idx.contiguous(), w.float().contiguous()
    moe = lambda acc=None: mok.moe(x, router, w1, w2, config=config, routing=(idx, w),  # noqa: E731
                                   replay="full", ring_rows=args.ring_rows, accumulate_into=acc)

    def forward():
        with torch.no_grad():
            moe()

    def back_to_back_ms(step, n=10):
        """Mean of n steps enqueued back to back (no idle device between them, unlike median_ms)."""
        step()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            step()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / n

    def profile(step, what):
        events = median_ms(lambda i: step(), args.warmup, args.runs)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        print(f"{name} op {what}: events {events:.3f} ms (back to back {back_to_back_ms(step):.3f} ms); "
              "device kernels per step:")
        for e in prof.key_averages():
            if e.device_time_total > 0:
                print(f"  {e.key[:60]:60} {e.count / 5:4.1f} per step, "
                      f"{e.device_time_total / e.count / 1e3:8.3f} ms each")

    profile(forward, "forward")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forward()
    print(f"{name} op forward: graph replay {median_ms(lambda i: graph.replay(), args.warmup, args.runs):.3f} ms")

    def forward_backward(acc):
        x.grad = None  # dx is the step's own (no add into x.grad in every mode's profile)
        moe(acc).backward(dy)

    for accumulate in GRADIENTS:
        w1.grad = w2.grad = None
        acc = grad_accumulators(accumulate, None, w1, w2)
        profile(lambda: forward_backward(acc), f"forward+backward, weight gradients {GRADIENTS[accumulate]}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="all")
    p.add_argument("--routing", default="uniform", choices=["uniform", "zipf", "router"],
                   help="a given routing for both layers (uniform, Zipf-skewed), or router: each its own")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--sets", type=int, default=3)
    p.add_argument("--ring-rows", type=int, default=0, help="the backward's dy ring (0: the layer's default)")
    p.add_argument("--fp8", action="store_true",
                   help="mok in the fp8 mode, its weights quantized once beforehand (torch's layer stays bf16)")
    p.add_argument("--accumulate", nargs="?", const="fp32", choices=["fp32", "bf16"],
                   help="mok's backward adds the weight gradients (accumulate_into) into fp32 accumulators, or "
                   "into the weights' bf16 .grad (bf16)")
    p.add_argument("--shared", action="store_true",
                   help="one shared expert as wide as a routed one (as DeepSeek-V3's and Kimi-K2's), in both layers")
    p.add_argument("--recompute", action="store_true",
                   help="mok's backward pulls xe and recomputes h and a (saved holds none: less memory between the passes)")
    p.add_argument("--compile", action="store_true",
                   help="both layers' steps through torch.compile (mok's fullgraph; under a trace its autograd "
                   "backward keeps dh in its workspace: docs/python.md); the columns the same, the op's overhead eager")
    p.add_argument("--host-profile", action="store_true",
                   help="also the op's host time by operator (torch.profiler) on the small problem")
    p.add_argument("--kernel-times", action="store_true",
                   help="only the device-kernel profile of one shape's op steps (--shape; all: olmoe)")
    p.add_argument("--values", default="normal", choices=["normal", "uniform"],
                   help="--kernel-times' weights and inputs: normal, or uniform as mok-bench's (ref::make_problem)")
    args = p.parse_args()
    if args.values != "normal" and not args.kernel_times:
        p.error("--values applies to --kernel-times")
    if args.kernel_times and args.routing != "uniform":
        p.error("--kernel-times profiles a uniform given routing")
    if args.kernel_times and (args.fp8 or args.accumulate or args.recompute or args.shared or args.compile):
        p.error("--kernel-times profiles the bf16 op without recompute, a shared expert or torch.compile, in every "
                "--accumulate mode")
    torch.use_deterministic_algorithms(True)
    # Without its NaN fill of new tensors (no bit depends on it; mok's op skips it): torch_baseline.py's note.
    torch.utils.deterministic.fill_uninitialized_memory = False
    if args.kernel_times:
        kernel_times(args)
        return
    peak = matmul_peak_tflops()
    print(f"bf16 matmul peak (torch 8192^3, random data): {peak:.0f} TFLOP/s"
          f"{'; fp8 %pk against twice it (E4M3 runs at twice the bf16 rate, as mok-bench counts)' if args.fp8 else ''}")
    if args.fp8:
        peak *= 2
    print(f"mok: {'fp8' if args.fp8 else 'bf16'}, weight gradients {GRADIENTS[args.accumulate]}"
          f"{', a shared expert of width I in both layers' if args.shared else ''}"
          f"{', recompute (the backward pulls xe and recomputes h and a)' if args.recompute else ''}"
          f"{'; both layers through torch.compile' if args.compile else ''}")
    print(f"{'shape':15} {'routing':8} {'mok fwd':>8} {'torch':>8} {'speed':>7} {'mok f+b':>9} {'torch':>9} "
          f"{'speed':>7} {'fwd%pk':>7} {'f+b%pk':>7} {'MiB fwd':>9} {'torch':>9} {'MiB f+b':>9} {'torch':>9}")
    for name in SHAPES:
        if args.shape in ("all", name):
            time_shape(name, args, peak)
    # The op's host cost, once per session (the small problem is olmoe's layer): the same calls in both
    # precisions, so the bf16 run measures it.
    if args.shape in ("all", "olmoe") and not args.fp8:
        op_overhead(args)


if __name__ == "__main__":
    main()
