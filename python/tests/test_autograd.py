"""Autograd through mok::forward (on the CPU): the gradients are the backward op's, no_grad and
torch.compile change no bit."""

import dataclasses
import functools

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


def accumulate_two_micro_batches(name, mode, device="cpu", fn=mok.moe):
    """Two micro-batches (the same weights, other tokens) through mok.moe with accumulate_into, on
    `device`: the accumulators (starting from random values) hold start + g1 + g2, the backward ops'
    fp32 gradients each added once (torch's fp32 addition: the one rounding the kernel makes); the
    weights get no .grad; each x (and a replayed topk_w) its usual gradient. Returns the accumulators."""
    first = make_layer(name, seed=0)
    second = dataclasses.replace(first, x=make_layer(name, seed=1).x, dy=make_layer(name, seed=1).dy)
    gen = torch.Generator().manual_seed(7)

    def start(t):
        return None if t is None else torch.randn(t.shape, generator=gen).to(device)

    shared = None if first.shared_w1 is None else (start(first.shared_w1), start(first.shared_w2))
    acc = mok.GradAccumulators(None if mode == GIVEN else start(first.router), start(first.w1), start(first.w2), shared)
    want = [None if t is None else t.cpu().clone() for t in (acc.router, acc.w1, acc.w2, *(shared or ()))]

    def leaf(t):
        return t.detach().clone().to(device).requires_grad_()

    weights = {k: leaf(getattr(first, k)) for k in ("router", "w1", "w2")}
    shared_weights = None if first.shared_w1 is None else (leaf(first.shared_w1), leaf(first.shared_w2))
    for batch in (first, second):
        _, idx, w, _, _ = batch.forward()
        routing = {ROUTER: None, REPLAY_IDS: idx, GIVEN: (idx, w)}[mode]
        fwd = batch.forward(mode, *({ROUTER: (None, None), REPLAY_IDS: (idx, None), GIVEN: (idx, w)}[mode]))
        dx, d_topk_w, _, *grads = batch.backward_float32(fwd, mode)
        for i, g in enumerate(grads[:3] + (grads[3:] if shared else [])):
            if want[i] is not None:
                want[i] = want[i] + g
        x = leaf(batch.x)
        if mode != ROUTER:
            routing = idx.to(device) if mode == REPLAY_IDS else (idx.to(device), leaf(w))
        y = fn(x, weights["router"], weights["w1"], weights["w2"], config=batch.config, shared=shared_weights,
                    expert_bias=None if batch.expert_bias is None else batch.expert_bias.to(device), routing=routing,
                    ring_rows=RING_ROWS, accumulate_into=acc)
        (y.float() * batch.dy.to(device).float()).sum().backward()
        assert_same_bits(x.grad, dx, "dx")
        if mode == GIVEN:
            assert_same_bits(routing[1].grad, d_topk_w, "topk_w")
    for name_, got, expected in zip(("router", "w1", "w2", "shared_w1", "shared_w2"),
                                    (acc.router, acc.w1, acc.w2, *(shared or ())), want):
        assert (got is None) == (expected is None), name_
        if got is not None:
            assert_same_bits(got, expected, name_)
    assert all(p.grad is None for p in (*weights.values(), *(shared_weights or ())))
    return acc


def bf16_accumulators_take_autograds_bits(name, mode, device="cpu"):
    """accumulate_into given the weights' own .grad tensors (bf16; the router's fp32) as accumulators, as
    python.md shows, adds as autograd adds the op's gradients into them: over two micro-batches from
    random start values, the same bits as plain mok.moe with .grad holding the same start values; each
    .grad stays the tensor it was, and autograd gives the weights no gradient (a hook on each sees None,
    plain's see tensors: what tells the two paths apart, whose .grad bits are the same)."""
    first = make_layer(name, seed=0)
    second = dataclasses.replace(first, x=make_layer(name, seed=1).x, dy=make_layer(name, seed=1).dy)
    names = ["router", "w1", "w2"] + (["shared_w1", "shared_w2"] if first.shared_w1 is not None else [])
    gen = torch.Generator().manual_seed(7)
    start = {k: torch.randn(getattr(first, k).shape, generator=gen).to(getattr(first, k).dtype).to(device)
             for k in names if k != "router" or mode != GIVEN}

    def two_micro_batches(accumulate):
        leaves = {k: getattr(first, k).detach().clone().to(device).requires_grad_() for k in names}
        held = {k: v.clone() for k, v in start.items()}
        nones = []  # per hook call: whether autograd's gradient for the weight was None
        for k, v in held.items():
            leaves[k].grad = v
            leaves[k].register_hook(lambda g: nones.append(g is None))
        acc = None
        if accumulate:
            shared = (held["shared_w1"], held["shared_w2"]) if "shared_w1" in held else None
            acc = mok.GradAccumulators(held.get("router"), held["w1"], held["w2"], shared)
        for batch in (first, second):
            _, idx, w, _, _ = batch.forward()
            routing = {ROUTER: None, REPLAY_IDS: idx.to(device), GIVEN: (idx.to(device), w.to(device))}[mode]
            shared = (leaves["shared_w1"], leaves["shared_w2"]) if "shared_w1" in leaves else None
            y = mok.moe(batch.x.to(device), leaves["router"], leaves["w1"], leaves["w2"], config=batch.config,
                        shared=shared, expert_bias=None if batch.expert_bias is None else batch.expert_bias.to(device),
                        routing=routing, ring_rows=RING_ROWS, accumulate_into=acc)
            (y.float() * batch.dy.to(device).float()).sum().backward()
        if accumulate:
            assert all(leaves[k].grad is held.get(k) for k in names)
        assert nones and all(n == accumulate for n in nones)
        return {k: leaves[k].grad for k in held}

    want, got = two_micro_batches(False), two_micro_batches(True)
    assert got["w1"].dtype == torch.bfloat16 and got.keys() == want.keys()
    for k in want:
        assert_same_bits(got[k].cpu(), want[k].cpu(), k)


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
@pytest.mark.parametrize("name", ("softmax_shared", "sigmoid_grouped"))
def test_bf16_accumulate_into_gives_autograds_grad_bits(name, mode):
    bf16_accumulators_take_autograds_bits(name, mode)


def accumulators_like(layer, fill=torch.zeros_like):
    """fp32 accumulators shaped as the layer's router, w1, w2 and shared expert, made by fill."""
    t = [fill(w, dtype=torch.float32) for w in (layer.router, layer.w1, layer.w2, layer.shared_w1, layer.shared_w2)]
    return mok.GradAccumulators(t[0], t[1], t[2], (t[3], t[4]))


def moe_of(layer, x, w1, acc, fn=mok.moe):
    """mok.moe (or fn, e.g. it compiled) on the layer's weights but x and w1 (the caller's), adding into acc
    (None: autograd's .grad)."""
    return fn(x, layer.router, w1, layer.w2, config=layer.config, shared=(layer.shared_w1, layer.shared_w2),
              expert_bias=layer.expert_bias, ring_rows=RING_ROWS, accumulate_into=acc)


def assert_no_zero_gradient_for_saved(accumulate, device="cpu"):
    """Autograd gives saved, an output the loss does not reach, no zero gradient before the backward
    (set_materialize_grads(False)): it would fill one of saved's size on every step, 1,769 MiB on kimi-k2.
    Seen as a fill (zero_, and the fill_ inside it) of a tensor of saved's size in the backward."""
    layer = make_layer("softmax_shared").to(device)
    saved_numel = layer.forward()[4].numel()

    def leaf(t):
        return t.detach().clone().requires_grad_()

    router, w1, w2 = (leaf(t) for t in (layer.router, layer.w1, layer.w2))
    shared = (leaf(layer.shared_w1), leaf(layer.shared_w2))
    acc = accumulators_like(layer) if accumulate else None
    x = leaf(layer.x)
    y = mok.moe(x, router, w1, w2, config=layer.config, shared=shared, expert_bias=layer.expert_bias,
                ring_rows=RING_ROWS, accumulate_into=acc)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        y.backward(layer.dy)
    fills = [e.name for e in prof.events()
             if e.name in ("aten::zero_", "aten::fill_") and [saved_numel] in e.input_shapes]
    assert fills == [], f"the backward filled a tensor of saved's size ({saved_numel} bytes): {fills}"
    assert x.grad is not None  # the backward ran


@pytest.mark.parametrize("accumulate", (False, True), ids=("grad", "accumulate_into"))
def test_expert_bias_updated_between_forward_and_backward(accumulate):
    """Aux-loss-free balancing updates expert_bias in place, possibly before a micro-batch's backward: the
    backward reads the experts the forward selected (idx), not the bias, so it was not to be saved (saved,
    the update failed autograd's version check with a message naming neither the bias nor mok)."""
    layer = make_layer("sigmoid_grouped")
    bias = layer.expert_bias.clone()

    def gradients(update):
        x, w1 = layer.x.detach().clone().requires_grad_(), layer.w1.detach().clone().requires_grad_()
        acc = None
        if accumulate:
            acc = mok.GradAccumulators(*(torch.zeros_like(w, dtype=torch.float32) for w in (layer.router, w1, layer.w2)))
        y = mok.moe(x, layer.router, w1, layer.w2, config=layer.config, expert_bias=bias, ring_rows=RING_ROWS,
                    accumulate_into=acc)
        before = bias.clone()
        if update:
            bias.add_(0.25)
        y.backward(layer.dy)
        bias.copy_(before)
        return x.grad, acc.w1 if accumulate else w1.grad

    for got, want in zip(gradients(update=True), gradients(update=False)):
        assert_same_bits(got, want, "gradient")


@pytest.mark.parametrize("accumulate", (False, True), ids=("grad", "accumulate_into"))
def test_backward_fills_no_zero_gradient_for_saved(accumulate):
    assert_no_zero_gradient_for_saved(accumulate)


class _DropsGradient(torch.autograd.Function):
    """y's consumer that passes no gradient back."""

    @staticmethod
    def forward(ctx, y):
        return y.clone()

    @staticmethod
    def backward(ctx, grad):
        return None


@pytest.mark.parametrize("accumulate", (False, True), ids=("grad", "accumulate_into"))
def test_no_gradient_reaching_y_gives_none_and_runs_no_backward(accumulate):
    """Where no gradient reaches y, the backward gives its inputs none and runs no backward op (with
    materialized gradients it would run a whole backward on zeros); the accumulators stay as they were."""
    layer = make_layer("softmax_shared")
    x, w1 = layer.x.detach().clone().requires_grad_(), layer.w1.detach().clone().requires_grad_()
    acc = accumulators_like(layer, torch.ones_like) if accumulate else None
    y = moe_of(layer, x, w1, acc)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        (_DropsGradient.apply(y).float().sum() + x.float().sum()).backward()
    assert not [e.name for e in prof.events() if e.name.startswith("mok::backward")]
    assert_same_bits(x.grad, torch.ones_like(x), "x.grad (the loss's own term only)")
    assert w1.grad is None
    if accumulate:
        assert all(bool((t == 1).all()) for t in (acc.router, acc.w1, acc.w2, *acc.shared))


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
@pytest.mark.parametrize("name", CONFIGS)
def test_accumulate_into_adds_each_micro_batchs_fp32_gradients(name, mode):
    accumulate_two_micro_batches(name, mode)


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_accumulate_into_compiles_fullgraph(mode):
    accumulate_two_micro_batches("softmax_shared", mode, fn=torch.compile(mok.moe, fullgraph=True))


def test_accumulate_into_in_recompute_mode_has_the_same_bits():
    accumulate_two_micro_batches("sigmoid_grouped", ROUTER, fn=functools.partial(mok.moe, recompute=True))


def test_accumulate_into_refuses_wrong_accumulators_at_the_call():
    layer = make_layer("softmax_shared")
    shared = (layer.shared_w1, layer.shared_w2)
    good = accumulators_like(layer)
    x = layer.x.clone().requires_grad_()

    def refused(acc, message, **kwargs):
        with pytest.raises(ValueError, match=message):
            mok.moe(x, layer.router, layer.w1, layer.w2, config=layer.config, shared=shared, ring_rows=RING_ROWS,
                    accumulate_into=acc, **kwargs)

    refused(tuple(good), r"accumulate_into must be a mok.GradAccumulators, got tuple")
    refused(good._replace(w1=good.w1.half()), r"accumulate_into.w1 must be a contiguous float32 tensor")
    refused(good._replace(w1=good.w1.bfloat16()), r"accumulate_into.w2 must be a contiguous bfloat16 tensor")
    refused(good._replace(router=good.router.bfloat16()), r"accumulate_into.router must be .* float32 .*router's")
    refused(good._replace(w2=good.w2[:, :, :8]), r"accumulate_into.w2 must be .* of shape")
    refused(good._replace(w2=good.w2.transpose(1, 2).contiguous().transpose(1, 2)), r"w2 .*, not contiguous")
    refused(good._replace(w1=None), r"accumulate_into.w1 is missing")
    refused(good._replace(shared=(good.shared[0],)), r"accumulate_into.shared must be a pair")
    refused(good._replace(shared=(good.shared[0], None)), r"accumulate_into.shared\[1\] is missing")
    refused(good._replace(router=None), r"accumulate_into.router is missing")
    refused(good._replace(shared=None), r"accumulate_into.shared must be given")
    _, idx, w, _, _ = layer.forward()
    refused(good, r'accumulate_into.router must be None with replay="full"', routing=(idx, w))
    refused(good._replace(w1=good.w1.clone().requires_grad_()), r"accumulate_into.w1 requires grad")
    refused(good._replace(router=layer.router.detach()), r"accumulate_into.router shares its memory with the weight")
    with torch.inference_mode():
        inference = torch.zeros_like(good.w2)
    refused(good._replace(w2=inference), r"accumulate_into.w2 is an inference tensor")
    freed = [t.clone() for t in (good.w1, good.w2)]
    for t in freed:
        t.untyped_storage().resize_(0)  # as FSDP frees a shard: two were named as overlapping each other
    refused(good._replace(w1=freed[0], w2=freed[1]), r"accumulate_into.w1's storage has no data \(freed")


def test_accumulate_into_refuses_overlapping_accumulators():
    """Two accumulators that share elements (views of one buffer) would each take the other's gradient
    too (they were accepted): refused at the call, naming both. Disjoint views of one flat buffer (as a
    contiguous gradient buffer holds them) are accepted and get the separate accumulators' bits."""
    layer = make_layer("softmax_shared")
    shared = (layer.shared_w1, layer.shared_w2)
    x = layer.x.clone().requires_grad_()
    good = accumulators_like(layer)
    sizes = [t.numel() for t in (good.router, good.w1, good.w2, *good.shared)]

    def views(flat, starts):
        t = [flat[s:s + n].view(a.shape) for s, n, a in zip(starts, sizes, (good.router, good.w1, good.w2,
                                                                            *good.shared))]
        return mok.GradAccumulators(t[0], t[1], t[2], (t[3], t[4]))

    def call(acc, fn=mok.moe):
        y = fn(x, layer.router, layer.w1, layer.w2, config=layer.config, shared=shared, ring_rows=RING_ROWS,
               accumulate_into=acc)
        (y.float() * layer.dy.float()).sum().backward()

    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    overlapping = list(starts)
    overlapping[2] -= 8  # w2's first 8 elements are w1's last 8
    with pytest.raises(ValueError, match=r"accumulate_into.w2 overlaps accumulate_into.w1 in memory"):
        call(views(torch.zeros(sum(sizes), dtype=torch.float32), overlapping))
    # Compiled, mok.moe cannot look at addresses but sees views: accumulators viewing one tensor are refused
    # under the trace (Dynamo's Unsupported, with mok's message), before anything is added.
    buffer = torch.zeros(sum(sizes), dtype=torch.float32)
    with pytest.raises(Exception, match=r"accumulate_into.w2 and accumulate_into.w1 are one tensor or views of one"):
        call(views(buffer, overlapping), torch.compile(mok.moe, fullgraph=True))
    assert buffer.count_nonzero() == 0
    flat = views(torch.zeros(sum(sizes), dtype=torch.float32), starts)
    call(flat)
    call(good)
    for a, b, name in zip(flat[:3] + flat.shared, good[:3] + good.shared, ("router", "w1", "w2", "s1", "s2")):
        assert_same_bits(a, b, name)


def test_accumulate_into_refuses_an_accumulator_over_an_input():
    """An accumulator sharing bytes with a tensor the backward reads (here w1's over x's last 16 bytes, in one
    byte buffer) was accepted: the backward would add into memory it reads (on the GPU, while other blocks
    read it). Refused at the call, and by the op at the backward under torch.compile, before anything is added,
    naming both; placed just past x, the same bits as a separate accumulator's."""
    layer = make_layer("softmax_shared")
    x_bytes, w1_bytes = layer.x.numel() * 2, layer.w1.numel() * 4

    def call(w1_start, fn=mok.moe):
        buffer = torch.zeros(w1_start + w1_bytes, dtype=torch.uint8)
        x = buffer[:x_bytes].view(torch.bfloat16).view(layer.x.shape).copy_(layer.x).requires_grad_()
        acc = accumulators_like(layer)
        acc = acc._replace(w1=buffer[w1_start:].view(torch.float32).view(layer.w1.shape))
        (moe_of(layer, x, layer.w1, acc, fn).float() * layer.dy.float()).sum().backward()
        return acc

    with pytest.raises(ValueError, match="accumulate_into.w1 overlaps x in memory: the backward would add into"):
        call(x_bytes - 16)
    with pytest.raises(ValueError, match="d_w1 overlaps x in memory"):
        call(x_bytes - 16, torch.compile(mok.moe, fullgraph=True))
    apart, alone = call(x_bytes), accumulators_like(layer)
    moe_of(layer, layer.x.clone().requires_grad_(), layer.w1, alone).float().mul(layer.dy.float()).sum().backward()
    assert_same_bits(apart.w1, alone.w1)


@pytest.mark.parametrize("accumulate", (False, True), ids=("grad", "accumulate_into"))
def test_double_backward_raises(accumulate):
    """The backward ops have no derivative: a gradient of a gradient raises instead of coming back None."""
    layer = make_layer("softmax_shared")
    x, w1 = layer.x.detach().clone().requires_grad_(), layer.w1.detach().clone().requires_grad_()
    acc = accumulators_like(layer) if accumulate else None
    y = moe_of(layer, x, w1, acc)
    (dx,) = torch.autograd.grad((y.float() * layer.dy.float()).sum(), x, create_graph=True)
    # Either backward op's autograd fallback: a node that raises. The Python Function's was once_differentiable,
    # which gave dx no graph (dy needs none): a loss of dx beside another term of x took its second derivative
    # as zero without a word.
    op = "backward_accumulate" if accumulate else "backward_consuming"
    with pytest.raises(RuntimeError, match=f"derivative for mok::{op} is not implemented"):
        torch.autograd.grad(dx.float().sum(), (x, w1), allow_unused=True)
    with pytest.raises(RuntimeError, match=f"derivative for mok::{op} is not implemented"):
        (dx.float().square().sum() + x.float().sum()).backward()


def test_a_second_backward_of_one_forward_is_refused(device="cpu"):
    """autograd's backward (mok::backward_consuming) writes dh over the saved h on the GPU: a second backward of the
    same forward (retain_graph) is refused, naming why, and adds no gradient; the first one's are the backward
    op's (test_gradients_are_the_backward_ops)."""
    layer = make_layer("softmax_shared").to(device)
    x = layer.x.detach().clone().requires_grad_()
    y = moe_of(layer, x, layer.w1, None)
    (y.float() * layer.dy.float()).sum().backward(retain_graph=True)
    first = x.grad.clone()
    with pytest.raises(RuntimeError, match="already ran, and it consumed the saved activations"):
        (y.float() * layer.dy.float()).sum().backward()
    assert_same_bits(x.grad, first, "x.grad (the first backward's alone)")


def test_accumulate_into_views_under_create_graph():
    """Accumulators that are views of one flat buffer (split, or slices made under no_grad) under create_graph
    (a gradient penalty's first-order pass): without once_differentiable the op ran with grad mode on, and its
    autograd fallback refused to write into such views ("A view was created in no_grad mode ..."). They get
    plain accumulators' bits; the version counter still moves."""
    layer = make_layer("softmax_shared")
    weights = (layer.router, layer.w1, layer.w2, layer.shared_w1, layer.shared_w2)
    sizes = [w.numel() for w in weights]

    def accumulators(parts):
        return mok.GradAccumulators(*[p.view(w.shape) for p, w in zip(parts[:3], weights)],
                                    (parts[3].view(layer.shared_w1.shape), parts[4].view(layer.shared_w2.shape)))

    def call(acc):
        x = layer.x.clone().requires_grad_()
        loss = (moe_of(layer, x, layer.w1, acc).float() * layer.dy.float()).sum() + x.float().square().sum()
        torch.autograd.grad(loss, x, create_graph=True)
        return acc

    plain = call(accumulators_like(layer))
    split = torch.zeros(sum(sizes))
    version = split._version
    with torch.no_grad():
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        sliced = accumulators([torch.zeros(sum(sizes))[s:s + n] for s, n in zip(starts, sizes)])
    for acc in (call(accumulators(split.split(sizes))), call(sliced)):
        for a, b, name in zip(acc[:3] + acc.shared, plain[:3] + plain.shared, ("router", "w1", "w2", "s1", "s2")):
            assert_same_bits(a, b, name)
    assert split._version > version


def test_accumulate_into_under_vmap_without_grad():
    """torch.vmap's inputs have no storage: the call's overlap check read their data pointers and raised
    ("Cannot access data pointer of Tensor that doesn't have storage"); they are left to the op, whose
    per-slice results are the plain calls'."""
    layer = make_layer("softmax_shared")
    with torch.no_grad():
        halves = torch.vmap(lambda x: moe_of(layer, x, layer.w1, accumulators_like(layer)))(layer.x.view(2, 16, -1))
        assert_same_bits(halves[1], moe_of(layer, layer.x[16:].contiguous(), layer.w1, None))


def test_forward_mode_derivative_raises():
    """mok::forward has no forward-mode formula: a dual x (forward_ad) or torch.func.jvp got y's tangent as
    zero (or none) without a word; now NotImplementedError. Without a tangent, dual_level and vmap still run."""
    import torch.autograd.forward_ad as fwAD

    layer = make_layer("softmax_shared")
    message = "^mok::forward has no forward-mode derivative"
    with pytest.raises(NotImplementedError, match=message):
        torch.func.jvp(lambda x: moe_of(layer, x, layer.w1, None), (layer.x,), (torch.ones_like(layer.x),))
    with pytest.raises(NotImplementedError, match=message):
        torch.func.jvp(lambda w1: moe_of(layer, layer.x, w1, None), (layer.w1,), (torch.ones_like(layer.w1),))
    for requires_grad in (False, True):
        with fwAD.dual_level():
            x = fwAD.make_dual(layer.x.detach().clone().requires_grad_(requires_grad), torch.ones_like(layer.x))
            with pytest.raises(NotImplementedError, match=message):
                moe_of(layer, x, layer.w1, None)
    y = moe_of(layer, layer.x, layer.w1, None)
    with fwAD.dual_level():
        assert_same_bits(moe_of(layer, layer.x, layer.w1, None), y)
    halves = torch.vmap(lambda x: moe_of(layer, x, layer.w1, None))(layer.x.view(2, 16, -1))
    assert_same_bits(halves[1], moe_of(layer, layer.x[16:].contiguous(), layer.w1, None))


def test_accumulate_into_bumps_the_accumulators_version():
    """backward_accumulate writes its accumulators in place: their version counters move, so a graph that
    saved one of them refuses its backward rather than reading the new values."""
    layer = make_layer("softmax_shared")
    acc = accumulators_like(layer)
    leaf = torch.ones_like(acc.w1, requires_grad=True)
    saved_w1 = acc.w1
    product = (leaf * saved_w1).sum()  # saves acc.w1 for its backward
    x = layer.x.detach().clone().requires_grad_()
    y = moe_of(layer, x, layer.w1, acc)
    (y.float() * layer.dy.float()).sum().backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        product.backward()


def test_module_main_grad_accumulates_and_zeroes():
    """mok.MoE(main_grad=True): each parameter's main_grad holds what mok.moe's accumulate_into adds over
    the micro-batches (zeros at construction), and no .grad; no_grad leaves them; zero_main_grad clears
    them; with replay="full" the router's is left as it is. The first micro-batch's, rounded to the
    parameter's dtype, is plain autograd's .grad."""
    layer = make_layer("softmax_shared")
    model = mok.MoE(layer.config, ring_rows=RING_ROWS, generator=torch.Generator().manual_seed(5), main_grad=True)
    plain = mok.MoE(layer.config, ring_rows=RING_ROWS, generator=torch.Generator().manual_seed(5))
    params = dict(model.named_parameters())
    zeros = {k: torch.zeros_like(p, dtype=torch.float32) for k, p in params.items()}
    acc = mok.GradAccumulators(zeros["router"], zeros["w1"], zeros["w2"], (zeros["shared_w1"], zeros["shared_w2"]))
    batches = (layer.x, make_layer("softmax_shared", seed=1).x)
    for x in batches:
        (model(x).float() * layer.dy.float()).sum().backward()
        w = {k: p.detach().requires_grad_() for k, p in params.items()}
        (mok.moe(x, w["router"], w["w1"], w["w2"], config=layer.config, shared=(w["shared_w1"], w["shared_w2"]),
                 ring_rows=RING_ROWS, accumulate_into=acc).float() * layer.dy.float()).sum().backward()
    for name, a in zip(("router", "w1", "w2", "shared_w1", "shared_w2"), (acc.router, acc.w1, acc.w2, *acc.shared)):
        assert params[name].grad is None, name
        assert_same_bits(params[name].main_grad, a, name)
    before = {k: p.main_grad.clone() for k, p in params.items()}
    with torch.no_grad():
        model(layer.x)
    _, idx, w, _, _ = layer.forward()
    (model(layer.x, routing=(idx, w)).float() * layer.dy.float()).sum().backward()  # replay="full"
    assert_same_bits(params["router"].main_grad, before["router"], "router, replay full")
    assert not torch.equal(params["w1"].main_grad, before["w1"]), "w1, replay full"
    # The same sums from plain autograd's bf16 .grad cannot be told apart bitwise; the first micro-batch
    # alone can: its main_grad is the fp32 gradient, whose bf16 rounding is plain autograd's .grad.
    model.zero_main_grad()
    assert all(not p.main_grad.any() for p in model.parameters())
    (model(layer.x).float() * layer.dy.float()).sum().backward()
    (plain(layer.x).float() * layer.dy.float()).sum().backward()
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        assert_same_bits(p.main_grad.to(q.grad.dtype), q.grad, name)


def test_module_main_grad_for_parameters_put_in_after_construction():
    """A parameter put in after construction (load_state_dict(assign=True) makes new ones) gets a main_grad
    of zeros at the next forward, into which the backward adds, as the module's own did."""
    layer = make_layer("softmax_shared")
    model = mok.MoE(layer.config, ring_rows=RING_ROWS, generator=torch.Generator().manual_seed(5), main_grad=True)
    plain = mok.MoE(layer.config, ring_rows=RING_ROWS, generator=torch.Generator().manual_seed(5))
    model.load_state_dict(plain.state_dict(), assign=True)
    assert all(getattr(p, "main_grad", None) is None for p in model.parameters())
    (model(layer.x).float() * layer.dy.float()).sum().backward()
    (plain(layer.x).float() * layer.dy.float()).sum().backward()
    for (name, p), q in zip(model.named_parameters(), plain.parameters(), strict=True):
        assert p.grad is None, name
        assert_same_bits(p.main_grad.to(q.grad.dtype), q.grad, name)


def test_module_zero_main_grad_after_parameters_put_in_after_construction():
    """zero_main_grad before the forward that makes a put-in parameter's main_grad makes it, as zeros (it
    raised AttributeError, then skipped it); the backward adds into it."""
    layer = make_layer("softmax_shared")
    model = mok.MoE(layer.config, ring_rows=RING_ROWS, generator=torch.Generator().manual_seed(5), main_grad=True)
    model.load_state_dict(mok.MoE(layer.config).state_dict(), assign=True)
    model.zero_main_grad()
    assert all(p.main_grad.dtype == torch.float32 and not p.main_grad.any() for p in model.parameters())
    model(layer.x).float().sum().backward()
    assert all(p.main_grad.any() for p in model.parameters())


def test_compiled_module_refuses_to_make_main_grad_in_the_graph():
    """A put-in parameter's main_grad made inside a compiled graph failed in inductor ("Node getitem_8 was
    invalid, but is output"), naming neither main_grad nor the fix; refused by name, and zero_main_grad()
    before the compiled call makes the compiled step the eager one."""
    layer = make_layer("softmax_shared")
    models = []
    for _ in range(2):
        model = mok.MoE(layer.config, ring_rows=RING_ROWS, generator=torch.Generator().manual_seed(5), main_grad=True)
        model.load_state_dict(mok.MoE(layer.config, generator=torch.Generator().manual_seed(6)).state_dict(),
                              assign=True)
        models.append(model)
    with pytest.raises(Exception, match="main_grad under torch.compile needs every parameter's main_grad made"):
        torch.compile(models[0], fullgraph=True)(layer.x)
    for model, run in zip(models, (lambda m: m, lambda m: torch.compile(m, fullgraph=True))):
        model.zero_main_grad()
        (run(model)(layer.x).float() * layer.dy.float()).sum().backward()
    for (name, p), q in zip(models[0].named_parameters(), models[1].parameters(), strict=True):
        assert_same_bits(p.main_grad, q.main_grad, name)


def test_module_accumulate_grad_has_plain_autograds_grad_bits():
    """mok.MoE(accumulate_grad=True): over two micro-batches each parameter's .grad holds the bits plain
    autograd accumulates into a .grad that held zeros, and stays the tensor it was, while autograd gives
    the parameters no gradient (a hook on each sees None; plain's see tensors), and their post-accumulate
    hooks run; no_grad makes none; replay="full" makes no router .grad; a frozen parameter is refused;
    after zero_grad() (set_to_none) the next forward makes new zeros, which the optimizer's step reads;
    replay="full" leaves the router's .grad alone; main_grad with it is refused."""
    layer = make_layer("softmax_shared")
    model, plain = (mok.MoE(layer.config, ring_rows=RING_ROWS, generator=torch.Generator().manual_seed(5),
                            accumulate_grad=accumulate) for accumulate in (True, False))
    with torch.no_grad():
        model(layer.x)
    assert all(p.grad is None for p in model.parameters())
    for p in plain.parameters():
        p.grad = torch.zeros_like(p)
    hooked = {m: [] for m in (model, plain)}  # per call: whether autograd's gradient was None
    posted = []
    for m in (model, plain):
        for p in m.parameters():
            p.register_hook(lambda g, m=m: hooked[m].append(g is None))
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(posted.append)
    batches = (layer.x, make_layer("softmax_shared", seed=1).x)
    for x in batches:
        for m in (model, plain):
            (m(x).float() * layer.dy.float()).sum().backward()
        if x is batches[0]:
            first = {name: p.grad for name, p in model.named_parameters()}
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        assert p.grad is first[name], name
        assert_same_bits(p.grad, q.grad, name)
    assert hooked[model] == [True] * 2 * len(first) and hooked[plain] == [False] * 2 * len(first)
    assert len(posted) == 2 * len(first)
    _, idx, w, _, _ = layer.forward()
    router_grad = model.router.grad.clone()
    (model(layer.x, routing=(idx, w)).float() * layer.dy.float()).sum().backward()  # replay="full"
    assert_same_bits(model.router.grad, router_grad, "router, replay full")
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    optimizer.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    (model(layer.x).float() * layer.dy.float()).sum().backward()
    before = model.w1.detach().clone()
    optimizer.step()
    assert not torch.equal(model.w1.detach(), before), "the optimizer read the new .grad"
    optimizer.zero_grad()
    (model(layer.x, routing=(idx, w)).float() * layer.dy.float()).sum().backward()  # replay="full"
    assert model.router.grad is None and model.w1.grad is not None, "the router gets none, as from autograd"
    with pytest.raises(ValueError, match="main_grad and accumulate_grad exclude each other"):
        mok.MoE(layer.config, main_grad=True, accumulate_grad=True)
    model.w2.requires_grad_(False)
    with pytest.raises(ValueError, match="accumulate_grad: a parameter does not require grad"):
        model(layer.x)
    assert "accumulate_grad=True" in repr(model)


@pytest.mark.parametrize("option", ["main_grad", "accumulate_grad"])
def test_module_accumulators_refuse_a_weight_that_is_no_leaf(option):
    """A parametrized weight (or functional_call's computed one) is a temporary: main_grad made one its own
    main_grad and added the gradient there, and the parametrization's original got none, without a word
    (accumulate_grad raised torch's "grad_dtype can only be accessed on leaf tensors"). Refused, naming it."""
    layer = make_layer("softmax_shared")
    model = mok.MoE(layer.config, ring_rows=RING_ROWS, generator=torch.Generator().manual_seed(6), **{option: True})

    class Double(torch.nn.Module):
        def forward(self, w):
            return w * 2

    torch.nn.utils.parametrize.register_parametrization(model, "w1", Double())
    with pytest.raises(ValueError, match=f"w1 is not a leaf tensor .*: {option} adds its gradient"):
        model(layer.x)


@pytest.mark.parametrize("option", ["main_grad", "accumulate_grad"])
def test_module_accumulators_run_under_fake_tensor_mode(option):
    """Under FakeTensorMode (memory and FLOP estimates) every storage's address is 0: a step with main_grad or
    accumulate_grad was refused as "w1.main_grad shares its memory with the weight itself"."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    config = make_layer("softmax_shared").config
    with FakeTensorMode():
        model = mok.MoE(config, ring_rows=RING_ROWS, **{option: True})
        x = torch.empty(config.tokens, config.hidden, dtype=torch.bfloat16, requires_grad=True)
        model(x).float().sum().backward()
        assert x.grad.shape == x.shape


def test_module_accumulate_grad_adds_into_the_grad_the_backward_finds():
    """Eagerly the backward adds into the .grad each parameter holds when it runs, as plain autograd does. Before,
    into the one its forward took: after forward, optimizer.zero_grad() (set_to_none), backward (a common order)
    the step's gradient went into tensors no parameter held (every .grad None, the optimizer skipped them all
    without a word). Also a .grad replaced in between, and a checkpointed call (its recomputed forward made new
    .grad after zero_grad): plain autograd's bits in each."""
    from torch.utils.checkpoint import checkpoint

    layer = make_layer("softmax_shared")
    x2 = make_layer("softmax_shared", seed=1).x
    model, plain = (mok.MoE(layer.config, ring_rows=RING_ROWS, generator=torch.Generator().manual_seed(5),
                            accumulate_grad=accumulate) for accumulate in (True, False))

    def loss(y):
        return (y.float() * layer.dy.float()).sum()

    for m in (model, plain):
        loss(m(layer.x)).backward()  # a first step's .grad, which zero_grad drops
        y = m(x2)
        torch.optim.SGD(m.parameters(), lr=1.0).zero_grad()
        loss(y).backward()
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        assert_same_bits(p.grad, q.grad, f"zero_grad between: {name}")
    for m in (model, plain):
        y = m(layer.x)
        m.w2.grad = torch.full_like(m.w2, 0.5)
        loss(y).backward()
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        assert_same_bits(p.grad, q.grad, f"w2.grad replaced: {name}")
    for m in (model, plain):
        y = checkpoint(m, x2, use_reentrant=False)
        m.zero_grad()
        loss(y).backward()
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        assert_same_bits(p.grad, q.grad, f"checkpointed: {name}")


def test_module_accumulate_grad_compiles_fullgraph_given_its_grads():
    """Compiled (fullgraph), mok.MoE(accumulate_grad=True) gives eager's .grad bits once the .grad tensors
    exist, on the accumulate path (a hook on each parameter sees None); a .grad it would have to make
    inside the graph is refused, naming the fix."""
    layer = make_layer("softmax_shared")
    eager, compiled = (mok.MoE(layer.config, ring_rows=RING_ROWS, generator=torch.Generator().manual_seed(6),
                               accumulate_grad=True) for _ in range(2))
    step = torch.compile(compiled, fullgraph=True)
    with pytest.raises(Exception, match="accumulate_grad under torch.compile needs every parameter's .grad"):
        step(layer.x)
    nones = []
    for p in compiled.parameters():
        p.grad = torch.zeros_like(p)
        p.register_hook(lambda g: nones.append(g is None))
    for x in (layer.x, make_layer("softmax_shared", seed=1).x):
        for m in (eager, step):
            (m(x).float() * layer.dy.float()).sum().backward()
    assert nones and all(nones)
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
        assert_same_bits(q.grad, p.grad, name)


def fp8_models(device="cuda", **options):
    """A small fp8 layer with a shared expert: its config, the same weights on the CPU and on `device`
    (both MoE(**options)), and an x of its 40 tokens (on the CPU)."""
    config = mok.MoEConfig(experts=4, hidden=128, intermediate=256, top_k=2, tokens_per_rank=40, precision="fp8",
                           shared_intermediate=128)
    cpu_model = mok.MoE(config, generator=torch.Generator().manual_seed(3), **options)
    gpu_model = mok.MoE(config, device=device, **options)
    gpu_model.load_state_dict(cpu_model.state_dict())
    return config, cpu_model, gpu_model, torch.randn(40, 128, generator=torch.Generator().manual_seed(4)).bfloat16()


def fp8_accumulate_grad_gives_plain_autograds_grad_bits(device):
    """mok.MoE(accumulate_grad=True) in the fp8 mode (on the GPU the fp8 kernel's own bf16 accumulate
    epilogue): over two micro-batches each .grad has the bits plain autograd accumulates into zeroed .grad
    tensors, while autograd gives the parameters no gradient (a hook on each sees None)."""
    config, cpu_model, _, x = fp8_models(device)
    fused, plain = (mok.MoE(config, device=device, accumulate_grad=accumulate) for accumulate in (True, False))
    for m in (fused, plain):
        m.load_state_dict(cpu_model.state_dict())
    for p in plain.parameters():
        p.grad = torch.zeros_like(p)
    hooked = []
    for p in fused.parameters():
        p.register_hook(lambda g: hooked.append(g is None))
    second = torch.randn(x.shape, generator=torch.Generator().manual_seed(5)).bfloat16()
    for batch in (x, second):
        for m in (fused, plain):
            m(batch.to(device)).float().sum().backward()
        assert hooked and all(hooked)
    for (name, p), q in zip(fused.named_parameters(), plain.parameters()):
        assert_same_bits(p.grad.cpu(), q.grad.cpu(), name)


def test_fp8_weight_gradients_change_only_the_routed_experts_weight_gradients():
    """fp8_weight_gradients (CPU op) gives the routed experts' w1 and w2 other gradients (E4M3 operands),
    and leaves y, dx, the router's and the shared expert's gradients as the default's, bit for bit."""
    _, default, _, x = fp8_models("cpu")
    _, option, _, _ = fp8_models("cpu", fp8_weight_gradients=True)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    ys = [m(xi) for m, xi in zip((default, option), xs)]
    assert_same_bits(ys[1].detach(), ys[0].detach(), "y")
    for y in ys:
        y.float().sum().backward()
    assert_same_bits(xs[1].grad, xs[0].grad, "dx")
    for (name, p0), p1 in zip(default.named_parameters(), option.parameters()):
        if name in ("w1", "w2"):
            assert not torch.equal(p1.grad.view(torch.int16), p0.grad.view(torch.int16)), name
        else:
            assert_same_bits(p1.grad, p0.grad, name)


def test_fp8_accumulate_grad_gives_plain_autograds_grad_bits_on_cpu():
    fp8_accumulate_grad_gives_plain_autograds_grad_bits("cpu")


def test_module_with_main_grad_compiles_fullgraph_and_moves_them():
    layer = make_layer("softmax_shared")
    models = [mok.MoE(layer.config, ring_rows=RING_ROWS, generator=torch.Generator().manual_seed(6), main_grad=True)
              for _ in range(2)]
    for model, run in zip(models, (lambda m: m, lambda m: torch.compile(m, fullgraph=True))):
        (run(model)(layer.x).float() * layer.dy.float()).sum().backward()
    for (name, p), q in zip(models[0].named_parameters(), models[1].parameters()):
        assert_same_bits(q.main_grad, p.main_grad, name)
    models[0].to("meta")  # new Parameters: each main_grad follows its parameter, still fp32
    for name, p in models[0].named_parameters():
        assert p.main_grad.device.type == "meta" and p.main_grad.dtype == torch.float32, name


def flat_main_grads(model):
    """Each parameter's main_grad a view of one fp32 buffer (Megatron's contiguous gradient buffer)."""
    flat = torch.zeros(sum(p.numel() for p in model.parameters()))
    at = 0
    for p in model.parameters():
        p.main_grad = flat[at:at + p.numel()].view(p.shape)
        at += p.numel()


def test_main_grads_in_one_buffer_are_refused_compiled_fullgraph():
    """Inductor's compiled backward added into accumulators that are views of one tensor wrong (values past
    each view: NaN, 1e20, thousands of w2's): under a trace they are refused, naming two of them. Dynamo does not
    guard on views, so a module traced before with accumulators of their own keeps its graph (which adds into
    views right: test_main_grads_in_one_buffer_compile_to_eagers_bits_without_fullgraph): traced afresh here."""
    torch.compiler.reset()
    layer = make_layer("softmax_shared")
    model = mok.MoE(layer.config, ring_rows=RING_ROWS, generator=torch.Generator().manual_seed(6), main_grad=True)
    flat_main_grads(model)
    with pytest.raises(Exception, match=r"\w+\.main_grad and \w+\.main_grad are one tensor or views of one"):
        torch.compile(model, fullgraph=True)(layer.x)


def test_main_grads_in_one_buffer_compile_to_eagers_bits_without_fullgraph():
    """Without fullgraph Dynamo runs the call it refuses under the trace eagerly, which takes views that do not
    overlap: eager's bits (the compiled backward gave thousands of wrong values). Traced afresh (above)."""
    torch.compiler.reset()
    layer = make_layer("softmax_shared")
    models = [mok.MoE(layer.config, ring_rows=RING_ROWS, generator=torch.Generator().manual_seed(6), main_grad=True)
              for _ in range(2)]
    for model, run in zip(models, (lambda m: m, torch.compile)):
        flat_main_grads(model)
        (run(model)(layer.x).float() * layer.dy.float()).sum().backward()
    for (name, p), q in zip(models[0].named_parameters(), models[1].parameters()):
        assert_same_bits(q.main_grad, p.main_grad, name)


@pytest.mark.parametrize("fullgraph", [True, False])
def test_main_grads_sharing_a_storage_otherwise_are_refused_compiled(fullgraph):
    """Accumulators sharing one storage other than as views of one tensor (slices of separate .detach()es of a
    flat buffer: no common _base) were not seen under a trace and got Inductor's wrong adds. The fake tensors
    share a storage where the inputs do: mok::check_unaliased refuses them while the trace records the call, with
    fullgraph and without (no eager fallback there: an error)."""
    torch.compiler.reset()
    layer = make_layer("softmax_shared")
    model = mok.MoE(layer.config, ring_rows=RING_ROWS, generator=torch.Generator().manual_seed(6), main_grad=True)
    flat = torch.zeros(sum(p.numel() for p in model.parameters()))
    at = 0
    for p in model.parameters():
        p.main_grad = flat.detach()[at:at + p.numel()].view(p.shape)
        at += p.numel()
    with pytest.raises(Exception, match=r"w2\.main_grad and w1\.main_grad share a storage"):
        torch.compile(model, fullgraph=fullgraph)(layer.x)
    assert flat.count_nonzero() == 0


def test_a_graph_traced_with_separate_accumulators_refuses_overlapping_ones_at_the_backward():
    """Dynamo does not guard on storage: a module compiled with main_grads of their own keeps its graph for another
    whose router and w1 main_grads overlap (slices of separate .detach()es of one buffer, which the trace-time
    checks never see). The op itself refuses them at the backward, before adding anything."""
    torch.compiler.reset()
    layer = make_layer("softmax_shared")
    models = [mok.MoE(layer.config, ring_rows=RING_ROWS, generator=torch.Generator().manual_seed(6), main_grad=True)
              for _ in range(2)]
    (torch.compile(models[0], fullgraph=True)(layer.x).float() * layer.dy.float()).sum().backward()
    router, w1 = models[1].router, models[1].w1
    flat = torch.zeros(max(router.numel(), w1.numel()))
    router.main_grad = flat.detach()[:router.numel()].view(router.shape)
    w1.main_grad = flat.detach()[:w1.numel()].view(w1.shape)
    y = torch.compile(models[1], fullgraph=True)(layer.x)
    with pytest.raises(ValueError, match="d_w1 overlaps d_router in memory"):
        (y.float() * layer.dy.float()).sum().backward()
    assert flat.count_nonzero() == 0


def test_module_with_main_grad_materialized_from_meta_by_to_empty():
    """A module made on the meta device and materialized by to_empty() (deferred initialization): each meta
    main_grad, which holds no values, raised "Cannot copy out of meta tensor" there; now zeros on the new
    device, fp32, as at construction, and the steps accumulate into them."""
    layer = make_layer("softmax_shared")
    model = mok.MoE(layer.config, ring_rows=RING_ROWS, device="meta", main_grad=True)
    model.to_empty(device="cpu")
    model.reset_parameters(torch.Generator().manual_seed(6))
    for name, p in model.named_parameters():
        assert p.main_grad.device.type == "cpu" and p.main_grad.dtype == torch.float32, name
        assert p.main_grad.count_nonzero() == 0, name
    eager = mok.MoE(layer.config, ring_rows=RING_ROWS, generator=torch.Generator().manual_seed(6), main_grad=True)
    for m in (model, eager):
        (m(layer.x).float() * layer.dy.float()).sum().backward()
    for (name, p), q in zip(eager.named_parameters(), model.parameters()):
        assert_same_bits(q.main_grad, p.main_grad, name)
