"""Shared by the tests: small configs, seeded inputs, the ops' argument lists, bitwise comparison.
Imported after `pytest.importorskip("torch")`."""

from __future__ import annotations

import dataclasses
import os
import pathlib
from dataclasses import dataclass
from typing import Optional

import torch

import mok
from mok._ops import backward_float32
from mok.config import ROUTING_MODES, MoEConfig, pack_launch

GOLDEN_DIR = pathlib.Path(os.environ.get("MOK_GOLDEN_DIR", pathlib.Path(__file__).parents[2] / "golden" / "data"))
RING_ROWS = 128
ROUTER, REPLAY_IDS, GIVEN = (ROUTING_MODES.index(m) for m in ("router", "replay_ids", "given"))

# A few small layers covering the config's branches; the tokens of each are `tokens`.
CONFIGS = {
    "softmax_shared": (MoEConfig(experts=4, hidden=64, intermediate=64, top_k=2, shared_intermediate=64), 32),
    "sigmoid_grouped": (MoEConfig(experts=8, hidden=64, intermediate=64, top_k=3, score_mode="sigmoid", n_group=4,
                                  topk_group=2, routed_scale=2.5), 24),
    "clamped_ranks2": (MoEConfig(experts=4, hidden=64, intermediate=128, top_k=2, ranks=2, renormalize=False,
                                 swiglu_limit=0.5), 20),
}


@dataclass
class Layer:
    """One call's tensors and op arguments."""

    config: MoEConfig  # with tokens_per_rank set
    x: torch.Tensor
    router: torch.Tensor
    expert_bias: Optional[torch.Tensor]
    w1: torch.Tensor
    w2: torch.Tensor
    shared_w1: Optional[torch.Tensor]
    shared_w2: Optional[torch.Tensor]
    dy: torch.Tensor

    def weights(self) -> tuple:
        return (self.x, self.router, self.expert_bias, self.w1, self.w2, self.shared_w1, self.shared_w2)

    def op_args(self, mode: int = ROUTER) -> tuple:
        """config_ints, config_floats, routing_mode, launch."""
        return (*self.config.pack(), mode, pack_launch(RING_ROWS))

    def forward(self, mode: int = ROUTER, topk_idx=None, topk_w=None) -> tuple:
        return torch.ops.mok.forward(*self.weights(), topk_idx, topk_w, *self.op_args(mode))

    def backward(self, fwd: tuple, mode: int = ROUTER) -> tuple:
        _, topk_idx, topk_w, logits, saved = fwd
        return torch.ops.mok.backward(*self.weights(), topk_idx, topk_w, logits, saved, self.dy, *self.op_args(mode))

    def backward_float32(self, fwd: tuple, mode: int = ROUTER) -> tuple:
        """backward's results with the weight gradients in float32."""
        _, topk_idx, topk_w, logits, saved = fwd
        return backward_float32(*self.weights(), topk_idx, topk_w, logits, saved, self.dy, *self.op_args(mode))

    def absent_outputs(self, mode: int = ROUTER) -> tuple:
        """The outputs this problem lacks in `mode` (absent_outputs)."""
        return absent_outputs(self.shared_w1 is not None, mode)

    def to(self, device) -> Layer:
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in vars(self).items()}
        return Layer(**moved)


def make_layer(name: str = "softmax_shared", seed: int = 0, device="cpu", tokens: Optional[int] = None,
               **fields) -> Layer:
    """CONFIGS[name] with seeded inputs; tokens and config fields given replace the config's."""
    config, default_tokens = CONFIGS[name]
    tokens = default_tokens if tokens is None else tokens
    config = dataclasses.replace(config, tokens_per_rank=tokens // config.ranks, **fields)
    g = torch.Generator().manual_seed(seed)
    e, h, i, s = config.experts, config.hidden, config.intermediate, config.shared_intermediate

    def normal(*shape, std=1.0, dtype=torch.bfloat16):
        return (torch.randn(shape, generator=g) * std).to(dtype).to(device)

    return Layer(
        config=config,
        x=normal(tokens, h),
        router=normal(e, h, std=h**-0.5, dtype=torch.float32),
        expert_bias=normal(e, std=0.1, dtype=torch.float32) if config.score_mode == "sigmoid" else None,
        w1=normal(e, 2 * i, h, std=h**-0.5),
        w2=normal(e, h, i, std=i**-0.5),
        shared_w1=normal(2 * s, h, std=h**-0.5) if s else None,
        shared_w2=normal(h, s, std=s**-0.5) if s else None,
        dy=normal(tokens, h),
    )


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits as integers (so that -0 != +0 and NaN == NaN of the same payload)."""
    view = {torch.bfloat16: torch.int16, torch.float32: torch.int32}.get(t.dtype)
    return t.detach().cpu().view(view) if view else t.detach().cpu()


def assert_written(t: torch.Tensor, name: str = "") -> None:
    """No element holds the poison (every byte 0xff) the GPU ops fill their outputs with under the tests
    (conftest.py): an element no kernel wrote, which two GPU runs would agree on. The layer writes no
    such value (its NaNs are canonical, its ids never -1); the saved buffer's bytes may be 0xff."""
    if t.dtype == torch.uint8:
        return
    poisoned = (bits(t) == -1).nonzero()
    assert poisoned.numel() == 0, f"{name}: element {poisoned[0].tolist()} holds the poison: no kernel wrote it"


def absent_outputs(has_shared: bool, mode: int = ROUTER) -> tuple:
    """The outputs (FORWARD_OUTPUTS' and GRADIENTS' names) a problem lacks, which the ops return as tensors of
    no elements: the router's under a given routing, the shared expert's gradients without one."""
    return (("logits", "d_logits", "d_router") if mode == GIVEN else ()) + \
        (() if has_shared else ("d_shared_w1", "d_shared_w2"))


def assert_same_bits(a: torch.Tensor, b: torch.Tensor, name: str = "", absent: bool = False) -> None:
    """a and b hold the same bits. Agreement on nothing or on zeros proves nothing: an empty tensor fails
    unless the output is absent from the problem (absent_outputs), and so does a floating-point one all zeros
    (ids all 0 are a routing: all_to_one's)."""
    assert a.dtype == b.dtype and a.shape == b.shape, \
        f"{name}: {a.dtype} {tuple(a.shape)} vs {b.dtype} {tuple(b.shape)}"
    if a.numel() == 0:
        assert absent, f"{name}: empty: nothing was compared"
        return
    diff = (bits(a) != bits(b)).nonzero()
    assert diff.numel() == 0, f"{name}: {diff.shape[0]} of {a.numel()} elements differ, first at {diff[0].tolist()}"
    assert not a.is_floating_point() or bool((a.detach().cpu() != 0).any()), \
        f"{name}: all {a.numel()} elements are zero: nothing was compared"
    assert_written(a, name)
    assert_written(b, name)


def assert_all_same_bits(a, b, names=None, absent=()) -> None:
    """assert_same_bits over two lists; absent: the names of the outputs the problem lacks (absent_outputs)."""
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        name = names[i] if names else str(i)
        assert_same_bits(x, y, name, absent=name in absent)


def cuda_available() -> bool:
    return torch.cuda.is_available() and mok._C.HAS_CUDA


FORWARD_OUTPUTS = ("y", "topk_idx", "topk_w", "logits", "saved")
GRADIENTS = ("dx", "d_topk_w", "d_logits", "d_router", "d_w1", "d_w2", "d_shared_w1", "d_shared_w2")
BF16_GRADIENTS = ("d_w1", "d_w2", "d_shared_w1", "d_shared_w2")  # mok::backward rounds these once
