"""A tiny two-layer MoE model trained with Adam on micro-batches: two runs give the same bits, and so
does a run with another simulated rank count (D2) (CPU here; the CUDA variant is in test_cuda.py)."""

import dataclasses

import pytest

torch = pytest.importorskip("torch", reason="the mok package needs PyTorch")

import mok  # noqa: E402
from helpers import assert_same_bits  # noqa: E402

CONFIG = mok.MoEConfig(experts=4, hidden=64, intermediate=64, top_k=2, shared_intermediate=64)


class TwoLayers(torch.nn.Module):
    def __init__(self, device, ranks=1):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        config = dataclasses.replace(CONFIG, ranks=ranks)
        self.first = mok.MoE(config, ring_rows=128, device=device, generator=g)
        self.second = mok.MoE(config, ring_rows=128, device=device, generator=g)

    def forward(self, x):
        h = x + self.first(x)
        return h + self.second(h)


def train(device="cpu", steps=100, ranks=1, micro_batches=2):
    """Losses and final parameters of `steps` Adam steps on a fixed regression problem, each step's
    gradients accumulated over `micro_batches` micro-batches."""
    model = TwoLayers(device, ranks)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 64, generator=g).to(torch.bfloat16).to(device)
    target = torch.randn(32, 64, generator=g).to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        for xb, tb in zip(x.chunk(micro_batches), target.chunk(micro_batches)):
            loss = (model(xb).float() - tb).square().mean() / micro_batches
            loss.backward()
            losses.append(loss.detach())
        opt.step()
    return torch.stack(losses).cpu(), {k: v.detach().cpu() for k, v in model.state_dict().items()}


def assert_same_runs(a, b):
    (losses, params), (again, params_again) = a, b
    assert_same_bits(again, losses, "losses")
    for k in params:
        assert_same_bits(params_again[k], params[k], k)


def test_training_is_bitwise_reproducible():
    run = train()
    assert run[0][-1] < run[0][0]  # it learns something
    assert_same_runs(run, train())
    assert_same_runs(run, train(ranks=4))  # 16 tokens per micro-batch: 4 ranks of 4
