"""Recompute mode through the op: saved holds the dispatch layout alone (no xe and h, nor the shared
expert's h and a), and every output and gradient has the bits of the saving mode, on the CPU and (where
there is one) the GPU; through autograd, too."""

import pytest

torch = pytest.importorskip("torch", reason="the mok package needs PyTorch")

import mok  # noqa: E402
from helpers import (CONFIGS, FORWARD_OUTPUTS, GRADIENTS, RING_ROWS, assert_all_same_bits, assert_same_bits,  # noqa: E402
                     cuda_available, make_layer)
from mok._C import saved_bytes  # noqa: E402
from mok.config import pack_launch  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def on(device):
    if device == "cuda" and not cuda_available():
        pytest.skip("no CUDA device or mok built without its GPU ops")
    return device


def recomputing(layer):
    """The layer's op arguments with recompute on."""
    ints, floats, mode, _ = layer.op_args()
    return ints, floats, mode, pack_launch(RING_ROWS, 0, True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", CONFIGS)
def test_recompute_gives_the_same_bits_with_less_saved(name, device):
    layer = make_layer(name).to(on(device))
    c = layer.config
    saving = layer.forward()
    args = recomputing(layer)
    y, idx, w, logits, saved = torch.ops.mok.forward(*layer.weights(), None, None, *args)
    absent = layer.absent_outputs()
    assert_all_same_bits((y, idx, w, logits), saving[:4], FORWARD_OUTPUTS, absent)
    def section(n):  # the saved buffer's sections start at multiples of 256 bytes
        return -(-n // 256) * 256

    layout = 2 * section((c.experts + 1) * 4) + 2 * section(c.tokens * c.top_k * 4)  # offsets, tiles; rows
    assert saved.numel() == saved_bytes(*layer.op_args()[:2], True) == layout < saving[4].numel()
    grads = torch.ops.mok.backward(*layer.weights(), idx, w, logits, saved, layer.dy, *args)
    assert_all_same_bits(grads, layer.backward(saving), GRADIENTS, absent)


def test_module_recompute_is_the_module():
    layer = make_layer("softmax_shared")
    x = layer.x.clone().requires_grad_()
    grads = []
    for recompute in (False, True):
        model = mok.MoE(layer.config, ring_rows=RING_ROWS, recompute=recompute,
                        generator=torch.Generator().manual_seed(7))
        x.grad = None
        (model(x).float() * layer.dy.float()).sum().backward()
        grads.append([x.grad.clone()] + [p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        assert_same_bits(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_a_call_autograd_does_not_record_runs_in_recompute_mode(device, monkeypatch):
    """mok.moe under no_grad, or with no input requiring a gradient, launches in recompute mode (nothing will
    read its saved buffer, and that forward writes no h), with the recorded call's y; a recorded call keeps
    the caller's choice."""
    layer = make_layer("softmax_shared").to(on(device))
    launched = []
    checked_op_lists = mok.functional._checked_op_lists

    def spy(*args):
        launched.append(args[4])  # the launch's recompute
        return checked_op_lists(*args)

    monkeypatch.setattr(mok.functional, "_checked_op_lists", spy)

    def call(x):
        return mok.moe(x, layer.router, layer.w1, layer.w2, config=layer.config,
                       shared=(layer.shared_w1, layer.shared_w2), ring_rows=RING_ROWS)

    recorded = call(layer.x.clone().requires_grad_())
    assert launched[-1] is False
    with torch.no_grad():
        assert_same_bits(call(layer.x), recorded)
    assert launched[-1] is True
    launched.clear()
    assert_same_bits(call(layer.x), recorded)  # grad mode on, no input requiring a gradient
    assert launched[-1] is True
