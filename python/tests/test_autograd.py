"""Autograd through mok::forward (on the CPU): the gradients are the backward op's, no_grad and
torch.compile change no bit."""

import pytest

torch = pytest.importorskip("torch", reason="the mok package needs PyTorch")

import mok  # noqa: E402
from helpers import CONFIGS, GIVEN, REPLAY_IDS, RING_ROWS, ROUTER, assert_same_bits, make_layer  # noqa: E402

MODES = {"router": ROUTER, "replay_ids": REPLAY_IDS, "given": GIVEN}


def run_functional(layer, mode, fn=mok.moe):
    """y and every input gradient of sum(y * dy) through mok.moe (autograd)."""
    params = {k: getattr(layer, k).detach().clone().requires_grad_() for k in ("x", "router", "w1", "w2")}
    shared = None
    if layer.shared_w1 is not None:
        shared = tuple(t.detach().clone().requires_grad_() for t in (layer.shared_w1, layer.shared_w2))
    routing = None
    if mode != ROUTER:
        _, idx, w, _, _ = layer.forward()
        routing = (idx, w.clone().requires_grad_()) if mode == GIVEN else idx
    y = fn(params["x"], params["router"], params["w1"], params["w2"], config=layer.config, shared=shared,
           expert_bias=layer.expert_bias, routing=routing, ring_rows=RING_ROWS)
    (y.float() * layer.dy.float()).sum().backward()
    grads = {k: p.grad for k, p in params.items()}
    if shared:
        grads["shared_w1"], grads["shared_w2"] = shared[0].grad, shared[1].grad
    if mode == GIVEN:
        grads["topk_w"] = routing[1].grad
    return y, grads


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
@pytest.mark.parametrize("name", CONFIGS)
def test_gradients_are_the_backward_ops(name, mode):
    layer = make_layer(name)
    y, grads = run_functional(layer, mode)
    _, idx, w, _, _ = layer.forward()
    routing = {ROUTER: (None, None), REPLAY_IDS: (idx, None), GIVEN: (idx, w)}[mode]
    fwd = layer.forward(mode, *routing)
    dx, d_topk_w, _, d_router, d_w1, d_w2, d_sw1, d_sw2 = layer.backward(fwd, mode)
    assert_same_bits(y, fwd[0], "y")
    assert_same_bits(grads["x"], dx, "dx")  # dy * 1.0 in fp32 is dy: the same bf16 dy reaches the op
    assert_same_bits(grads["w1"], d_w1.to(torch.bfloat16), "w1")
    assert_same_bits(grads["w2"], d_w2.to(torch.bfloat16), "w2")
    if mode == GIVEN:
        assert grads["router"] is None
        assert_same_bits(grads["topk_w"], d_topk_w, "topk_w")
    else:
        assert_same_bits(grads["router"], d_router, "router")
    if layer.shared_w1 is not None:
        assert_same_bits(grads["shared_w1"], d_sw1.to(torch.bfloat16), "shared_w1")
        assert_same_bits(grads["shared_w2"], d_sw2.to(torch.bfloat16), "shared_w2")


def test_routing_outputs_carry_no_gradient():
    layer = make_layer()
    x = layer.x.clone().requires_grad_()
    router = layer.router.clone().requires_grad_()
    y, routing = mok.moe(x, router, layer.w1, layer.w2, config=layer.config,
                         shared=(layer.shared_w1, layer.shared_w2), return_routing=True)
    assert y.requires_grad
    assert not any(t.requires_grad for t in routing)


def test_no_grad_forward_is_the_grad_forward():
    """no_grad, and grad mode with nothing requiring a gradient, skip the autograd Function (a fast
    path): the same bits, and no graph."""
    layer = make_layer("sigmoid_grouped")
    model = mok.MoE(layer.config, ring_rows=RING_ROWS, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        y0, r0 = model(layer.x, return_routing=True)
    y1, r1 = model(layer.x.clone().requires_grad_(), return_routing=True)
    model.requires_grad_(False)
    y2, r2 = model(layer.x, return_routing=True)
    assert y1.requires_grad and not y0.requires_grad and not y2.requires_grad and y2.grad_fn is None
    for a, b, c in zip((y0, *r0), (y1, *r1), (y2, *r2)):
        assert_same_bits(a, b)
        assert_same_bits(c, b)
    # An input requiring a gradient keeps the autograd path, even one that gets none (expert_bias).
    model.expert_bias.requires_grad_(True)
    assert model(layer.x).requires_grad


@pytest.mark.parametrize("mode", (ROUTER, GIVEN), ids=("router", "given"))
def test_compile_fullgraph_is_eager(mode):
    layer = make_layer("softmax_shared")
    eager_y, eager = run_functional(layer, mode)
    compiled = torch.compile(mok.moe, fullgraph=True)
    y, grads = run_functional(layer, mode, compiled)
    assert_same_bits(y, eager_y, "y")
    for k in eager:
        if eager[k] is None:
            assert grads[k] is None, k
        else:
            assert_same_bits(grads[k], eager[k], k)


def test_module_compiles_with_leading_dims():
    layer = make_layer("softmax_shared")
    model = mok.MoE(layer.config, ring_rows=RING_ROWS, generator=torch.Generator().manual_seed(0))
    x = layer.x.view(4, 8, layer.config.hidden)
    eager = model(x)
    assert eager.shape == x.shape
    assert_same_bits(torch.compile(model, fullgraph=True)(x), eager)
