"""D1 and D4 through the ops, on the CPU and (where there is one) the GPU: ten runs give the same bits
in every output and gradient; a token's y does not depend on the other tokens of the batch."""

import dataclasses

import pytest

torch = pytest.importorskip("torch", reason="the mok package needs PyTorch")

from helpers import FORWARD_OUTPUTS, GRADIENTS, assert_all_same_bits, cuda_available, make_layer  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def on(device):
    if device == "cuda" and not cuda_available():
        pytest.skip("no CUDA device or mok built without its GPU ops")
    return device


@pytest.mark.parametrize("device", DEVICES)
def test_ten_runs_give_the_same_bits(device):
    # Large enough that the reference's expert GEMMs take their OpenMP path (m n k > 2^18: here about 96
    # rows per expert, 512 by 256), whose bits must not depend on how the rows are shared among threads.
    layer = make_layer("sigmoid_grouped", seed=3, tokens=256, hidden=256, intermediate=256).to(on(device))
    fwd = layer.forward()
    grads = layer.backward(fwd)
    for _ in range(9):
        again = layer.forward()
        assert_all_same_bits(again, fwd, FORWARD_OUTPUTS)
        assert_all_same_bits(layer.backward(again), grads, GRADIENTS, layer.absent_outputs())


@pytest.mark.parametrize("device", DEVICES)
def test_a_tokens_y_does_not_depend_on_the_batch(device):
    full = make_layer("softmax_shared", seed=4).to(on(device))
    first, count = 5, 11
    part = dataclasses.replace(full, config=dataclasses.replace(full.config, tokens_per_rank=count),
                               x=full.x[first:first + count].contiguous(), dy=full.dy[first:first + count].contiguous())
    assert_all_same_bits((part.forward()[0],), (full.forward()[0][first:first + count],), ("y",))
