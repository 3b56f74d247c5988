"""Routing replay on the CPU: replaying the router's own routing changes nothing it should not."""

import pytest

torch = pytest.importorskip("torch", reason="the mok package needs PyTorch")

from helpers import (CONFIGS, FORWARD_OUTPUTS, GIVEN, GRADIENTS, REPLAY_IDS, assert_all_same_bits,  # noqa: E402
                     assert_same_bits, make_layer)


@pytest.mark.parametrize("name", CONFIGS)
def test_replayed_own_ids_are_the_router(name):
    """replay_ids with the router's own choice: every output and gradient bit is the router's."""
    layer = make_layer(name)
    fwd = layer.forward()
    replayed = layer.forward(REPLAY_IDS, fwd[1])
    absent = layer.absent_outputs(REPLAY_IDS)
    assert_all_same_bits(replayed, fwd, FORWARD_OUTPUTS, absent)
    assert_all_same_bits(layer.backward(replayed, REPLAY_IDS), layer.backward(fwd), GRADIENTS, absent)


@pytest.mark.parametrize("name", CONFIGS)
def test_given_own_routing(name):
    """Full replay of the router's routing: the same y and expert gradients, no router outputs."""
    layer = make_layer(name)
    fwd = layer.forward()
    given = layer.forward(GIVEN, fwd[1], fwd[2])
    for a, b, what in zip(given[:3], fwd[:3], FORWARD_OUTPUTS):
        assert_same_bits(a, b, what)
    assert given[3].shape == (0, layer.config.experts)
    got, want = layer.backward(given, GIVEN), layer.backward(fwd)
    absent = layer.absent_outputs(GIVEN)
    for what in ("d_topk_w", "d_w1", "d_w2", "d_shared_w1", "d_shared_w2"):
        i = GRADIENTS.index(what)
        assert_same_bits(got[i], want[i], what, absent=what in absent)
    assert got[2].numel() == 0 and got[3].numel() == 0  # no d_logits, d_router


def test_replayed_ids_take_the_live_routers_weights():
    layer = make_layer("softmax_shared")  # softmax, renormalized
    _, idx, _, logits, _ = layer.forward()
    other = idx.roll(1, dims=0).contiguous()  # another token's experts
    _, topk_idx, topk_w, replay_logits, _ = layer.forward(REPLAY_IDS, other)
    assert torch.equal(topk_idx, other)
    assert torch.equal(replay_logits, logits)
    scores = torch.softmax(logits.double(), dim=1).gather(1, other.long())
    torch.testing.assert_close(topk_w.double(), scores / scores.sum(1, keepdim=True), rtol=1e-5, atol=1e-6)
