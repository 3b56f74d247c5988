"""The baseline of docs/design.md (performance protocol): a torchtitan-style MoE layer on torch.nn.functional.grouped_mm in
deterministic mode, bf16, timed forward and forward+backward with CUDA events (median of --runs after
--warmup, inputs rotated over several sets so the L2 cache does not flatter), plus the bf16 matmul
peak measured in the same process, and the layer's two grouped GEMMs alone (inputs already
permuted: no routing, permutation, SwiGLU or combine), the floor a fused forward must reach. Prints
one table row per shape and routing.

--fp8 (issue 19) adds, per shape, the same two forward GEMMs in E4M3 through PyTorch's FP8 paths,
after the bf16 row: an "fp8 ..." row (format: FP8_LEGEND below; bench/report.py prints it as its own
table), an "fp8-check ..." line with the numerical check each variant passed before it was timed, and
the FP8 dense peak (torch._scaled_mm, 8192^3 E4M3) once. It needs sm_90 and torch._scaled_grouped_mm,
and says why it skips otherwise. --self-test runs the FP8 code path on the CPU (no GPU): quantizers,
the operands' layouts against torch's own checks, the numerical check and its negative control.

    python3 bench/torch_baseline.py [--shape NAME|all] [--routing uniform|zipf] [--runs 20] [--fp8]
    python3 bench/torch_baseline.py --self-test
"""
import argparse
import statistics
import sys

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
    return xs, torch.randn(xs.shape[0], I, device=x.device).bfloat16(), offs


def median_ms(fn, warmup, runs, prepare=lambda: None):
    """fn(i)'s median time over `runs` after `warmup` calls; prepare() before each, untimed."""
    for _ in range(warmup):
        prepare()
        fn(0)
    times = []
    for i in range(runs):
        prepare()
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


# ---------------------------------------------------------------------------------------------------
# FP8 (issue 19): the forward's two grouped GEMMs with E4M3 operands through PyTorch's FP8 paths.
#
# What torch 2.11 offers for FP8 grouped GEMMs on sm_90 (from its sources; probe_grouped_blockwise
# asks the installed torch again at run time):
# - torch._scaled_grouped_mm(mat_a, mat_b, scale_a, scale_b, offs, out_dtype=bf16, use_fast_accum):
#   E4M3 operands and fp32 row-wise scales only: for the MoE case (2-D mat_a [M, K] grouped by rows
#   through offs, 3-D mat_b [E, K, N]) scale_a is [M] (one per row of mat_a, contiguous) and scale_b
#   [E, N] (one per expert and output column, stride 1 along N); mat_a row-major, mat_b column-major
#   (the transposed view of a contiguous [E, N, K]); K and N multiples of 16; offs 1-D int32, the
#   groups' cumulative ends (empty groups allowed); bf16 output only; no bias, no scale_result; at most
#   1023 groups. The kernel is CUTLASS's sm_90 pointer-array grouped GEMM with the scales in the
#   epilogue (f8f8bf16_grouped_mm, ScaledGroupMM.cu); use_fast_accum picks CUTLASS's FP8FastAccum
#   schedule (no periodic promotion of the tensor core's partial sums to fp32) or not.
#   Sources: aten/src/ATen/native/cuda/GroupedBlas.cpp (_scaled_grouped_mm_cuda,
#   _scaled_grouped_mm_cuda_v2, _check_scales_fp8_rowwise), ScaledGroupMM.cu, GroupMMCommon.cuh
#   (prepare_grouped_gemm_data), torch/_meta_registrations.py (_meta_grouped_mm_common, which repeats
#   the checks), torch/testing/_internal/common_cuda.py (PLATFORM_SUPPORTS_FP8_GROUPED_GEMM = SM90OrLater
#   and not SM100OrLater), test/test_scaled_matmul_cuda.py (test_scaled_grouped_gemm_2d_3d).
# - torch.nn.functional.scaled_grouped_mm (ScalingType, SwizzleType; aten _scaled_grouped_mm_v2)
#   dispatches to rowwise_rowwise, mxfp8_mxfp8, mxfp4_mxfp4 and nvfp4_nvfp4 only
#   (GroupedBlas.cpp, scale_grouped_kernel_dispatch; the MX/NV ones are sm_100 MSLK kernels): there is
#   no block-scaled (BlockWise1x128 x BlockWise128x128) grouped GEMM, the recipe mok implements.
# - Dense torch._scaled_mm does take DeepSeek's (1x128, 128x128) block scales on sm_90 (cuBLASLt >= 12.9;
#   ScaledBlas.cpp: _check_deepseek_support, is_blockwise_1x128_scaling, is_blockwise_128x128_scaling),
#   so that recipe is measured as a loop of per-expert _scaled_mm calls (eager, and replayed from a CUDA
#   graph, which removes the host's launch cost of 2 E calls).
# Quantization follows mok's rule (docs/numerics.md): power-of-two scales, the largest element of a
# block in [224, 448]; for the row-wise recipe the block is a row (of x, a, or of W's output columns).
E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
FP8_TOL = 1e-2       # relative error (Frobenius) against the bf16 product of the dequantized operands
FP8_TOL_FAST = 5e-2  # use_fast_accum=True: no fp32 promotion, the error grows with K; a layout bug is O(1)
FP8_KEYS = ("rw", "rw_pk", "rwf", "rwf_pk", "loop", "graph", "graph_pk", "q_act", "q_w", "qb_act", "qb_w",
            "bf16")
FP8_LEGEND = (
    "fp8-legend: ms of the forward's two grouped GEMMs (x_e W1^T with W1 [E, 2I, H], then a W2^T with "
    "W2 [E, H, I]; rows in expert order as for 'GEMMs ms'), E4M3 operands quantized beforehand, bf16 out; "
    "%pk8 = % of the fp8 matmul peak above. rw: torch._scaled_grouped_mm, row-wise fp32 scales (per row "
    "of x_e and a, per expert and output column of W); rw-fast: the same with use_fast_accum=True; "
    "blk-loop, blk-graph: (1x128, 128x128) block scales (mok's recipe; torch has no block-scaled grouped "
    "GEMM) as one torch._scaled_mm per expert and GEMM, eager / replayed from a CUDA graph; q-act: "
    "quantizing x [T, H] and a [T k, I], q-W: W1 and W2, with torch ops (amax, power-of-two scale, cast), "
    "row-wise; qb-act, qb-W: the same in 1x128 / 128x128 blocks; bf16: this process's bf16 'GEMMs ms'. "
    "'-': not available or its check failed (see fp8-check).")
FP8_HEADER = (f"{'fp8':3} {'shape':15} {'routing':8} {'rw ms':>8} {'%pk8':>6} {'rw-fast':>8} {'%pk8':>6} "
              f"{'blk-loop':>8} {'blk-grph':>8} {'%pk8':>6} {'q-act':>7} {'q-W':>7} {'qb-act':>7} "
              f"{'qb-W':>7} {'bf16 ms':>8}")


def _exp2i(e):
    """2^e as fp32, exactly, for integer e in [-126, 127] (built from the exponent bits)."""
    return ((e.to(torch.int32) + 127) << 23).view(torch.float32)


def pow2_scale(amax):
    """mok's block scale (docs/numerics.md, e4m3_scale_exponent): 2^e, e the smallest integer >= -126
    with amax * 2^-e <= 448 (at most 120; an all-zero block gets 2^0, as mok's). fp32, exact."""
    amax = amax.float()
    _, ex = torch.frexp(amax / E4M3_MAX)  # amax / 448 in [2^(ex-1), 2^ex), up to the division's rounding
    e = (ex - 1).clamp(-126, 120)
    for _ in range(2):  # exact test: amax * 2^-e is exact
        e = torch.where((amax * _exp2i(-e) > E4M3_MAX) & (e < 120), e + 1, e)
    return _exp2i(torch.where(amax == 0, torch.zeros_like(e), e))


def _quantize(v, dims):
    s = pow2_scale(v.abs().amax(dim=dims, keepdim=True))
    # The division by a power of two is exact; the clamp only guards the division's edge (torch's cast
    # to E4M3 gives NaN above 464 rather than saturating).
    return (v / s).clamp_(-E4M3_MAX, E4M3_MAX).to(E4M3), s


def quant_rows(t):
    """Row-wise: one scale per row of the last dimension (x, a: per token row; W [E, N, K]: per expert
    and output column). Returns codes shaped like t and fp32 scales shaped t.shape[:-1]."""
    q, s = _quantize(t, (-1,))
    return q, s.squeeze(-1)


def quant_1x128(t):
    """[M, K] in 1 x 128 blocks along K: codes [M, K], scales [M, K/128]."""
    M, K = t.shape
    q, s = _quantize(t.reshape(M, K // 128, 128), (-1,))
    return q.reshape(M, K), s.reshape(M, K // 128)


def quant_128x128(w):
    """[E, N, K] in 128 x 128 squares: codes [E, N, K], scales [E, N/128, K/128]."""
    E, N, K = w.shape
    q, s = _quantize(w.reshape(E, N // 128, 128, K // 128, 128), (2, 4))
    return q.reshape(E, N, K), s.reshape(E, N // 128, K // 128)


def dequant_rows(q, s):
    return (q.float() * s.unsqueeze(-1)).bfloat16()  # exact: E4M3 times a power of two fits bf16


def dequant_1x128(q, s):
    M, K = q.shape
    return (q.float().reshape(M, K // 128, 128) * s.unsqueeze(-1)).reshape(M, K).bfloat16()


def dequant_128x128(q, s):
    E, N, K = q.shape
    return (q.float().reshape(E, N // 128, 128, K // 128, 128) * s[:, :, None, :, None]).reshape(E, N, K).bfloat16()


def rel_err(out, ref):
    """||out - ref|| / ||ref|| (Frobenius, fp32)."""
    out, ref = out.float(), ref.float()
    return ((out - ref).norm() / ref.norm()).item()


def check_blockwise_layouts(a, b, scale_a, scale_b):
    """Raise unless torch 2.11's _scaled_mm on sm_90 takes (a, b, scale_a, scale_b) as the
    (BlockWise1x128, BlockWise128x128) recipe: ScaledBlas.cpp's get_joint_scaling tests
    is_blockwise_1x128_scaling(a, scale_a) and is_blockwise_128x128_scaling(b.t(), scale_b.t()) (sizes
    and strides, a stride check waived where the size is 1), _scaled_gemm wants a row-major and b
    column-major (cuBLASLt's TN), _scaled_mm_out_cuda K and N multiples of 16."""
    def size_stride(s, dim, size, stride):
        return s.size(dim) == size and (size <= 1 or s.stride(dim) == stride)

    M, K = a.shape
    N = b.shape[1]
    kb, nb = -(-K // 128), -(-N // 128)
    sbt = scale_b.t()
    problems = [what for what, ok in [
        ("E4M3 operands", a.dtype == E4M3 and b.dtype == E4M3),
        ("fp32 scales", scale_a.dtype == torch.float32 and scale_b.dtype == torch.float32),
        ("a row-major", a.stride(1) == 1 and a.stride(0) >= K),
        ("b column-major", b.stride(0) == 1 and b.stride(1) >= K),
        ("K, N multiples of 16", K % 16 == 0 and N % 16 == 0),
        (f"scale_a ({M}, {kb}) with strides (1, {M})",
         scale_a.dim() == 2 and size_stride(scale_a, 0, M, 1) and size_stride(scale_a, 1, kb, M)),
        (f"scale_b.t() ({nb}, {kb}) with strides ({kb}, 1)",
         sbt.dim() == 2 and size_stride(sbt, 0, nb, kb) and size_stride(sbt, 1, kb, 1)),
    ] if not ok]
    if problems:
        raise ValueError(f"block-scaled _scaled_mm operands: need {', '.join(problems)}; got a {tuple(a.shape)} "
                         f"{a.stride()}, b {tuple(b.shape)} {b.stride()}, scale_a {tuple(scale_a.shape)} "
                         f"{scale_a.stride()}, scale_b {tuple(scale_b.shape)} {scale_b.stride()}")


def expert_blocks(q, s, bounds):
    """Per expert, the block-quantized rows [start, end) of q [M, K] (scales s [M, K/128]) as one dense
    _scaled_mm operand: rows padded with zeros to a multiple of 16 (cuBLASLt's block-scaled path asks
    for aligned M; at most 15 rows an expert, not counted as FLOPs) and the scales (M_pad, K/128) with
    strides (1, M_pad). None for an expert without rows."""
    K = q.shape[1]
    ops = []
    for start, end in bounds:
        m = end - start
        if m == 0:
            ops.append(None)
            continue
        mp = -(-m // 16) * 16
        a = torch.zeros(mp, K, dtype=torch.uint8, device=q.device).view(E4M3)
        a[:m] = q[start:end]
        sa = torch.ones(K // 128, mp, device=q.device)
        sa[:, :m] = s[start:end].t()
        ops.append((a, sa.t()))
    return ops


def scaled_mm_v2_block(a, b, scale_a, scale_b, out_dtype=torch.bfloat16):
    """torch.nn.functional.scaled_mm (the ScalingType API) with (1x128, 128x128) block scales."""
    return F.scaled_mm(a, b, scale_a, F.ScalingType.BlockWise1x128, scale_b, F.ScalingType.BlockWise128x128,
                       output_dtype=out_dtype)


def block_b_layouts(kb):
    """Ways to hand torch the block scales s [N/128, K/128] (contiguous, kb = K/128) of a B operand,
    as (name, make(s) -> scale_b, API). torch 2.11's _scaled_mm (ScaledBlas.cpp,
    is_blockwise_128x128_scaling(b.t(), scale_b.t())) asks for scale_b.t() = s with strides (kb, 1); other
    versions of that check, and F.scaled_mm's (_scaled_block1x128_block128x128), want the row stride
    rounded up to 4 floats, which may be what cuBLASLt reads. With kb a multiple of 4 (every GEMM here
    but qwen3-30b-a3b's second, K = 768) they are one layout."""
    ld = -(-kb // 4) * 4

    def padded(s):
        buf = torch.ones(s.shape[0], ld, device=s.device)
        buf[:, :kb] = s
        return buf

    return [("v1", lambda s: s.t(), "v1"),
            ("v1-padded", lambda s: padded(s)[:, :kb].t(), "v1"),
            ("v2-padded", lambda s: padded(s).t(), "v2")]


def pick_block_b_layout(K, mm8, mm8_v2, device):
    """The first of block_b_layouts(K/128) that torch accepts and computes right, tried on a 128 x 256 x K
    product against the dequantized one when the candidates differ (K/128 not a multiple of 4).
    Returns (name, make, call) and notes on the candidates refused."""
    kb = K // 128
    candidates = block_b_layouts(kb)
    calls = {"v1": mm8, "v2": mm8_v2}
    if kb % 4 == 0:
        name, make, api = candidates[0]
        return (name, make, calls[api]), []
    g = torch.Generator(device=device).manual_seed(19)
    M, N = 128, 256
    a = torch.randn(M, K, device=device, generator=g).to(E4M3)
    bq = torch.randn(N, K, device=device, generator=g).to(E4M3)  # [N, K]: b = bq.t(), column-major
    scale_a = _exp2i(torch.randint(-3, 4, (kb, M), device=device, generator=g)).t()  # (M, kb), strides (1, M)
    s = _exp2i(torch.randint(-3, 4, (N // 128, kb), device=device, generator=g))
    ref = dequant_1x128(a, scale_a).float() @ dequant_128x128(bq.unsqueeze(0), s.unsqueeze(0))[0].float().t()
    notes = []
    for name, make, api in candidates:
        call = calls[api]
        if call is None:
            continue
        try:
            err = rel_err(call(a, bq.t(), scale_a, make(s), out_dtype=torch.bfloat16), ref)
        except Exception as e:
            notes.append(f"{name} refused ({type(e).__name__}: {str(e).splitlines()[0][:100]})")
            continue
        if err < FP8_TOL:
            return (name, make, call), notes
        notes.append(f"{name} wrong (error {err:.1e})")
    raise RuntimeError(f"no layout of B's block scales for K/128 = {kb} works: {'; '.join(notes)}")


def emulated_scaled_grouped_mm(a, b, scale_a, scale_b, offs=None, out_dtype=torch.bfloat16, use_fast_accum=False,
                               misread_b=False):
    """CPU stand-in for torch._scaled_grouped_mm (2-D x 3-D, row-wise): torch's own checks on meta tensors
    of the same sizes, strides and dtypes (torch/_meta_registrations.py repeats GroupedBlas.cpp's), then
    the product in fp32 from the dequantized operands, rounded to bf16. misread_b (self-test): B used
    transposed after the checks, a layout bug that keeps square shapes."""
    def meta(t):
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")

    torch._scaled_grouped_mm(meta(a), meta(b), meta(scale_a), meta(scale_b), offs=meta(offs), out_dtype=out_dtype,
                             use_fast_accum=use_fast_accum)
    if misread_b:
        b = b.transpose(-2, -1)
    out = torch.empty(a.shape[0], b.shape[-1], dtype=out_dtype)
    start = 0
    for g, end in enumerate(offs.tolist()):
        out[start:end] = ((a[start:end].float() * scale_a[start:end, None]) @ (b[g].float() * scale_b[g])).to(out_dtype)
        start = end
    return out


def emulated_scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16, use_fast_accum=False):
    """CPU stand-in for torch._scaled_mm with (1x128, 128x128) block scales: its layout rules
    (check_blockwise_layouts), then the product in fp32 from the dequantized operands, rounded to bf16."""
    check_blockwise_layouts(a, b, scale_a, scale_b)
    return _block_product(a, b, scale_a, scale_b, out_dtype)


def _block_product(a, b, scale_a, scale_b, out_dtype):
    a_deq = dequant_1x128(a, scale_a).float()
    b_deq = dequant_128x128(b.t().unsqueeze(0), scale_b.t().unsqueeze(0))[0].float()  # [N, K]
    return (a_deq @ b_deq.t()).to(out_dtype)


def emulated_scaled_mm_v2_block(a, b, scale_a, scale_b, out_dtype=torch.bfloat16):
    """CPU stand-in for F.scaled_mm with (1x128, 128x128) scales, as ScaledBlas.cpp's
    _scaled_block1x128_block128x128 checks scale_b: (round_up(K/128, 4), N/128), strides (1, that)."""
    kb, nb = b.shape[0] // 128, b.shape[1] // 128
    ld = -(-kb // 4) * 4
    if tuple(scale_b.shape) != (ld, nb) or (nb > 1 and scale_b.stride() != (1, ld)):
        raise ValueError(f"scale_b must be ({ld}, {nb}) with strides (1, {ld}), got {tuple(scale_b.shape)} "
                         f"{scale_b.stride()}")
    return _block_product(a, b, scale_a, scale_b[:kb], out_dtype)


def fp8_unavailable():
    """Why the FP8 rows cannot run here, or None."""
    if not hasattr(torch, "_scaled_grouped_mm"):
        return f"torch {torch.__version__} has no torch._scaled_grouped_mm"
    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        return (f"the GPU is sm_{major}{minor}: torch's row-wise FP8 grouped GEMM is a CUTLASS sm_90 kernel "
                f"(PLATFORM_SUPPORTS_FP8_GROUPED_GEMM: SM90OrLater and not SM100OrLater) and its (1x128, 128x128) "
                f"block-scaled _scaled_mm is sm_90 only (_check_deepseek_support)")
    return None


def fp8_peak_tflops():
    """Dense E4M3 8192^3 through torch._scaled_mm (cuBLASLt), tensor-wise scales: (fast accumulation,
    without)."""
    n = 8192
    g = torch.Generator(device="cuda").manual_seed(19)  # its own: --fp8 leaves the bf16 rows' data as it was
    a = torch.randn(n, n, device="cuda", generator=g).to(E4M3)
    b = torch.randn(n, n, device="cuda", generator=g).to(E4M3).t()  # column-major, as _scaled_mm wants
    one = torch.ones((), device="cuda")
    peaks = []
    for fast in (True, False):
        ms = median_ms(lambda i: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, use_fast_accum=fast), 3, 10)
        peaks.append(2 * n**3 / (ms * 1e9))
    return tuple(peaks)


def probe_grouped_blockwise():
    """Does the installed torch run a grouped GEMM with (1x128, 128x128) block scales on this GPU?"""
    what = f"torch {torch.__version__}: F.scaled_grouped_mm(BlockWise1x128, BlockWise128x128)"
    if not hasattr(F, "scaled_grouped_mm") or not hasattr(F, "ScalingType"):
        return f"{what}: no such API"
    E, M, N, K = 2, 128, 256, 256
    try:
        g = torch.Generator(device="cuda").manual_seed(19)
        a = torch.randn(E * M, K, device="cuda", generator=g).to(E4M3)
        b = torch.randn(E, N, K, device="cuda", generator=g).to(E4M3).transpose(-2, -1)
        offs = torch.tensor([M, 2 * M], device="cuda", dtype=torch.int32)
        scale_a = torch.ones(K // 128, E * M, device="cuda").t()
        scale_b = torch.ones(E, N // 128, K // 128, device="cuda").transpose(-2, -1)
        F.scaled_grouped_mm(a, b, scale_a, F.ScalingType.BlockWise1x128, scale_b, F.ScalingType.BlockWise128x128,
                            offs=offs)
        torch.cuda.synchronize()
        return f"{what}: accepted (not measured by this script; the block recipe is timed as a per-expert loop)"
    except Exception as e:  # the expected answer in 2.11: "No gemm implementation was found"
        return f"{what}: refused ({type(e).__name__}: {str(e).splitlines()[0][:160]})"


def fp8_rows(dims, w1, w2, sets, gemm_sets, timer, grouped_mm8=None, mm8=None, graphs=True, mm8_v2=scaled_mm_v2_block):
    """The FP8 measurements of one shape. w1 [E, H, 2I], w2 [E, I, H] and gemm_sets as main() has them.
    timer(fn) -> ms runs fn(i) with i rotating over the sets. Each variant is checked numerically on set
    0 before it is timed (FP8_TOL) and left out ('-') if the check fails. Returns {"values": FP8_KEYS ->
    number or None, "errors": variant -> (GEMM1, GEMM2) relative errors, "notes": [str]}, without the
    %pk8 columns."""
    grouped_mm8 = grouped_mm8 or torch._scaled_grouped_mm
    mm8 = mm8 or torch._scaled_mm
    H, I, E, k, T = dims
    n = len(gemm_sets)
    bf16 = torch.bfloat16
    v, errors, notes = dict.fromkeys(FP8_KEYS), {}, []
    xs_list = [x.detach() for x, *_ in sets]  # [T, H]: x is quantized before its rows are gathered
    # The bf16 masters in mok's (and nn.Linear's) layout: W1 [E, 2I, H], W2 [E, H, I], rows = output columns.
    W1 = w1.detach().transpose(1, 2).contiguous()
    W2 = w2.detach().transpose(1, 2).contiguous()

    with torch.no_grad():
        # Row-wise scales, torch._scaled_grouped_mm. mat_b = the transposed view of [E, N, K] codes.
        W1q, sW1 = quant_rows(W1)
        W2q, sW2 = quant_rows(W2)
        W1t, W2t = W1q.transpose(1, 2), W2q.transpose(1, 2)
        row_sets = [(*quant_rows(xs), *quant_rows(a), offs) for xs, a, offs in gemm_sets]

        def rowwise(i, fast=False):
            xq, sx, aq, sa, offs = row_sets[i % n]
            return (grouped_mm8(xq, W1t, sx, sW1, offs=offs, out_dtype=bf16, use_fast_accum=fast),
                    grouped_mm8(aq, W2t, sa, sW2, offs=offs, out_dtype=bf16, use_fast_accum=fast))

        xq, sx, aq, sa, offs = row_sets[0]
        ref = (F.grouped_mm(dequant_rows(xq, sx), dequant_rows(W1q, sW1).transpose(1, 2), offs=offs),
               F.grouped_mm(dequant_rows(aq, sa), dequant_rows(W2q, sW2).transpose(1, 2), offs=offs))
        for key, fast, tol in (("rw", False, FP8_TOL), ("rwf", True, FP8_TOL_FAST)):
            errors[key] = tuple(rel_err(o, r) for o, r in zip(rowwise(0, fast), ref))
            if max(errors[key]) < tol:
                v[key] = timer(lambda i, fast=fast: rowwise(i, fast))
        del ref
        v["q_act"] = timer(lambda i: (quant_rows(xs_list[i % n]), quant_rows(gemm_sets[i % n][1])))
        v["q_w"] = timer(lambda i: (quant_rows(W1), quant_rows(W2)))
        del row_sets, W1q, W2q, W1t, W2t, sW1, sW2, xq, sx, aq, sa

        # (1x128, 128x128) block scales, one dense torch._scaled_mm per expert and GEMM.
        try:
            block_loop_rows(dims, W1, W2, gemm_sets, timer, mm8, mm8_v2, graphs, v, errors, notes)
        except Exception as e:  # the row-wise numbers stand; the reason goes to the fp8-check line
            notes.append(f"block loop not run: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        v["qb_act"] = timer(lambda i: (quant_1x128(xs_list[i % n]), quant_1x128(gemm_sets[i % n][1])))
        v["qb_w"] = timer(lambda i: (quant_128x128(W1), quant_128x128(W2)))
    return {"values": v, "errors": errors, "notes": notes}


def block_loop_rows(dims, W1, W2, gemm_sets, timer, mm8, mm8_v2, graphs, v, errors, notes):
    """fp8_rows' block-scaled part: W1 [E, 2I, H] and W2 [E, H, I] bf16 in 128 x 128 squares, x_e and a
    in 1 x 128 blocks, one _scaled_mm per expert and GEMM; fills v["loop"], v["graph"], errors["loop"]."""
    H, I, E, k, T = dims
    n = len(gemm_sets)
    bf16 = torch.bfloat16
    W1b, sW1b = quant_128x128(W1)
    W2b, sW2b = quant_128x128(W2)
    (name1, make1, call1), notes1 = pick_block_b_layout(H, mm8, mm8_v2, W1.device)
    (name2, make2, call2), notes2 = pick_block_b_layout(I, mm8, mm8_v2, W1.device)
    for K, name, refused in ((H, name1, notes1), (I, name2, notes2)):
        if refused or name != "v1":
            notes.append(f"B's block scales for K = {K}: {name}" + (f" ({'; '.join(refused)})" if refused else ""))
    w1_ops = [(W1b[e].t(), make1(sW1b[e])) for e in range(E)]  # [H, 2I] column-major and its scales
    w2_ops = [(W2b[e].t(), make2(sW2b[e])) for e in range(E)]
    blk_sets = []
    for xs, a, offs in gemm_sets:
        ends = offs.tolist()  # host copy here, outside the timed region
        bounds = list(zip([0] + ends[:-1], ends))
        xq, sx = quant_1x128(xs)
        aq, sa = quant_1x128(a)
        blk_sets.append((expert_blocks(xq, sx, bounds), expert_blocks(aq, sa, bounds), bounds))
        if len(blk_sets) == 1:
            ref_operands = (xq, sx, aq, sa, offs)
        del xq, sx, aq, sa
    for xo, ao, _ in blk_sets:  # torch 2.11's layout rules, with a readable message if one fails
        for e in range(E):
            if xo[e] is not None:
                if name1 == "v1":
                    check_blockwise_layouts(xo[e][0], w1_ops[e][0], xo[e][1], w1_ops[e][1])
                if name2 == "v1":
                    check_blockwise_layouts(ao[e][0], w2_ops[e][0], ao[e][1], w2_ops[e][1])

    def block_loop(i):
        xo, ao, _ = blk_sets[i % n]
        hs, ys = [], []
        for e in range(E):
            if xo[e] is not None:
                hs.append(call1(xo[e][0], w1_ops[e][0], xo[e][1], w1_ops[e][1], out_dtype=bf16))
                ys.append(call2(ao[e][0], w2_ops[e][0], ao[e][1], w2_ops[e][1], out_dtype=bf16))
        return hs, ys

    def rows_of(outs, bounds):
        return torch.cat([o[:end - start] for o, (start, end) in zip(outs, [b for b in bounds if b[1] > b[0]])])

    xq, sx, aq, sa, offs = ref_operands
    del ref_operands
    hs, ys = block_loop(0)
    errors["loop"] = (
        rel_err(rows_of(hs, blk_sets[0][2]),
                F.grouped_mm(dequant_1x128(xq, sx), dequant_128x128(W1b, sW1b).transpose(1, 2), offs=offs)),
        rel_err(rows_of(ys, blk_sets[0][2]),
                F.grouped_mm(dequant_1x128(aq, sa), dequant_128x128(W2b, sW2b).transpose(1, 2), offs=offs)))
    del hs, ys, xq, sx, aq, sa
    if max(errors["loop"]) >= FP8_TOL:
        return
    v["loop"] = timer(block_loop)
    if graphs:  # replays carry no host work: the loop's GPU time
        replays = []
        for j in range(n):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                block_loop(j)  # warm-up outside the capture (cuBLASLt handles, workspaces)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                block_loop(j)
            replays.append(g)
        v["graph"] = timer(lambda i: replays[i % n].replay())


def fp8_report_lines(name, routing_kind, flops, result, peak8, bf16_ms):
    """The fp8-check line and the fp8 row of one shape."""
    v, errors = dict(result["values"]), result["errors"]
    for ms_key, pk_key in (("rw", "rw_pk"), ("rwf", "rwf_pk"), ("graph", "graph_pk")):
        v[pk_key] = 100 * flops / (v[ms_key] * 1e9) / peak8 if v[ms_key] and peak8 else None
    v["bf16"] = bf16_ms

    def verdict(key, tol):
        if key not in errors:
            return f"{key} not run"
        e1, e2 = errors[key]
        return f"{key} {e1:.1e} / {e2:.1e}" + ("" if max(e1, e2) < tol else f" FAILED (bound {tol:g}, not timed)")

    check = (f"fp8-check {name} {routing_kind}: relative error (GEMM1 / GEMM2) against the bf16 product of the "
             f"dequantized operands: {verdict('rw', FP8_TOL)}; {verdict('rwf', FP8_TOL_FAST)}; "
             f"{verdict('loop', FP8_TOL)}" + "".join(f"; {note}" for note in result.get("notes", [])))

    def cell(key, width):
        x = v[key]
        if x is None:
            return f"{'-':>{width}}"
        return f"{x:{width - 1}.1f}%" if key.endswith("_pk") else f"{x:{width}.3f}"

    widths = dict(rw=8, rw_pk=6, rwf=8, rwf_pk=6, loop=8, graph=8, graph_pk=6, q_act=7, q_w=7, qb_act=7, qb_w=7,
                  bf16=8)
    row = f"fp8 {name:15} {routing_kind:8} " + " ".join(cell(key, widths[key]) for key in FP8_KEYS)
    return check, row


def self_test():
    """The FP8 path on the CPU, tiny shapes: quantizer properties, the operands' layouts through torch's
    own checks (meta tensors for _scaled_grouped_mm, ScaledBlas.cpp's rules for the block-scaled
    _scaled_mm), fp8_rows end to end with emulated kernels, and the negative controls (a transposed B is
    refused by torch's checks, and a kernel that reads B transposed fails the numerical check)."""
    failures = []

    def expect(ok, what):
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            failures.append(what)

    torch.manual_seed(2026)
    # Quantizers: power-of-two scales, each block's largest magnitude in [224, 448], E4M3's rounding.
    t = torch.randn(64, 512).bfloat16() * torch.logspace(-30, 30, 64).unsqueeze(1).bfloat16()
    t[3] = 0
    w = t.reshape(2, 128, 128)
    for what, src, (q, s), amax, deq in [
            ("rows", t, quant_rows(t), t.float().abs().amax(1), dequant_rows),
            ("1x128", t, quant_1x128(t), t.float().abs().reshape(64, 4, 128).amax(2), dequant_1x128),
            ("128x128", w, quant_128x128(w), w.float().abs().reshape(2, 1, -1).amax(2, keepdim=True), dequant_128x128)]:
        top = amax / s
        nz = amax > 0
        expect(bool((s.view(torch.int32) & 0x7FFFFF).eq(0).all()) and s.dtype == torch.float32,
               f"{what}: scales are powers of two")
        expect(bool(((top[nz] > 224) & (top[nz] <= 448)).all()) and bool(s[~nz].eq(1.0).all()),
               f"{what}: largest magnitude of a block in (224, 448], zero blocks 2^0")
        d, v = deq(q, s).float(), src.float()
        scale = deq(torch.ones(q.shape).to(E4M3), s).float()  # each element's scale
        expect(bool(((d - v).abs() <= v.abs() * 2**-4 + scale * 2**-10).all()),
               f"{what}: dequantized within E4M3's half ulp (normal: 2^-4 relative, subnormal: 2^-10 scale)")
    expect(bool(torch.isfinite(quant_rows(torch.full((1, 16), 448.0 * 2**100))[0].float()).all()),
           "scale edge (amax/448 a power of two): no NaN codes")

    # fp8_rows end to end on the CPU. H = 2I, so W1's blocks are square and a transposed read of B keeps
    # the shapes: the negative control of the numerical check.
    H, I, E, k, T = 256, 128, 4, 2, 96
    dims = (H, I, E, k, T)
    w1 = (torch.randn(E, H, 2 * I) / H**0.5).bfloat16()
    w2 = (torch.randn(E, I, H) / I**0.5).bfloat16()
    sets, gemm_sets = [], []
    gen = torch.Generator().manual_seed(7)
    for _ in range(2):
        x = torch.randn(T, H).bfloat16()
        probs = torch.tensor([1.0, 1.0, 0.0, 1.0])  # expert 2 gets no rows: an empty group
        idx = torch.multinomial(probs.expand(T, E), k, replacement=False, generator=gen).int()
        w = torch.rand(T, k, generator=gen) + 0.05
        sets.append((x, torch.randn(T, H).bfloat16(), idx, w / w.sum(1, keepdim=True)))
        gemm_sets.append(gemm_operands(x, idx, E, I))
    runs = []

    def timer(fn):
        fn(0), fn(1)  # each set once: the closures run, nothing is timed
        runs.append(1)
        return 0.0

    result = fp8_rows(dims, w1, w2, sets, gemm_sets, timer, emulated_scaled_grouped_mm, emulated_scaled_mm,
                      graphs=False, mm8_v2=emulated_scaled_mm_v2_block)
    check, row = fp8_report_lines("self-test", "uniform", 6.0 * T * k * H * I, result, None, 0.0)
    print(check)
    print(row)
    errs = result["errors"]
    expect(max(errs["rw"] + errs["rwf"] + errs["loop"]) < FP8_TOL,
           "row-wise and block-scaled results within the bound of the dequantized bf16 product")
    expect(all(result["values"][key] is not None for key in ("rw", "rwf", "loop", "q_act", "q_w", "qb_act", "qb_w")),
           "every variant passed its check and was run through the timer")
    expect(len(row.split()) == 3 + len(FP8_KEYS) and FP8_HEADER.split()[0] == "fp8",
           "the fp8 row has one field per FP8_KEYS after 'fp8 shape routing'")

    # Negative controls: torch refuses a B that is not column-major; a kernel that reads B transposed
    # (same shapes, H = 2I) fails the numerical check and is not timed.
    xq, sx = quant_rows(gemm_sets[0][0])
    W1q, sW1 = quant_rows(w1.transpose(1, 2).contiguous())
    try:
        emulated_scaled_grouped_mm(xq, W1q, sx, sW1, offs=gemm_sets[0][2])
        expect(False, "torch's checks refuse a row-major mat_b")
    except RuntimeError as e:
        expect("column major" in str(e), f"torch's checks refuse a row-major mat_b ({str(e)[:70]}...)")
    try:
        check_blockwise_layouts(xq, W1q[0].t(), torch.ones(xq.shape[0], H // 128), torch.ones(H // 128, 2 * I // 128))
        expect(False, "block layout check refuses scale_a with strides (K/128, 1)")
    except ValueError:
        expect(True, "block layout check refuses scale_a with strides (K/128, 1)")

    def misread(a, b, *rest, **kw):
        return emulated_scaled_grouped_mm(a, b, *rest, misread_b=b.shape[-1] == b.shape[-2], **kw)

    bad = fp8_rows(dims, w1, w2, sets, gemm_sets, timer, misread, emulated_scaled_mm, graphs=False,
                   mm8_v2=emulated_scaled_mm_v2_block)
    print(fp8_report_lines("self-test-bad", "uniform", 6.0 * T * k * H * I, bad, None, 0.0)[0])
    expect(bad["values"]["rw"] is None and bad["values"]["rwf"] is None and bad["errors"]["rw"][0] > 0.3,
           "a transposed read of W1 fails the check (relative error O(1)) and is not timed")

    # B's block scales with K/128 not a multiple of 4 (here 2 and 1): a _scaled_mm that accepts the
    # unpadded layout but reads it wrong is caught by the probe, which falls back to F.scaled_mm's padded
    # layout; and a loop whose every layout fails leaves the row-wise numbers standing.
    def wrong_unpadded(a, b, scale_a, scale_b, out_dtype=torch.bfloat16):
        out = emulated_scaled_mm(a, b, scale_a, scale_b, out_dtype)
        return out if (b.shape[0] // 128) % 4 == 0 else out * 2

    fallback = fp8_rows(dims, w1, w2, sets, gemm_sets, timer, emulated_scaled_grouped_mm, wrong_unpadded,
                        graphs=False, mm8_v2=emulated_scaled_mm_v2_block)
    print(fp8_report_lines("self-test-pad", "uniform", 6.0 * T * k * H * I, fallback, None, 0.0)[0])
    expect(fallback["values"]["loop"] is not None and any("v2-padded" in note for note in fallback["notes"]),
           "a wrong unpadded block layout falls back to F.scaled_mm's padded one")
    none = fp8_rows(dims, w1, w2, sets, gemm_sets, timer, emulated_scaled_grouped_mm, wrong_unpadded,
                    graphs=False, mm8_v2=None)
    print(fp8_report_lines("self-test-none", "uniform", 6.0 * T * k * H * I, none, None, 0.0)[0])
    expect(none["values"]["loop"] is None and none["values"]["rw"] is not None
           and any("block loop not run" in note for note in none["notes"]),
           "no working block layout: the loop is left out, the row-wise numbers stand")
    print(f"self-test: {len(failures)} failure(s)")
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="all")
    p.add_argument("--routing", default="uniform", choices=["uniform", "zipf"])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--sets", type=int, default=3, help="input sets rotated between runs")
    p.add_argument("--fp8", action="store_true",
                   help="also the FP8 rows (issue 19): the forward's two grouped GEMMs in E4M3 through "
                        "torch._scaled_grouped_mm (row-wise scales) and a per-expert block-scaled _scaled_mm loop, "
                        "each checked numerically first, the quantization's cost, the FP8 dense peak (sm_90 only)")
    p.add_argument("--self-test", action="store_true",
                   help="CPU only, no GPU: the FP8 code path on tiny shapes with emulated kernels (quantizers, "
                        "layouts through torch's own checks, the numerical check and its negative controls)")
    args = p.parse_args()
    if args.self_test:
        sys.exit(self_test())
    if not torch.cuda.is_available():
        sys.exit("torch_baseline.py: no CUDA device (without one, only --self-test runs)")
    torch.use_deterministic_algorithms(True)
    # Deterministic mode also fills every new uninitialized tensor with NaN (grouped_mm's outputs, the
    # gradients): a cost that changes no bit, which mok's op skips as well (python/src/cuda_ops.cpp), so
    # the baseline runs without it. Runs before 2026-12-05 paid it (docs/benchmarks.md).
    torch.utils.deterministic.fill_uninitialized_memory = False
    peak = matmul_peak_tflops()
    print(f"bf16 matmul peak (torch 8192^3, random data): {peak:.0f} TFLOP/s")
    fp8 = args.fp8
    if fp8:
        why = fp8_unavailable()
        if why:
            print(f"fp8-skip: {why}; no FP8 rows")
            fp8 = False
        else:
            peak8, peak8_slow = fp8_peak_tflops()
            print(f"fp8 matmul peak (torch _scaled_mm 8192^3 E4M3, tensor-wise scales, fast accumulation, random "
                  f"data): {peak8:.0f} TFLOP/s (without fast accumulation: {peak8_slow:.0f})")
            print(f"fp8-info: {probe_grouped_blockwise()}")
            print(FP8_LEGEND)
            print(FP8_HEADER)
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

        def no_gradients():  # each step stores its gradients, as mok-bench's backward does, adding to none
            w1.grad = w2.grad = None
            for x, *_ in sets:
                x.grad = None

        fwd = median_ms(forward, args.warmup, args.runs)
        fb = median_ms(forward_backward, args.warmup, args.runs, no_gradients)
        gemms = median_ms(gemms_alone, args.warmup, args.runs)
        flops = 6.0 * T * k * H * I
        print(f"{name:15} {args.routing:8} {fwd:9.2f} {fb:11.2f} {flops / (fwd * 1e9):9.1f} "
              f"{3 * flops / (fb * 1e9):9.1f} {100 * flops / (fwd * 1e9) / peak:7.1f}% {gemms:9.2f} "
              f"{100 * flops / (gemms * 1e9) / peak:8.1f}%", flush=True)
        if fp8:
            w1.grad = w2.grad = None  # the bf16 rows are done; their gradients only take memory
            try:
                result = fp8_rows((H, I, E, k, T), w1, w2, sets, gemm_sets,
                                  lambda fn: median_ms(fn, args.warmup, args.runs))
                for line in fp8_report_lines(name, args.routing, flops, result, peak8, gemms):
                    print(line, flush=True)
            except Exception as e:  # one shape's failure (a refused layout, memory) leaves the others
                print(f"fp8-skip {name} {args.routing}: {type(e).__name__}: {str(e).splitlines()[0][:300]}",
                      flush=True)
        del w1, w2, sets, gemm_sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
