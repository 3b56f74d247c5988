"""The op's results against a plain-PyTorch MoE module in float64 (autograd for the gradients), within
the per-tensor bounds of docs/accuracy.md (reference/include/mok/reference/oracle.h, oracle_bound):
relative Frobenius error and max error (against the largest reference element) both within the bound.
Routing is discrete, so the float64 module takes mok's expert ids and recomputes everything else."""

import pytest

torch = pytest.importorskip("torch")

import mok  # noqa: E402
from mok._ops import backward_float32  # noqa: E402
from mok.config import ROUTING_MODES, MoEConfig, pack_launch  # noqa: E402

U = 2.0**-8  # bf16's unit roundoff
BOUNDS = {"y": 6 * U, "dx": 6 * U, "d_router": 8 * U, "d_w1": 4 * U, "d_w2": 5 * U, "d_shared_w1": 4 * U,
          "d_shared_w2": 4 * U}


def layer64(x, router, w1, w2, sw1, sw2, idx, renormalize):
    """y = shared(x) + sum_j w_j SwiGLU_{e_j}(x) in float64, softmax routing on the given ids."""
    scores = torch.softmax(x @ router.T, dim=-1).gather(1, idx)
    weights = scores / scores.sum(-1, keepdim=True) if renormalize else scores

    def swiglu(rows, up_down1, down):
        gate, up = (rows @ up_down1.transpose(-1, -2)).chunk(2, dim=-1)
        return (torch.nn.functional.silu(gate) * up) @ down.transpose(-1, -2)

    per_slot = swiglu(x.unsqueeze(1).unsqueeze(2), w1[idx], w2[idx]).squeeze(2)  # [N, k, H]
    return swiglu(x, sw1, sw2) + (weights.unsqueeze(-1) * per_slot).sum(1)


def error(out, ref):
    diff = (out.double() - ref).abs()
    return (diff.norm() / ref.norm()).item(), (diff.max() / ref.abs().max()).item()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_gradients_within_the_oracle_bounds(device):
    if device == "cuda" and not (torch.cuda.is_available() and mok._C.HAS_CUDA):
        pytest.skip("no CUDA device or mok built without its GPU ops")
    N, H, I, E, k, Is = 96, 128, 128, 8, 2, 64
    config = MoEConfig(experts=E, hidden=H, intermediate=I, top_k=k, shared_intermediate=Is, tokens_per_rank=N)
    gen = torch.Generator().manual_seed(16)
    rand = lambda *shape, scale: (torch.randn(*shape, generator=gen) * scale)  # noqa: E731
    x = rand(N, H, scale=1.0).bfloat16()
    router = rand(E, H, scale=H**-0.5)
    w1, w2 = rand(E, 2 * I, H, scale=H**-0.5).bfloat16(), rand(E, H, I, scale=I**-0.5).bfloat16()
    sw1, sw2 = rand(2 * Is, H, scale=H**-0.5).bfloat16(), rand(H, Is, scale=Is**-0.5).bfloat16()
    dy = rand(N, H, scale=1.0).bfloat16()
    on = lambda t: t.to(device)  # noqa: E731
    args = [on(t) for t in (x, router)] + [None] + [on(t) for t in (w1, w2, sw1, sw2)]
    lists = (*config.pack(), ROUTING_MODES.index("router"), pack_launch(128))
    y, idx, topk_w, logits, saved = torch.ops.mok.forward(*args, None, None, *lists)
    # The fp32 gradients (mok::backward's bf16 weight gradients are these rounded once).
    dx, _, _, d_router, d_w1, d_w2, d_sw1, d_sw2 = backward_float32(*args, idx, topk_w, logits, saved, on(dy), *lists)
    leaves = [t.double().requires_grad_() for t in (x, router, w1, w2, sw1, sw2)]
    y64 = layer64(*leaves, idx.cpu().long(), config.renormalize)
    y64.backward(dy.double())
    got = {"y": y, "dx": dx, "d_router": d_router, "d_w1": d_w1, "d_w2": d_w2, "d_shared_w1": d_sw1,
           "d_shared_w2": d_sw2}
    want = {"y": y64.detach(), "dx": leaves[0].grad, "d_router": leaves[1].grad, "d_w1": leaves[2].grad,
            "d_w2": leaves[3].grad, "d_shared_w1": leaves[4].grad, "d_shared_w2": leaves[5].grad}
    for name, bound in BOUNDS.items():
        relative, largest = error(got[name].cpu(), want[name])
        assert relative <= bound and largest <= bound, f"{name}: relative {relative:.3g}, max {largest:.3g} > {bound:.3g}"
