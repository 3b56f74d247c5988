"""Bad input raises ValueError naming the problem, before any work (on the CPU)."""

import dataclasses
import os
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="the mok package needs PyTorch")

import mok  # noqa: E402
from helpers import GIVEN, REPLAY_IDS, RING_ROWS, ROUTER, assert_same_bits, make_layer  # noqa: E402
from mok.config import LAUNCH_FIELDS, pack_launch  # noqa: E402

CPU_QUANTIZES = "the CPU op quantizes the fp8 mode's weights in each forward and backward"


def forward_args(layer, mode=ROUTER, topk_idx=None, topk_w=None, launch=None, **replace):
    """mok::forward's arguments with some of the layer's tensors replaced."""
    t = dict(x=layer.x, router=layer.router, expert_bias=layer.expert_bias, w1=layer.w1, w2=layer.w2,
             shared_w1=layer.shared_w1, shared_w2=layer.shared_w2)
    t.update(replace)
    ints, floats = layer.config.pack()
    return (*t.values(), topk_idx, topk_w, ints, floats, mode, launch or pack_launch(RING_ROWS))


def forward_with(layer, *args, **replace):
    return torch.ops.mok.forward(*forward_args(layer, *args, **replace))


def fake_args(mode, args, symbolic=False):
    """args with each tensor a fake of mode (FakeTensorMode's: torch.compile's tracing); symbolic: with
    symbolic sizes (dynamic shapes)."""
    from torch._dynamo.source import ConstantSource

    def fake(i, a):
        if not isinstance(a, torch.Tensor):
            return a
        return mode.from_tensor(a, static_shapes=False, source=ConstantSource(f"t{i}")) if symbolic \
            else mode.from_tensor(a)

    return [fake(i, a) for i, a in enumerate(args)]


def assert_fake_raises_the_kernels_error(op, args, message, symbolic=False):
    """op's kernel raises a ValueError matching message for args, and so does its fake kernel, with the
    kernel's first line; symbolic: the fakes' sizes symbolic (dynamic shapes)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    with pytest.raises(ValueError, match=message) as real:
        op(*args)
    with FakeTensorMode(shape_env=ShapeEnv() if symbolic else None) as mode:
        fakes = fake_args(mode, args, symbolic)
        with pytest.raises(ValueError, match=message) as traced:
            op(*fakes)
    assert str(traced.value).splitlines()[0] == str(real.value).splitlines()[0]


@pytest.mark.parametrize("name,bad,message", [
    ("x", lambda t: t.float(), "x must be BFloat16, got Float"),
    ("router", lambda t: t.to(torch.bfloat16), "router must be Float"),
    ("w1", lambda t: t.float(), "w1 must be BFloat16"),
    ("w1", lambda t: t[:, :64], r"w1 must have shape \[4, 128, 64\] = \[E, 2I, H\]"),
    ("w2", lambda t: t.transpose(1, 2).contiguous().transpose(1, 2), "w2 is not contiguous"),
    ("x", lambda t: t[:16], r"x must have shape \[32, 64\]"),
    ("shared_w1", lambda t: None, "shared_w1 is missing"),
    ("expert_bias", lambda t: torch.zeros(3), r"expert_bias must have shape \[4\]"),
])
def test_bad_tensor(name, bad, message):
    """The kernel refuses it, and so does the fake kernel (tracing raises the kernel's error)."""
    layer = make_layer("softmax_shared")
    assert_fake_raises_the_kernels_error(torch.ops.mok.forward, forward_args(layer, **{name: bad(getattr(layer, name))}),
                                         message)


SOFTMAX_BIAS = "expert_bias is given, but the config's score_mode is softmax"


@pytest.mark.parametrize("op", ["forward", "backward", "backward_accumulate"])
def test_expert_bias_in_softmax_mode_is_refused(op):
    """Softmax mode adds no bias to the selection key: a bias given there, zeros too, is refused by each op
    and by its fake kernel (it was ignored). By presence: no read of its values (a GPU sync)."""
    layer = make_layer("softmax_shared")
    bias = torch.zeros(layer.config.experts)
    args = forward_args(layer, expert_bias=bias) if op == "forward" else \
        backward_args(layer, op == "backward_accumulate", expert_bias=lambda t: bias)
    assert_fake_raises_the_kernels_error(getattr(torch.ops.mok, op), args, SOFTMAX_BIAS)


def test_moe_refuses_expert_bias_in_softmax_mode_and_the_module_holds_none():
    """mok.moe raises the op's error; mok.MoE in softmax mode registers no bias (its state_dict has none)
    and passes none."""
    layer = make_layer("softmax_shared")
    with pytest.raises(ValueError, match=SOFTMAX_BIAS):
        mok.moe(layer.x, layer.router, layer.w1, layer.w2, config=layer.config,
                shared=(layer.shared_w1, layer.shared_w2), expert_bias=torch.zeros(layer.config.experts),
                ring_rows=RING_ROWS)
    model = mok.MoE(layer.config, ring_rows=RING_ROWS)
    assert model.expert_bias is None and "expert_bias" not in model.state_dict()
    model(layer.x)
    assert mok.MoE(make_layer("sigmoid_grouped").config).expert_bias is not None


def backward_args(layer, accumulate=False, launch=None, **replace):
    """mok::backward's (accumulate: mok::backward_accumulate's, fp32 accumulators) arguments after a
    forward, some replaced by functions of them."""
    _, idx, w, logits, saved = layer.forward()
    names = ("x", "router", "expert_bias", "w1", "w2", "shared_w1", "shared_w2")
    t = dict(zip(names, layer.weights()), topk_idx=idx, topk_w=w, logits=logits, saved=saved, dy=layer.dy)
    if accumulate:
        t.update((f"d_{n}", torch.zeros_like(t[n], dtype=torch.float32)) for n in names[1:] if n != "expert_bias")
    t.update((name, bad(t[name])) for name, bad in replace.items())
    ints, floats, mode, default_launch = layer.op_args()
    return (*t.values(), ints, floats, mode, launch or default_launch)


@pytest.mark.parametrize("accumulate,name,bad,message", [
    (False, "saved", lambda t: t.to(torch.int8), "saved must be Byte, got Char"),
    (False, "dy", lambda t: t[:16], r"dy must have shape \[32, 64\] = \[N, H\]"),
    (False, "logits", lambda t: t.double(), "logits must be Float"),
    (False, "topk_idx", lambda t: t.long(), "topk_idx must be Int, got Long"),
    (True, "d_w2", lambda t: t.to(torch.bfloat16), "d_w2 must be Float, got BFloat16"),
    (True, "d_router", lambda t: None, "d_router is missing: routing mode router"),
    (True, "d_shared_w1", lambda t: t[:, :8], r"d_shared_w1 must have shape"),
])
def test_bad_backward_tensor(accumulate, name, bad, message):
    """mok::backward and mok::backward_accumulate refuse it, and so do their fake kernels."""
    op = torch.ops.mok.backward_accumulate if accumulate else torch.ops.mok.backward
    layer = make_layer("softmax_shared")
    assert_fake_raises_the_kernels_error(op, backward_args(layer, accumulate, **{name: bad}), message)


def freed(t):
    """A copy of t whose storage is freed, as FSDP frees a sharded parameter's (resize_(0))."""
    t = t.clone()
    t.untyped_storage().resize_(0)
    return t


def halved(t):
    """A copy of t whose storage holds half its bytes."""
    t = t.clone()
    t.untyped_storage().resize_(t.nbytes // 2)
    return t


@pytest.mark.parametrize("cut,says", [(freed, "'s storage has no data \\(freed"),
                                      (halved, "'s storage holds \\d+ bytes, fewer than its \\d+ \\(shrunk")])
@pytest.mark.parametrize("name", ["x", "router", "w1", "shared_w2"])
def test_a_freed_or_shrunk_storage_is_refused(name, cut, says):
    """A tensor whose storage was freed crashed the process (SIGSEGV); one shrunk was read past its end."""
    layer = make_layer("softmax_shared")
    with pytest.raises(ValueError, match=name + says):
        forward_with(layer, **{name: cut(getattr(layer, name))})


@pytest.mark.parametrize("accumulate,name", [(False, "x"), (False, "w2"), (False, "saved"), (True, "d_w1")])
def test_a_storage_freed_before_the_backward_is_refused(accumulate, name):
    """An input freed between the forward and the backward (or an accumulator), refused by the backward."""
    op = torch.ops.mok.backward_accumulate if accumulate else torch.ops.mok.backward
    with pytest.raises(ValueError, match=f"{name}'s storage has no data \\(freed"):
        op(*backward_args(make_layer("softmax_shared"), accumulate, **{name: freed}))


def test_backward_accumulate_refuses_overlapping_accumulators():
    """The op itself (not only mok.moe) refuses two accumulators that share elements, naming both, before it
    adds anything: each would take the other's gradient too (on the GPU in no fixed order). Disjoint views
    of one buffer pass. (The fake kernel sees no addresses: under torch.compile the kernel refuses.)"""
    layer = make_layer("softmax_shared")
    n1, n2 = layer.w1.numel(), layer.w2.numel()

    def args(flat, w2_start):
        """backward_accumulate's arguments with d_w1 and d_w2 views of flat, d_w2 from w2_start."""
        return backward_args(layer, True, d_w1=lambda t: flat[:n1].view(t.shape),
                             d_w2=lambda t: flat[w2_start:w2_start + n2].view(t.shape))

    flat = torch.zeros(n1 + n2)
    with pytest.raises(ValueError, match="d_w2 overlaps d_w1 in memory"):
        torch.ops.mok.backward_accumulate(*args(flat, n1 - 4))  # d_w2's first 4 elements are d_w1's last 4
    assert flat.count_nonzero() == 0, "added into before the check"
    torch.ops.mok.backward_accumulate(*args(flat, n1))
    grads = layer.backward_float32(layer.forward())  # into zeros: the fp32 gradients' bits
    assert_same_bits(flat[:n1].view(layer.w1.shape), grads[4], "d_w1")
    assert_same_bits(flat[n1:].view(layer.w2.shape), grads[5], "d_w2")


def test_backward_accumulate_refuses_an_accumulator_over_what_it_reads():
    """The op refuses an accumulator sharing bytes with a tensor the backward reads (here d_w1 over saved's
    last 16 bytes, in one byte buffer), naming both, before it adds anything: on the GPU it would add into
    memory other blocks still read. Placed just past saved, it passes."""
    layer = make_layer("softmax_shared")
    saved = layer.forward()[4]
    n, w1_bytes = (saved.numel() + 3) // 4 * 4, layer.w1.numel() * 4

    def args(buffer, w1_start):
        """backward_accumulate's arguments with saved and d_w1 in buffer, d_w1 from byte w1_start."""
        return backward_args(layer, True, saved=lambda t: buffer[:t.numel()].copy_(t),
                             d_w1=lambda t: buffer[w1_start:w1_start + w1_bytes].view(torch.float32).view(t.shape))

    buffer = torch.zeros(n + w1_bytes, dtype=torch.uint8)
    with pytest.raises(ValueError, match="d_w1 overlaps saved in memory: the backward would add into memory it"):
        torch.ops.mok.backward_accumulate(*args(buffer, n - 16))
    assert torch.equal(buffer[:saved.numel()], saved) and buffer[saved.numel():].count_nonzero() == 0
    torch.ops.mok.backward_accumulate(*args(buffer, n))
    assert_same_bits(buffer[n:].view(torch.float32).view(layer.w1.shape), layer.backward_float32(layer.forward())[4],
                     "d_w1")


def test_fake_kernels_make_the_cpu_kernels_call_checks():
    """Checks of the call beside its tensors, in the fakes too: a communicator (the CPU op computes the
    whole layer), quantized weights (the CPU op quantizes its own), a routing mode out of range."""
    layer = make_layer("softmax_shared")
    assert_fake_raises_the_kernels_error(torch.ops.mok.forward, forward_args(layer, launch=pack_launch(RING_ROWS, comm=1)),
                                         "runs on the GPU only")
    assert_fake_raises_the_kernels_error(torch.ops.mok.backward, backward_args(layer, launch=pack_launch(RING_ROWS, comm=1)),
                                         "runs on the GPU only")
    assert_fake_raises_the_kernels_error(torch.ops.mok.forward, forward_args(layer, 3), "routing_mode")
    assert_fake_raises_the_kernels_error(torch.ops.mok.forward, (*forward_args(layer), torch.zeros(8, dtype=torch.uint8)),
                                         "fp8_weights is given, but the config's precision is bf16")


def test_fake_kernels_with_symbolic_sizes_check_what_they_can():
    """With symbolic sizes (torch.compile's dynamic shapes) the fakes refuse a dtype or a missing tensor
    as the kernel does, and leave a shape, which they cannot compare, to the kernel."""
    layer = make_layer("softmax_shared")
    assert_fake_raises_the_kernels_error(torch.ops.mok.forward, forward_args(layer, w1=layer.w1.float()),
                                         "w1 must be BFloat16", symbolic=True)
    assert_fake_raises_the_kernels_error(torch.ops.mok.backward, backward_args(layer, saved=lambda t: t.to(torch.int8)),
                                         "saved must be Byte", symbolic=True)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    narrow = forward_args(layer, x=layer.x[:16])
    with pytest.raises(ValueError, match=r"x must have shape \[32, 64\]"):
        torch.ops.mok.forward(*narrow)
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        torch.ops.mok.forward(*fake_args(mode, narrow, symbolic=True))


def test_fake_kernels_on_meta_make_the_checks_every_kernel_makes():
    """On meta tensors alone (no kernel of mok's runs there) the fakes still refuse a dtype or shape the
    kernels would refuse, and give the right ones their outputs' shapes."""
    layer = make_layer("softmax_shared").to("meta")
    with pytest.raises(ValueError, match="w1 must be BFloat16, got Float"):
        forward_with(layer, w1=layer.w1.float())
    with pytest.raises(ValueError, match=r"x must have shape \[32, 64\]"):
        forward_with(layer, x=layer.x[:16])
    y, idx, w, logits, saved = forward_with(layer)
    assert y.device.type == "meta" and y.shape == layer.x.shape and idx.dtype == torch.int32
    assert saved.shape == (mok._C.saved_bytes(*layer.config.pack()),)


def test_fake_kernels_of_cuda_calls_check_without_a_gpu():
    """Tracing a CUDA call needs no GPU (fake CUDA tensors): the fakes refuse what the CUDA kernel would
    (a dtype, a CPU tensor beside CUDA ones) and give the right call its outputs on CUDA."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    layer = make_layer("softmax_shared")
    right, float_w1 = forward_args(layer), forward_args(layer, w1=layer.w1.float())
    with FakeTensorMode() as mode:
        def on_cuda(args):
            return [a.to("cuda") if isinstance(a, torch.Tensor) else a for a in fake_args(mode, args)]

        with pytest.raises(ValueError, match="w1 must be BFloat16, got Float"):
            torch.ops.mok.forward(*on_cuda(float_w1))
        beside = on_cuda(right)
        beside[1] = mode.from_tensor(layer.router)
        with pytest.raises(ValueError, match="router is on cpu but x is on cuda:0"):
            torch.ops.mok.forward(*beside)
        y, idx, w, logits, saved = torch.ops.mok.forward(*on_cuda(right))
        assert y.device.type == "cuda" and y.shape == layer.x.shape
        assert saved.shape == (mok._C.saved_bytes(*layer.config.pack()),)


def test_non_contiguous_x_through_functional():
    layer = make_layer("softmax_shared")
    x = torch.zeros(64, 32, dtype=torch.bfloat16).t()
    with pytest.raises(ValueError, match="x is not contiguous"):
        mok.moe(x, layer.router, layer.w1, layer.w2, config=layer.config, shared=(layer.shared_w1, layer.shared_w2))


def test_router_logit_overflow():
    layer = make_layer("softmax_shared")
    with pytest.raises(ValueError, match="router logit of token 0 overflows"):
        forward_with(layer, router=torch.full_like(layer.router, 3e38))


def test_non_finite_input():
    layer = make_layer("softmax_shared")
    x = layer.x.clone()
    x[3, 5] = float("nan")
    with pytest.raises(ValueError, match="x .* holds NaN or Inf"):
        forward_with(layer, x=x)


@pytest.mark.parametrize("mode", (REPLAY_IDS, GIVEN), ids=("replay_ids", "given"))
def test_given_ids(mode):
    layer = make_layer("softmax_shared")
    _, idx, w, _, _ = forward_with(layer)
    bad = idx.clone()
    bad[2, 1] = 4
    topk_w = w if mode == GIVEN else None
    with pytest.raises(ValueError, match=r"topk_idx\[2, 1\] = 4 is outside \[0, 4\)"):
        forward_with(layer, mode, bad, topk_w)
    bad[2, 1] = bad[2, 0]
    with pytest.raises(ValueError, match="routed to expert .* twice"):
        forward_with(layer, mode, bad, topk_w)
    with pytest.raises(ValueError, match="topk_idx must be Int"):
        forward_with(layer, mode, idx.long(), topk_w)


def test_routing_arguments_match_the_mode():
    layer = make_layer("softmax_shared")
    _, idx, w, _, _ = forward_with(layer)
    with pytest.raises(ValueError, match="topk_idx must be None: routing mode router"):
        forward_with(layer, ROUTER, idx)
    with pytest.raises(ValueError, match="topk_w is missing: routing mode given"):
        forward_with(layer, GIVEN, idx)
    with pytest.raises(ValueError, match="topk_w must be None: routing mode replay_ids"):
        forward_with(layer, REPLAY_IDS, idx, w)
    with pytest.raises(ValueError, match="routing_mode = 3"):
        forward_with(layer, 3)
    with pytest.raises(ValueError, match='replay="full" needs topk_w'):
        mok.moe(layer.x, layer.router, layer.w1, layer.w2, config=layer.config, routing=idx, replay="full")


def test_bad_config_and_launch():
    layer = make_layer("softmax_shared")
    with pytest.raises(ValueError, match="ring_rows = 100 is not a positive multiple of 128"):
        forward_with(layer, launch=pack_launch(100))
    bad = dataclasses.replace(layer.config, hidden=96)
    with pytest.raises(ValueError, match="hidden H = 96 .need a positive multiple of 64"):
        torch.ops.mok.forward(*layer.weights(), None, None, *bad.pack(), ROUTER, pack_launch(RING_ROWS))
    ints, floats = layer.config.pack()
    with pytest.raises(ValueError, match="config_ints has 3 entries, expected 12"):
        torch.ops.mok.forward(*layer.weights(), None, None, ints[:3], floats, ROUTER, pack_launch(RING_ROWS))
    with pytest.raises(ValueError, match="score_mode must be one of"):
        mok.MoEConfig(experts=4, hidden=64, intermediate=64, top_k=2, score_mode="relu")
    with pytest.raises(ValueError, match="precision must be one of"):
        mok.MoEConfig(experts=4, hidden=128, intermediate=128, top_k=2, precision="fp4")
    fp8 = dataclasses.replace(layer.config, precision="fp8")  # H = I = 64: not whole 128-wide scale blocks
    with pytest.raises(ValueError, match="hidden H = 64 is not a multiple of 128, the fp8 mode's block size"):
        torch.ops.mok.forward(*layer.weights(), None, None, *fp8.pack(), ROUTER, pack_launch(RING_ROWS))
    with pytest.raises(ValueError, match="fp8_weight_gradients needs precision = fp8"):
        forward_with(layer, launch=pack_launch(RING_ROWS, fp8_weight_gradients=True))
    launch = pack_launch(RING_ROWS)
    launch[-1] = 2
    with pytest.raises(ValueError, match=r"fp8_weight_gradients = 2 \(need 0 or 1\)"):
        forward_with(layer, launch=launch)


def test_backward_rejects_a_foreign_saved_buffer():
    layer = make_layer("softmax_shared")
    y, idx, w, logits, saved = layer.forward()
    with pytest.raises(ValueError, match="saved holds no dispatch layout"):
        layer.backward((y, idx, w, logits, torch.full_like(saved, 0x7f)))
    with pytest.raises(ValueError, match=r"saved must have shape"):
        layer.backward((y, idx, w, logits, saved[:-1]))
    with pytest.raises(ValueError, match="logits must have shape"):
        layer.backward((y, idx, w, logits[:0], saved))


def test_backward_rejects_another_forwards_saved_buffer():
    """saved of one forward beside the routing of another: its dispatch layout is not that routing's,
    and the backward says so instead of returning gradients of neither."""
    layer = make_layer("softmax_shared")
    y, idx, w, logits, saved = layer.forward()
    other = make_layer("softmax_shared", seed=5).forward()
    first = int((other[1] != idx).any(dim=1).nonzero()[0])  # the first token the routings differ at
    with pytest.raises(ValueError, match=f"saved is not this topk_idx's: its dispatch layout routes token {first} "):
        layer.backward((y, other[1], other[2], other[3], saved))


@pytest.mark.parametrize("op", ["forward", "backward", "backward_accumulate"])
def test_a_meta_tensor_beside_cpu_ones_is_refused(op):
    """One tensor on the meta device sends the call to the fake kernel, which refuses it as the CPU
    kernel refuses a tensor on another device (it returned uninitialised tensors)."""
    layer = make_layer("softmax_shared")
    y, idx, w, logits, saved = layer.forward()
    meta_router = layer.router.to("meta")
    weights = (layer.x, meta_router, *layer.weights()[2:])
    with pytest.raises(ValueError, match="router is on meta but x is on cpu"):
        if op == "forward":
            torch.ops.mok.forward(*weights, None, None, *layer.op_args())
        elif op == "backward":
            torch.ops.mok.backward(*weights, idx, w, logits, saved, layer.dy, *layer.op_args())
        else:
            grads = [torch.zeros_like(t, dtype=torch.float32) for t in (layer.router, layer.w1, layer.w2,
                                                                        layer.shared_w1, layer.shared_w2)]
            torch.ops.mok.backward_accumulate(*weights, idx, w, logits, saved, layer.dy, *grads, *layer.op_args())
    with pytest.raises(ValueError, match="dy is on meta but x is on cpu"):
        torch.ops.mok.backward(*layer.weights(), idx, w, logits, saved, layer.dy.to("meta"), *layer.op_args())


def test_saved_bytes_checks_the_share():
    """mok._C.saved_bytes checks gpus and capacity_rows as a call's launch list does (it sized a
    fake kernel's saved from a negative capacity: 2^64 - 50 MB)."""
    ints, floats = make_layer("softmax_shared").config.pack()
    with pytest.raises(ValueError, match="capacity_rows = -100000"):
        mok._C.saved_bytes(ints, floats, False, 1, -100000)
    with pytest.raises(ValueError, match="ranks R = 1 is not a multiple of gpus G = 2"):
        mok._C.saved_bytes(ints, floats, False, 2)
    with pytest.raises(ValueError, match=r"gpus = 0 \(need 1 <= gpus < 2\^31\)"):
        mok._C.saved_bytes(ints, floats, False, 0)


def test_saved_bytes_of_a_config_past_one_pebibyte_is_refused():
    """The widest config within the int32 limits (I = Is = 2^30 - 64 on 2^31 - 1 tokens) needs 2.3e19 bytes
    of saved activations, past 64 bits: saved_bytes gave them wrapped. Configs whose tensors pass
    1 PiB are refused, as check_config (mok.MoE) and every call refuse them."""
    wide = mok.MoEConfig(experts=1, hidden=448, intermediate=2**30 - 64, top_k=1, shared_intermediate=2**30 - 64)
    ints, floats = wide.pack(tokens_per_rank=2**31 - 1)
    message = r"problem too large: its tensors need 1\.84e\+19 bytes, more than 2\^50 \(1 PiB"
    with pytest.raises(ValueError, match=message):
        mok._C.saved_bytes(ints, floats)
    with pytest.raises(ValueError, match=message):
        mok._C.check_config(ints, floats)
    ints, floats = wide.pack(tokens_per_rank=2**16)  # 5.8e14 bytes of tensors: sized exactly
    n, p, i = 2**16, 128 * (2**16 // 128 + 1), 2**30 - 64
    assert mok._C.saved_bytes(ints, floats) == 2 * 256 + 2 * n * 4 + p * (2 * 448 + 4 * i) + n * 6 * i


def test_flag_arguments_of_the_extension_take_bools_alone():
    """mok._C's flags take True or False (or a numpy.bool_), as pack_launch's do: saved_bytes(recompute=2)
    sized the saved buffer of recompute=True, and 0.5 and None passed by their truth, without a word
    (pybind11's converting bool); "yes" raised a TypeError naming no argument."""
    ints, floats = make_layer("softmax_shared").config.pack()
    for bad in (2, 1, 0, 0.5, None, "yes"):
        with pytest.raises(ValueError, match=f"^recompute must be a bool, got {re.escape(repr(bad))}$"):
            mok._C.saved_bytes(ints, floats, bad)
    with pytest.raises(ValueError, match="^recompute must be a bool, got 1$"):
        mok._C.saved_bytes(ints, floats, recompute=1, gpus=1)
    with pytest.raises(ValueError, match="^on must be a bool, got 1$"):
        mok._C._set_poison_outputs(1)
    layout = mok._C.saved_bytes(ints, floats, True)
    assert layout < mok._C.saved_bytes(ints, floats, False) == mok._C.saved_bytes(ints, floats)
    # help() shows them as the bools they are (it said "recompute: object = False", "on: object")
    assert "recompute: bool = False" in mok._C.saved_bytes.__doc__
    assert "_set_poison_outputs(on: bool)" in mok._C._set_poison_outputs.__doc__
    np = pytest.importorskip("numpy")
    assert mok._C.saved_bytes(ints, floats, np.True_) == layout


def test_size_queries_check_the_launch_list_with_or_without_gpu_ops():
    """workspace_bytes and fp8_weights_bytes name a bad launch list as a call does (its flags 0 or 1), in
    a build without the GPU ops too, which named only their absence."""
    ints, floats = make_layer("softmax_shared").config.pack()
    for field in ("recompute", "fp8_weight_gradients"):
        launch = pack_launch(RING_ROWS)
        launch[LAUNCH_FIELDS.index(field)] = 2
        for query in (mok._C.workspace_bytes, mok._C.fp8_weights_bytes):
            with pytest.raises(ValueError, match=rf"{field} = 2 \(need 0 or 1\)"):
                query(ints, floats, launch)


GPU_OPS = pytest.mark.skipif(not mok._C.HAS_CUDA, reason="mok was built without its GPU ops")


def workspace_args():
    layer = make_layer("softmax_shared")
    return layer.config, *layer.config.pack()


@pytest.mark.skipif(mok._C.HAS_CUDA, reason="mok was built with its GPU ops")
def test_workspace_bytes_without_the_gpu_ops_raise():
    _, ints, floats = workspace_args()
    with pytest.raises(ValueError, match="mok was built without its GPU ops"):
        mok._C.workspace_bytes(ints, floats, pack_launch(RING_ROWS))


@GPU_OPS
def test_workspace_bytes_need_no_gpu():
    """mok._C.workspace_bytes is the Layer's arithmetic on the host: a process that sees no GPU gets the
    sizes (it built the call's Layer on torch's current device: torch's AcceleratorError, naming no mok
    argument, where there was none), and a launch on a communicator makes no NCCL call (comm is not
    read)."""
    _, ints, floats = workspace_args()
    launch = pack_launch(RING_ROWS)
    sizes = mok._C.workspace_bytes(ints, floats, launch)
    forward, backward, consuming, accumulating = sizes
    # The forward's is a prefix of the accumulating backward's; the storing ones' scratch may lie in their d_w1,
    # and the consuming one's dh over saved's h.
    assert 0 < forward <= accumulating and consuming <= backward <= accumulating
    code = f"import mok; print(mok._C.workspace_bytes({ints!r}, {floats!r}, {launch!r}))"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == repr(sizes)


@GPU_OPS
def test_workspace_bytes_of_recompute_and_of_a_communicator():
    """Recompute moves the saved activations into the workspace (mok::gpu::LaunchConfig), the forward's only
    those its GEMMs read: xe of the P padded rows (N min(k, E) rows, each expert's last tile padded) and the
    shared expert's a of its N rows (h only the backward writes; the routed a is the forward's in either
    mode), less the (token, slot) rows, which a one-GPU recompute forward pushes over xe once GEMM1 has read
    it. A Layer on a communicator, one GPU's too, keeps the (token, slot) rows in its window, not its
    workspace. Each section takes whole 256-byte blocks."""
    c, ints, floats = workspace_args()
    forward = mok._C.workspace_bytes(ints, floats, pack_launch(RING_ROWS))[0]
    section = lambda size: (size + 255) // 256 * 256  # noqa: E731
    padded_rows = 128 * (-(-c.tokens * min(c.top_k, c.experts) // 128) + c.experts)
    recompute = mok._C.workspace_bytes(ints, floats, pack_launch(RING_ROWS, recompute=True))[0]
    slots = section(c.tokens * c.top_k * c.hidden * 2)
    operands = section(padded_rows * c.hidden * 2) + section(c.tokens * c.shared_intermediate * 2)
    assert recompute - forward == operands - slots
    on_comm = mok._C.workspace_bytes(ints, floats, pack_launch(RING_ROWS, comm=1))[0]
    assert forward - on_comm == slots


def test_python_entry_points_check_before_they_work(tmp_path):
    """MoEConfig's fields are integers where the ops take integers (4.9 was packed as 4); mok.MoE checks
    the config before it allocates parameters; mok.moe and mok.capture refuse an x they would misread
    (a 0-d x raised IndexError; capture reshaped [8, 128] into 16 tokens of hidden 64)."""
    with pytest.raises(ValueError, match="experts must be an integer, got 4.9"):
        mok.MoEConfig(experts=4.9, hidden=64, intermediate=64, top_k=2)
    with pytest.raises(ValueError, match=r"ranks = 0 \(need >= 1\)"):
        mok.MoEConfig(experts=4, hidden=64, intermediate=64, top_k=2, ranks=0)
    with pytest.raises(ValueError, match="experts E = 100000"):
        mok.MoE(mok.MoEConfig(experts=100000, hidden=64, intermediate=64, top_k=2))
    layer = make_layer("softmax_shared")
    with pytest.raises(ValueError, match="got a 0-d tensor"):
        mok.moe(layer.x[0, 0], layer.router, layer.w1, layer.w2, config=layer.config)
    # An x of more dimensions with no hidden elements raised view(-1, 0)'s RuntimeError, naming neither.
    with pytest.raises(ValueError, match=r"^x must be \[..., H\] with H = hidden = 64, got shape \[2, 3, 0\]$"):
        mok.moe(layer.x.new_zeros(2, 3, 0), layer.router, layer.w1, layer.w2, config=layer.config)
    model = mok.MoE(layer.config, generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match=r"H = hidden = 64, got shape \[16, 128\]"):
        mok.capture(str(tmp_path / "call.h5"), model, layer.x.reshape(16, 128))
    two_ranks = mok.MoE(dataclasses.replace(layer.config, ranks=2), generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="31 tokens do not split over ranks = 2"):
        mok.capture(str(tmp_path / "call.h5"), two_ranks, layer.x[:31])
    assert not (tmp_path / "call.h5").exists()


def test_fp8_weights_are_the_cuda_ops():
    """Quantized weights (mok.quantize_weights, a forward's fp8_weights) are the CUDA op's: the CPU op
    quantizes the weights in its forward and refuses them, naming why; the bf16 mode refuses them (on the
    CPU as on the GPU, the bf16 reason first)."""
    config = mok.MoEConfig(experts=4, hidden=128, intermediate=256, top_k=2, tokens_per_rank=40, precision="fp8")
    model = mok.MoE(config, generator=torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match=CPU_QUANTIZES):
        model.quantize_weights()
    x = torch.randn(40, 128, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    with pytest.raises(ValueError, match=CPU_QUANTIZES):
        model(x, fp8_weights=torch.zeros(256, dtype=torch.uint8))
    with pytest.raises(ValueError, match="fp8_weights must be a contiguous one-dimensional uint8 tensor"):
        model(x, fp8_weights=torch.zeros(256, dtype=torch.int32))
    layer = make_layer("softmax_shared")
    with pytest.raises(ValueError, match="quantize_weights: the config's precision is bf16"):
        mok.quantize_weights(layer.w1, layer.w2, config=layer.config, shared=(layer.shared_w1, layer.shared_w2))
    with pytest.raises(ValueError, match="fp8_weights is given, but the config's precision is bf16"):
        torch.ops.mok.forward(*layer.weights(), None, None, *layer.op_args(),
                              fp8_weights=torch.zeros(16, dtype=torch.uint8))


def test_cpu_backward_refuses_fp8_weights():
    """The CPU op's backward (mok::backward, mok::backward_accumulate) refuses quantized weights as its
    forward does, naming why, after the same checks of the buffer; the bf16 mode refuses them for its own
    reason first. The same calls without them run."""
    config = mok.MoEConfig(experts=4, hidden=128, intermediate=256, top_k=2, tokens_per_rank=40, precision="fp8")
    model = mok.MoE(config, generator=torch.Generator().manual_seed(3))
    x = torch.randn(40, 128, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    inputs = (x, model.router.detach(), None, model.w1.detach(), model.w2.detach(), None, None)
    op_args = (*config.pack(), ROUTER, pack_launch(RING_ROWS))
    y, idx, w, logits, saved = torch.ops.mok.forward(*inputs, None, None, *op_args)
    saved_args = (*inputs, idx, w, logits, saved, torch.ones_like(y))
    accumulators = [torch.zeros(t.shape) for t in (model.router, model.w1, model.w2)]
    calls = {
        "backward": lambda **q: torch.ops.mok.backward(*saved_args, *op_args, **q),
        "backward_accumulate": lambda **q: torch.ops.mok.backward_accumulate(*saved_args, *accumulators, None, None,
                                                                             *op_args, **q),
    }
    for call in calls.values():
        call()
        with pytest.raises(ValueError, match=CPU_QUANTIZES):
            call(fp8_weights=torch.zeros(256, dtype=torch.uint8))
        with pytest.raises(ValueError, match="fp8_weights must be a contiguous one-dimensional uint8 tensor"):
            call(fp8_weights=torch.zeros(256, dtype=torch.int32))
    layer = make_layer("softmax_shared")
    _, idx, w, logits, saved = layer.forward()
    with pytest.raises(ValueError, match="fp8_weights is given, but the config's precision is bf16"):
        torch.ops.mok.backward(*layer.weights(), idx, w, logits, saved, layer.dy, *layer.op_args(),
                               fp8_weights=torch.zeros(16, dtype=torch.uint8))


def test_quantize_weights_fake_raises_the_cpu_ops_error():
    """mok::quantize_weights' fake kernel (FakeTensorMode's, so torch.compile's) raises the CPU op's
    ValueError for CPU tensors, with its message: in the fp8 mode the CPU op's refusal, in bf16 the bf16
    reason first. Not a uint8 result that only the call refuses."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    fp8 = mok.MoEConfig(experts=4, hidden=128, intermediate=256, top_k=2, tokens_per_rank=40, precision="fp8",
                        shared_intermediate=128)
    model = mok.MoE(fp8, generator=torch.Generator().manual_seed(3))
    weights = [t.detach() for t in (model.w1, model.w2, model.shared_w1, model.shared_w2)]
    cases = {"fp8": CPU_QUANTIZES,
             "bf16": "quantize_weights: the config's precision is bf16"}
    for precision, message in cases.items():
        args = (*dataclasses.replace(fp8, precision=precision).pack(), pack_launch(RING_ROWS))
        with pytest.raises(ValueError, match=message) as real:
            torch.ops.mok.quantize_weights(*weights, *args)
        with FakeTensorMode() as mode:
            fakes = [mode.from_tensor(t) for t in weights]
            with pytest.raises(ValueError, match=message) as fake:
                torch.ops.mok.quantize_weights(*fakes, *args)
        assert str(fake.value).splitlines()[0] == str(real.value).splitlines()[0], precision


def test_x_without_tokens_is_named(tmp_path):
    """An x with no tokens is refused naming x (the op named tokens_per_rank = 0, which no caller set)."""
    layer = make_layer("softmax_shared")
    shared = (layer.shared_w1, layer.shared_w2)
    for x in (layer.x[:0], layer.x[:0].view(4, 0, 64)):
        with pytest.raises(ValueError, match="x has no tokens"):
            mok.moe(x, layer.router, layer.w1, layer.w2, config=layer.config, shared=shared)
    model = mok.MoE(dataclasses.replace(layer.config, shared_intermediate=0))
    with pytest.raises(ValueError, match="x has no tokens"):
        model(layer.x[:0])
    with pytest.raises(ValueError, match="x has no tokens"):
        mok.capture(tmp_path / "call.h5", model, layer.x[:0])


def test_routing_of_another_form_is_refused():
    """routing is topk_idx, a (topk_idx, topk_w) pair or a mok.Routing: anything else is refused naming
    routing (a 1-tuple raised IndexError, an int TypeError, and a 3-list or 3-tuple was taken for a
    Routing, its third element ignored)."""
    layer = make_layer("softmax_shared")
    _, idx, w, _, _ = layer.forward()
    for routing, got in (((idx,), "a tuple of length 1"), ((idx, w, None, None), "a tuple of length 4"),
                         ([idx, w, idx], "a list of length 3"), ((idx, w, w), "a tuple of length 3"),
                         (3, "int")):
        with pytest.raises(ValueError, match=rf"routing must be topk_idx \(a Tensor\), .* got {got}$"):
            mok.moe(layer.x, layer.router, layer.w1, layer.w2, config=layer.config,
                    shared=(layer.shared_w1, layer.shared_w2), routing=routing)


@pytest.mark.parametrize("field,value,message", [
    ("experts", "4", "experts must be an integer, got '4'"),
    ("experts", True, "experts must be an integer, got True"),
    ("ranks", None, "ranks must be an integer, got None"),
    ("renormalize", "no", "renormalize must be a bool, got 'no'"),
    ("renormalize", 1, "renormalize must be a bool, got 1"),
    ("renormalize", 0.0, "renormalize must be a bool, got 0.0"),
    ("routed_scale", "2.5", "routed_scale must be a number, got '2.5'"),
    ("routed_scale", True, "routed_scale must be a number, got True"),
    ("swiglu_limit", None, "swiglu_limit must be a number, got None"),
])
def test_config_fields_of_another_type_are_refused(field, value, message):
    """MoEConfig refuses a field pack() would misread (experts="4" passed to int(), routed_scale="2.5" to
    float(), renormalize=1 and 0.0 taken as flags, routed_scale=True as 1.0) or fail on naming no field
    (renormalize="no", ranks=None: TypeError)."""
    fields = dict(experts=4, hidden=64, intermediate=64, top_k=2)
    fields[field] = value
    with pytest.raises(ValueError, match=message):
        mok.MoEConfig(**fields)


def test_launch_arguments_of_another_type_are_refused():
    """The launch arguments are integers and flags: ring_rows = 128.5 was truncated to 128 without a word,
    recompute = "yes" raised int()'s ValueError naming no argument, blocks = True was taken as 1 (MoEConfig
    refuses a bool for an integer), recompute = 1 and 1.0 as True (a flag is a bool, not what equals one)."""
    layer = make_layer("softmax_shared")
    shared = (layer.shared_w1, layer.shared_w2)
    for kwargs, message in ((dict(ring_rows=128.5), "ring_rows must be an integer, got 128.5"),
                            (dict(ring_rows=True), "ring_rows must be an integer, got True"),
                            (dict(blocks=1.5), "blocks must be an integer, got 1.5"),
                            (dict(blocks=True), "blocks must be an integer, got True"),
                            (dict(recompute="yes"), "recompute must be a bool, got 'yes'"),
                            (dict(recompute=1), "recompute must be a bool, got 1"),
                            (dict(recompute=1.0), "recompute must be a bool, got 1.0"),
                            (dict(fp8_weight_gradients=0), "fp8_weight_gradients must be a bool, got 0"),
                            (dict(fp8_weight_gradients=2), "fp8_weight_gradients must be a bool, got 2")):
        with pytest.raises(ValueError, match=message):
            mok.moe(layer.x, layer.router, layer.w1, layer.w2, config=layer.config, shared=shared, **kwargs)
    with pytest.raises(ValueError, match="capacity_rows must be an integer"):
        pack_launch(RING_ROWS, capacity_rows=0.5)


def test_flags_take_numpy_bools():
    """A flag read from an array or an HDF5 attribute is a numpy.bool_: taken as the bool it holds, by
    MoEConfig, pack_launch and mok.MoE (the checks look numpy up only where it is imported)."""
    np = pytest.importorskip("numpy")
    config = mok.MoEConfig(experts=4, hidden=64, intermediate=64, top_k=2, renormalize=np.False_)
    assert config.pack() == dataclasses.replace(config, renormalize=False).pack()
    assert pack_launch(RING_ROWS, recompute=np.True_, fp8_weight_gradients=np.False_) == \
        pack_launch(RING_ROWS, recompute=True)
    assert mok.MoE(config, recompute=np.True_).recompute


def test_a_cached_launch_lets_no_bool_past_its_checks():
    """The packed lists are cached per argument: False equals the default 0 and hashes as it, so after one
    call with blocks=0 a call with blocks=False found the cached list and skipped pack_launch's checks."""
    layer = make_layer("softmax_shared")
    shared = (layer.shared_w1, layer.shared_w2)
    mok.moe(layer.x, layer.router, layer.w1, layer.w2, config=layer.config, shared=shared, blocks=0)
    with pytest.raises(ValueError, match="blocks must be an integer, got False"):
        mok.moe(layer.x, layer.router, layer.w1, layer.w2, config=layer.config, shared=shared, blocks=False)


def test_quantize_weights_refuses_tokens_per_rank_zero():
    """quantize_weights(tokens_per_rank=0) is refused as the op refuses it, not replaced by the config's
    tokens_per_rank (which picked another cached layer than the caller named)."""
    config = mok.MoEConfig(experts=4, hidden=128, intermediate=256, top_k=2, tokens_per_rank=40, precision="fp8")
    model = mok.MoE(config, generator=torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match=r"tokens_per_rank = 0 \(need 1"):
        model.quantize_weights(tokens_per_rank=0)
    with pytest.raises(ValueError, match=CPU_QUANTIZES):  # None: the config's, which the CPU op refuses to quantize
        model.quantize_weights()


def test_capture_names_a_bad_dy_or_a_layer_dict_without_its_weights(tmp_path):
    """capture refuses a dy that is not x's shape naming dy (reshape raised a RuntimeError naming neither,
    or silently reread [64, 32] as [32, 64]) and a layer dict lacking a required argument (KeyError)."""
    layer = make_layer("softmax_shared")
    args = dict(router=layer.router, w1=layer.w1, w2=layer.w2, config=layer.config,
                shared=(layer.shared_w1, layer.shared_w2))
    path = tmp_path / "call.h5"
    for dy in (layer.dy[:3], layer.dy.reshape(64, 32), layer.dy[0, 0]):
        with pytest.raises(ValueError, match=r"dy must have x's shape \(N = 32 tokens by H = 64\)"):
            mok.capture(path, args, layer.x, dy)
    with pytest.raises(ValueError, match="capture: the layer dict lacks w2, config"):
        mok.capture(path, dict(router=layer.router, w1=layer.w1), layer.x)
    assert not path.exists()


def test_a_path_that_is_empty_or_no_path_is_refused_naming_path(tmp_path, monkeypatch):
    """capture("") ran the call and only then failed, naming no argument ("cannot rename ./..tmp.N.0 to
    ''"), and capture(None) failed at os.fspath; read_golden(None) raised pybind11's TypeError quoting
    its signature. Each is a ValueError naming path, before any work."""
    layer = make_layer("softmax_shared")
    args = dict(router=layer.router, w1=layer.w1, w2=layer.w2, config=layer.config,
                shared=(layer.shared_w1, layer.shared_w2))
    monkeypatch.chdir(tmp_path)  # where "" would put its temporary
    for path, message in (("", "^path must name a file, got an empty path$"),
                          (None, "^path must be a str or os.PathLike, got NoneType$")):
        with pytest.raises(ValueError, match=message):
            mok.capture(path, args, layer.x)
    assert not os.listdir(tmp_path)
    for path, got in ((None, "NoneType"), (3, "int"), ([str(tmp_path)], "list")):
        with pytest.raises(ValueError, match=f"^path must be a str or os.PathLike, got {got}$"):
            mok._C.read_golden(path)
    with pytest.raises(ValueError, match="no such file"):  # a str, bytes and a PathLike still reach the reader
        mok._C.read_golden(tmp_path / "absent.h5")
    with pytest.raises(ValueError, match="no such file"):
        mok._C.read_golden(os.fsencode(tmp_path / "absent.h5"))


def capture_that_must_not_run(monkeypatch):
    """A layer and capture's layer dict for it, with capture's call replaced by one that fails the test: for
    the checks that must refuse an argument before the call runs."""
    layer = make_layer("softmax_shared")
    args = dict(router=layer.router, w1=layer.w1, w2=layer.w2, config=layer.config,
                shared=(layer.shared_w1, layer.shared_w2))

    def no_call(*_args, **_kwargs):
        raise AssertionError("capture ran the call")

    monkeypatch.setattr(sys.modules["mok.capture"], "backward_float32", no_call)
    return layer, args


def test_capture_refuses_a_path_it_cannot_write_before_the_call(tmp_path, monkeypatch):
    """A path the writer cannot write (a missing directory, a directory, a FIFO) was found only when
    writing, after the whole forward and backward had run: it is refused first, in the writer's words."""
    layer, args = capture_that_must_not_run(monkeypatch)
    (tmp_path / "a_dir").mkdir()
    os.mkfifo(tmp_path / "a_fifo")
    for path, why in ((tmp_path / "absent" / "call.h5", f"{tmp_path / 'absent'} does not exist"),
                      (tmp_path / "a_dir", "it is a directory, not a regular file"),
                      (tmp_path / "a_fifo", "it is a FIFO, not a regular file")):
        with pytest.raises(ValueError, match=f"^mok: cannot write {re.escape(str(path))}: {re.escape(why)}$"):
            mok.capture(path, args, layer.x)


def test_capture_refuses_a_name_no_golden_takes_before_the_call(tmp_path, monkeypatch):
    """A name the writer refuses (one that names another file, a space, over 128 bytes) was found only when
    writing, after the whole forward and backward had run: it is refused first, in the writer's words."""
    layer, args = capture_that_must_not_run(monkeypatch)
    for name, why in (("../x", "it names a file, so no '/'"), ("a b", "printable ASCII without spaces"),
                      ("n" * 129, "of 129 bytes is no case name: at most 128 bytes")):
        with pytest.raises(ValueError, match=f"^name '.*{re.escape(why)}"):
            mok.capture(tmp_path / "call.h5", args, layer.x, name=name)
    assert not os.listdir(tmp_path)


def test_integers_past_int64_are_refused_naming_the_argument():
    """The ops take int64 lists: ring_rows = 2**63 (or a config field past it) reached torch, whose error
    named neither the argument nor the problem ("Expected a value of type 'List[int]' for argument
    'launch' but instead found type 'list'"); quantize_weights' tokens_per_rank = 2.5 was truncated to 2."""
    layer = make_layer("softmax_shared")
    shared = (layer.shared_w1, layer.shared_w2)
    for kwargs, message in ((dict(ring_rows=2**63), "ring_rows = 9223372036854775808 is outside the 64-bit"),
                            (dict(blocks=-(2**63) - 1), "blocks = -9223372036854775809 is outside the 64-bit"),
                            (dict(capacity_rows=2**70), "capacity_rows = 1180591620717411303424 is outside")):
        with pytest.raises(ValueError, match=message):
            mok.moe(layer.x, layer.router, layer.w1, layer.w2, config=layer.config, shared=shared, **kwargs)
    with pytest.raises(ValueError, match="experts = 18446744073709551616 is outside the 64-bit integer range"):
        mok.MoEConfig(experts=2**64, hidden=64, intermediate=64, top_k=2)
    with pytest.raises(ValueError, match="routed_scale must be a finite number, got an integer too large"):
        mok.MoEConfig(experts=4, hidden=64, intermediate=64, top_k=2, routed_scale=10**400)
    config = mok.MoEConfig(experts=4, hidden=128, intermediate=256, top_k=2, precision="fp8")
    model = mok.MoE(config, generator=torch.Generator().manual_seed(3))
    for tokens_per_rank, message in ((2.5, "tokens_per_rank must be an integer, got 2.5"),
                                     (2**64, "tokens_per_rank = 18446744073709551616 is outside")):
        with pytest.raises(ValueError, match=message):
            model.quantize_weights(tokens_per_rank=tokens_per_rank)


def test_arguments_that_are_no_tensors_or_config_are_named():
    """A weight that is None or a list, or a config that is a dict, failed inside: torch's "tensor does not
    have a device" naming no argument, or an AttributeError ('dict' object has no attribute ...); a routing
    pair of other things reached the op's argument parser. mok.MoE checks its launch arguments' types at
    construction (ring_rows="128" was refused only at the first forward)."""
    layer = make_layer("softmax_shared")
    args = dict(x=layer.x, router=layer.router, w1=layer.w1, w2=layer.w2)
    shared = (layer.shared_w1, layer.shared_w2)
    for name, bad in (("x", layer.x.tolist()), ("router", None), ("w1", None), ("w2", layer.w2.float().numpy())):
        with pytest.raises(ValueError, match=f"^{name} must be a Tensor, got {type(bad).__name__}$"):
            mok.moe(*{**args, name: bad}.values(), config=layer.config, shared=shared)
    with pytest.raises(ValueError, match="^config must be a mok.MoEConfig, got dict$"):
        mok.moe(*args.values(), config=dataclasses.asdict(layer.config), shared=shared)
    with pytest.raises(ValueError, match="^config must be a mok.MoEConfig, got dict$"):
        mok.MoE(dataclasses.asdict(layer.config))
    with pytest.raises(ValueError, match="^w1 must be a Tensor, got NoneType$"):
        mok.quantize_weights(None, layer.w2, config=layer.config)
    with pytest.raises(ValueError, match="routing's topk_idx must be a Tensor and its topk_w a Tensor or None, "
                                         "got int and int"):
        mok.moe(*args.values(), config=layer.config, shared=shared, routing=(1, 2))
    with pytest.raises(ValueError, match="ring_rows must be an integer, got '128'"):
        mok.MoE(layer.config, ring_rows="128")


def test_a_module_on_meta_draws_no_values():
    """On the meta device there are no values to initialise: the draws (on the CPU, every expert's) only
    took time, minutes for a large layer (E = 512, H = I = 2^15 ran past 5 minutes). The generator is left
    as it was, for the reset_parameters after to_empty."""
    g = torch.Generator().manual_seed(5)
    state = g.get_state()
    config = mok.MoEConfig(experts=8, hidden=128, intermediate=64, top_k=2, shared_intermediate=64)
    model = mok.MoE(config, device="meta", generator=g)
    assert model.w1.is_meta and model.w1.shape == (8, 128, 128)
    assert torch.equal(g.get_state(), state)
    model.to_empty(device="cpu")
    model.reset_parameters(torch.Generator().manual_seed(5))
    assert torch.equal(model.w1, mok.MoE(config, generator=torch.Generator().manual_seed(5)).w1)


def test_config_floats_are_refused_where_float32_loses_them():
    """The ops store routed_scale and swiglu_limit as float32: swiglu_limit = 1e-50 rounded to 0 and switched
    the clamp off without a word (mok-golden's case files refused it), and the value was printed by
    std::to_string (0.000000 for 1e-50, 300 digits for 1e300)."""
    layer = make_layer("softmax_shared")
    shared = (layer.shared_w1, layer.shared_w2)
    to_zero = "rounds to 0 or to a subnormal in float32"
    for field, value, message in (("swiglu_limit", 1e-50, f"swiglu_limit = 1e-50 {to_zero}"),
                                  ("routed_scale", 1e-40, f"routed_scale = 1e-40 {to_zero}"),
                                  ("routed_scale", 1e300, r"routed_scale = 1e\+300 is out of the float32 range"),
                                  ("swiglu_limit", float("nan"), "swiglu_limit = nan is not a finite float32")):
        config = dataclasses.replace(layer.config, **{field: value})
        with pytest.raises(ValueError, match=f"^mok: invalid input: {message}$"):
            mok.moe(layer.x, layer.router, layer.w1, layer.w2, config=config, shared=shared)
        with pytest.raises(ValueError, match=message):
            mok.MoE(config)


def test_flags_of_moe_and_the_module_take_bools_alone():
    """return_routing, main_grad and accumulate_grad are flags as recompute is: by their truth,
    return_routing="no" returned the routing and main_grad="no" turned main_grad on."""
    layer = make_layer("softmax_shared")
    shared = (layer.shared_w1, layer.shared_w2)
    for bad in ("no", 1, None):
        with pytest.raises(ValueError, match=f"^return_routing must be a bool, got {re.escape(repr(bad))}$"):
            mok.moe(layer.x, layer.router, layer.w1, layer.w2, config=layer.config, shared=shared,
                    return_routing=bad)
    model = mok.MoE(layer.config)
    with pytest.raises(ValueError, match="^return_routing must be a bool, got 'no'$"):
        model(layer.x, return_routing="no")
    for name in ("main_grad", "accumulate_grad"):
        with pytest.raises(ValueError, match=f"^{name} must be a bool, got 'no'$"):
            mok.MoE(layer.config, **{name: "no"})
        with pytest.raises(ValueError, match=f"^{name} must be a bool, got 1$"):
            mok.MoE(layer.config, **{name: 1})


def test_shared_and_optional_tensors_of_another_form_are_named():
    """shared is a (shared_w1, shared_w2) pair: a tensor or a 1-tuple was unpacked ("too many values to
    unpack", naming no argument). expert_bias and fp8_weights that are neither a Tensor nor None reached the
    op's argument parser (a RuntimeError quoting the op's schema)."""
    layer = make_layer("softmax_shared")
    args = (layer.x, layer.router, layer.w1, layer.w2)
    for shared, got in ((layer.shared_w1, "Tensor"), ((layer.shared_w1,), "a tuple of length 1"),
                        ([layer.shared_w1] * 3, "a list of length 3")):
        with pytest.raises(ValueError, match=rf"^shared must be a \(shared_w1, shared_w2\) pair or None, got {got}$"):
            mok.moe(*args, config=layer.config, shared=shared)
    with pytest.raises(ValueError, match="^shared must be a .* pair or None, got Tensor$"):
        mok.quantize_weights(layer.w1, layer.w2, config=layer.config, shared=layer.shared_w1)
    shared = (layer.shared_w1, layer.shared_w2)
    for name in ("expert_bias", "fp8_weights"):
        with pytest.raises(ValueError, match=f"^{name} must be a Tensor or None, got int$"):
            mok.moe(*args, config=layer.config, shared=shared, **{name: 3})
    with pytest.raises(ValueError, match="^shared_w2 must be a Tensor or None, got list$"):
        mok.moe(*args, config=layer.config, shared=(layer.shared_w1, [1.0]))


def test_capture_names_arguments_of_another_form(tmp_path):
    """capture refuses, naming the argument and writing nothing: a layer that is neither an MoE nor a dict
    (TypeError "'int' object is not iterable"), a dict key capture does not take (recompute misspelt was
    ignored), a dict's config, router or shared of another form (AttributeError, "tensor does not have a
    device", "Boolean value of Tensor ... is ambiguous"), an x or dy that is no tensor (AttributeError), a
    name or description that is no str (write_golden's TypeError), and a layer on the meta device
    (NotImplementedError "Cannot copy out of meta tensor")."""
    layer = make_layer("softmax_shared")
    args = dict(router=layer.router, w1=layer.w1, w2=layer.w2, config=layer.config,
                shared=(layer.shared_w1, layer.shared_w2))
    path = tmp_path / "call.h5"
    cases = [
        (dict(layer=3), "^layer must be a mok.MoE or a dict of mok.moe's arguments, got int$"),
        (dict(layer={**args, "recomput": True}), "^capture: the layer dict has recomput, which capture does not take"),
        (dict(layer={**args, "capacity_rows": 64}), "^capture: the layer dict has capacity_rows, which"),
        (dict(layer={**args, "config": {}}), "^config must be a mok.MoEConfig, got dict$"),
        (dict(layer={**args, "router": None}), "^router must be a Tensor, got NoneType$"),
        (dict(layer={**args, "shared": layer.shared_w1}), "^shared must be a .* pair or None, got Tensor$"),
        (dict(x=None), "^x must be a Tensor, got NoneType$"),
        (dict(dy=[1.0]), "^dy must be a Tensor or None, got list$"),
        (dict(name=3), "^name must be a str, got int$"),
        (dict(description=None), "^description must be a str, got NoneType$"),
        (dict(layer=mok.MoE(layer.config, device="meta"), x=layer.x.to("meta")), "x is on the meta device"),
    ]
    for kwargs, message in cases:
        call = dict(layer=args, x=layer.x, dy=None, name="capture", description="") | kwargs
        with pytest.raises(ValueError, match=message):
            mok.capture(path, call.pop("layer"), call.pop("x"), call.pop("dy"), **call)
        assert not path.exists(), kwargs
    mok.capture(path, {**args, "recompute": True}, layer.x)  # the keys it takes


def test_replay_that_is_no_mode_name_is_refused():
    """replay is "ids", "full" or None: "", False and 0 were taken for the default by their falsiness (replay or
    ...), without a word."""
    layer = make_layer("softmax_shared")
    _, idx, w, _, _ = layer.forward()
    for replay in ("", False, 0):
        for routing in (idx, (idx, w)):
            with pytest.raises(ValueError, match=rf'^replay must be "ids", "full" or None, got {replay!r}$'):
                mok.moe(layer.x, layer.router, layer.w1, layer.w2, config=layer.config,
                        shared=(layer.shared_w1, layer.shared_w2), routing=routing, replay=replay)


def test_sparse_and_nested_tensors_are_named():
    """The ops take dense tensors: a sparse x or router raised the dispatcher's NotImplementedError ("Could not
    run 'mok::forward' with arguments from the 'SparseCPU' backend"), a nested x a RuntimeError ("Internal
    error: NestedTensorImpl doesn't support sizes"), a sparse topk_idx the dispatcher's error too."""
    layer = make_layer("softmax_shared")
    shared = (layer.shared_w1, layer.shared_w2)
    args = dict(x=layer.x, router=layer.router, w1=layer.w1, w2=layer.w2)
    cases = [("x", layer.x.float().to_sparse().to(torch.bfloat16), "x must be a dense .* got layout torch.sparse_coo"),
             ("x", torch.nested.nested_tensor([layer.x[:16], layer.x[16:]], layout=torch.jagged),
              "x must be a dense .* got a nested tensor"),
             ("router", layer.router.to_sparse(), "router must be a dense"),
             ("w1", layer.w1.to_sparse(), "w1 must be a dense")]
    for name, bad, message in cases:
        with pytest.raises(ValueError, match=f"^{message}"):
            mok.moe(*{**args, name: bad}.values(), config=layer.config, shared=shared)
    _, idx, _, _, _ = layer.forward()
    with pytest.raises(ValueError, match="^routing's topk_idx must be a dense"):
        mok.moe(*args.values(), config=layer.config, shared=shared, routing=idx.to_sparse())
    with pytest.raises(ValueError, match="^shared_w2 must be a dense"):
        mok.moe(*args.values(), config=layer.config, shared=(layer.shared_w1, layer.shared_w2.to_sparse()))


@pytest.mark.parametrize("grads", ["main_grad", "accumulate_grad", "accumulate_into"])
def test_accumulators_on_meta_run_the_fake_kernels(grads):
    """A meta call runs the fake kernels, with accumulators too: every meta tensor's storage address is 0, so
    the accumulators were refused as sharing their memory with the weights (a model built on meta with
    main_grad or accumulate_grad could not run a step)."""
    layer = make_layer("softmax_shared")
    x = layer.x.to("meta")
    if grads == "accumulate_into":
        meta = [t.to("meta").requires_grad_() for t in (layer.router, layer.w1, layer.w2, layer.shared_w1,
                                                           layer.shared_w2)]
        acc = mok.GradAccumulators(*(torch.zeros_like(t, dtype=torch.float32) for t in meta[:3]),
                                   shared=tuple(torch.zeros_like(t, dtype=torch.float32) for t in meta[3:]))
        y = mok.moe(x, *meta[:3], config=layer.config, shared=tuple(meta[3:]), accumulate_into=acc)
    else:
        model = mok.MoE(layer.config, device="meta", **{grads: True})
        y = model(x)
    assert y.is_meta and y.shape == layer.x.shape
    y.float().square().mean().backward()
    if grads == "accumulate_grad":
        assert model.w1.grad.is_meta and model.w1.grad.shape == model.w1.shape


def test_accumulators_shared_of_another_form_is_named():
    """accumulate_into.shared is a pair: an int raised len()'s TypeError ("object of type 'int' has no len()")."""
    layer = make_layer("softmax_shared")
    acc = mok.GradAccumulators(*(torch.zeros(t.shape) for t in (layer.router, layer.w1, layer.w2)), shared=5)
    with pytest.raises(ValueError, match="^accumulate_into.shared must be a pair"):
        mok.moe(layer.x, layer.router, layer.w1, layer.w2, config=layer.config,
                shared=(layer.shared_w1, layer.shared_w2), accumulate_into=acc)


def test_module_checks_its_launch_values_before_it_allocates():
    """mok.MoE checked its launch arguments' types but not their values: ring_rows = 100, blocks = -1, a
    capacity without a group and fp8_weight_gradients in the bf16 mode made a module whose every forward
    raised. Refused at construction now, with the forward's message; the values a forward takes still pass."""
    layer = make_layer("softmax_shared")
    cases = [(dict(ring_rows=100), "ring_rows = 100 is not a positive multiple of 128"),
             (dict(ring_rows=-128), r"ring_rows = -128 \(need 0 <= ring_rows"),
             (dict(blocks=-1), r"blocks = -1 \(need 0 <= blocks"),
             (dict(capacity_rows=5), r"capacity_rows = 5 \(need 0 without a group"),
             (dict(fp8_weight_gradients=True), "fp8_weight_gradients needs precision = fp8")]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            mok.moe(layer.x, layer.router, layer.w1, layer.w2, config=layer.config,
                    shared=(layer.shared_w1, layer.shared_w2), **kwargs)
        with pytest.raises(ValueError, match=message):
            mok.MoE(layer.config, **kwargs)
    mok.MoE(layer.config, ring_rows=256, blocks=3, recompute=True)
    fp8 = mok.MoEConfig(experts=4, hidden=128, intermediate=128, top_k=2, precision="fp8", shared_intermediate=128)
    assert mok.MoE(fp8, fp8_weight_gradients=True).fp8_weight_gradients


def test_softmax_mode_refuses_sigmoid_modes_groups_and_scale():
    """A DeepSeek-V2-like config (softmax scores, groups, routed_scale 16) ran as plain softmax top-k with the
    same bits as the default config's, without a word: n_group, topk_group and routed_scale are sigmoid mode's."""
    layer = make_layer("softmax_shared")
    for field, value, message in (("n_group", 2, r"n_group = 2 is sigmoid mode's \(softmax mode takes 1\)"),
                                  ("topk_group", 2, r"topk_group = 2 is sigmoid mode's \(softmax mode takes 1\)"),
                                  ("routed_scale", 16.0, r"routed_scale is sigmoid mode's \(softmax mode takes 1\)")):
        config = dataclasses.replace(layer.config, **{field: value})
        with pytest.raises(ValueError, match=f"^mok: invalid input: {message}$"):
            mok.moe(layer.x, layer.router, layer.w1, layer.w2, config=config, shared=(layer.shared_w1, layer.shared_w2))
        with pytest.raises(ValueError, match=message):
            mok.MoE(config)


def test_weights_drawn_in_fp32_on_the_cpu_whatever_torchs_defaults():
    """The draws named no dtype or device: under set_default_dtype(float64) a seed gave other weights, and
    under a meta default device MoE(device="cpu") raised "Cannot copy out of meta tensor"."""
    config = make_layer("softmax_shared").config
    want = mok.MoE(config, generator=torch.Generator().manual_seed(3)).state_dict()
    for dtype, device in ((torch.float64, None), (None, "meta")):
        before = torch.get_default_dtype()
        try:
            if dtype is not None:
                torch.set_default_dtype(dtype)
            if device is not None:
                torch.set_default_device(device)
            got = mok.MoE(config, device="cpu", generator=torch.Generator().manual_seed(3)).state_dict()
        finally:
            torch.set_default_dtype(before)
            torch.set_default_device(None)
        for name, t in want.items():
            assert_same_bits(got[name], t, name)


def test_generator_that_is_no_cpu_generator_is_named():
    """The weights are drawn on the CPU from a torch.Generator: another object raised randn's TypeError quoting
    its signatures (in the constructor after the parameters were allocated)."""
    config = make_layer("softmax_shared").config
    with pytest.raises(ValueError, match="^generator must be a CPU torch.Generator or None .*, got int$"):
        mok.MoE(config, generator=5)
    model = mok.MoE(config)
    with pytest.raises(ValueError, match="^generator must be a CPU torch.Generator or None .*, got Tensor$"):
        model.reset_parameters(torch.tensor(5))


def test_capture_paths_with_nul_or_surrogates_and_a_meta_dy(tmp_path):
    """capture("dir/a\\0b.h5") wrote dir/a (the writer's C string ended at the NUL); a path with surrogate
    escapes (os.fsdecode's of a non-UTF-8 name) and a name or description with a lone surrogate failed with
    write_golden's TypeError after the call had run; a dy on the meta device raised NotImplementedError
    ("Cannot copy out of meta tensor"). The surrogate path names the file of those bytes."""
    layer = make_layer("softmax_shared")
    args = dict(router=layer.router, w1=layer.w1, w2=layer.w2, config=layer.config,
                shared=(layer.shared_w1, layer.shared_w2))
    with pytest.raises(ValueError, match="^path must not contain a NUL byte"):
        mok.capture(str(tmp_path / "a\0b.h5"), args, layer.x)
    for kwargs, message in ((dict(name="c\udcff"), "^name must be text that UTF-8 can encode"),
                            (dict(description="\udcff"), "^description must be text that UTF-8 can encode"),
                            (dict(dy=layer.dy.to("meta")), "dy is on the meta device")):
        with pytest.raises(ValueError, match=message):
            mok.capture(tmp_path / "call.h5", args, layer.x, **kwargs)
    assert not os.listdir(tmp_path)
    path = os.fsdecode(os.fsencode(str(tmp_path)) + b"/\xfe.h5")
    mok.capture(path, args, layer.x)
    assert os.listdir(os.fsencode(str(tmp_path))) == [b"\xfe.h5"]
    assert mok._C.read_golden(path)["name"] == "capture"


def test_capture_refuses_a_nul_in_the_description(tmp_path, monkeypatch):
    """An HDF5 string ends at its first NUL: capture(..., description="a\\0b") wrote a file whose description
    was cut there, and which its own reader then refused as edited (content_sha256 hashes the whole string).
    capture refuses it before the call; the writer, for any caller, before any file is made."""
    layer, args = capture_that_must_not_run(monkeypatch)
    with pytest.raises(ValueError, match="^description must not contain a NUL character"):
        mok.capture(tmp_path / "call.h5", args, layer.x, description="a\0b")
    monkeypatch.undo()
    mok.capture(tmp_path / "call.h5", args, layer.x, layer.dy)
    g = mok._C.read_golden(tmp_path / "call.h5")
    tensors = dict(g["tensors"], saved=layer.forward()[4])
    lists = (g["config_ints"], g["config_floats"], g["routing_mode"], pack_launch(g["ring_rows"], 0, g["recompute"]))
    with pytest.raises(ValueError, match="attribute /@description holds a NUL byte"):
        mok._C.write_golden(str(tmp_path / "nul.h5"), "nul", "a\0b", *lists, tensors)
    mok._C.write_golden(str(tmp_path / "plain.h5"), "plain", "a b", *lists, tensors)
    assert sorted(os.listdir(tmp_path)) == ["call.h5", "plain.h5"]
    assert mok._C.read_golden(tmp_path / "plain.h5")["description"] == "a b"


def test_read_golden_names_a_path_with_a_nul():
    """A NUL in read_golden's path raised pybind11's RuntimeError ("Unable to cast Python instance of type
    <class 'str'> to C++ type '?'"), naming no argument."""
    for path in ("/tmp/a\0b.h5", b"/tmp/a\0b.h5"):
        with pytest.raises(ValueError, match="^path must not contain a NUL byte"):
            mok._C.read_golden(path)


def test_config_unpack_refuses_lists_no_call_takes():
    """MoEConfig.unpack of a short list raised KeyError ('score_mode'), of a score_mode out of range
    IndexError; now the ValueError a call gives."""
    ints, floats = make_layer("softmax_shared").config.pack()
    with pytest.raises(ValueError, match="config_ints has 3 entries, expected 12"):
        mok.MoEConfig.unpack(ints[:3], floats)
    bad = list(ints)
    bad[mok.config.INT_FIELDS.index("score_mode")] = 5
    with pytest.raises(ValueError, match=r"score_mode = 5 \(need 0 .. 1\)"):
        mok.MoEConfig.unpack(bad, floats)


def test_config_unpack_names_a_list_of_the_wrong_type():
    """MoEConfig.unpack handed its lists to mok._C.check_config as they came: a list of another type, or an
    element mok._C cannot convert, raised pybind11's TypeError ("check_config(): incompatible function
    arguments"), naming no argument."""
    config = make_layer("softmax_shared").config
    ints, floats = config.pack()
    for args, message in (
            (("4", floats), "config_ints must be a list or tuple, got str"),
            ((ints, None), "config_floats must be a list or tuple, got NoneType"),
            ((dict(enumerate(ints)), floats), "config_ints must be a list or tuple, got dict"),
            (([ints[0] + 0.5] + ints[1:], floats), r"config_ints\[0\] \(ranks\) must be an integer, got 1.5"),
            ((ints + [None], floats), rf"config_ints\[{len(ints)}\] must be an integer, got None"),
            ((ints, [floats[0], "0.5"]), r"config_floats\[1\] \(swiglu_limit\) must be a number, got '0.5'")):
        with pytest.raises(ValueError, match=f"^{message}$"):
            mok.MoEConfig.unpack(*args)
    assert mok.MoEConfig.unpack(tuple(ints), tuple(floats)) == config  # what mok._C takes still passes


def test_unhashable_launch_arguments_are_named():
    """The packed lists are cached per argument: ring_rows=[128] raised the cache's TypeError ("unhashable type:
    'list'"), naming no argument, before pack_launch's checks."""
    layer = make_layer("softmax_shared")
    shared = (layer.shared_w1, layer.shared_w2)
    for kwargs, message in ((dict(ring_rows=[128]), r"ring_rows must be an integer, got \[128\]"),
                            (dict(blocks={}), r"blocks must be an integer, got \{\}"),
                            (dict(recompute=[True]), r"recompute must be a bool, got \[True\]")):
        with pytest.raises(ValueError, match=f"^{message}$"):
            mok.moe(layer.x, layer.router, layer.w1, layer.w2, config=layer.config, shared=shared, **kwargs)
    with pytest.raises(ValueError, match=r"^tokens_per_rank must be an integer, got \[1\]$"):
        mok.quantize_weights(layer.w1, layer.w2, config=layer.config, shared=shared, tokens_per_rank=[1])


def _grad_of_another_dtype(p, dtype):
    """p.grad of dtype, which torch's own assignment refuses (grad_dtype, torch >= 2.10; "assigned grad has data
    of a different type" before): through .data."""
    p.grad = torch.zeros_like(p)
    p.grad.data = torch.zeros(p.shape, dtype=dtype)


def test_module_accumulate_grad_names_the_parameter_whose_grad_is_wrong():
    """mok.MoE(accumulate_grad=True) named a bad .grad as accumulate_into.w1 (an argument its caller never
    passed), blamed a float32 w1.grad on w2 ("accumulate_into.w2 must be a contiguous float32 tensor": w1's
    dtype decided), and with torch's grad_dtype float32 on a weight whose .grad was None made a bf16 .grad,
    which torch refused with its RuntimeError naming no parameter. Now the message names the parameter's .grad
    and the dtype it needs; zeros are made in the grad_dtype, so float32 on every weight accumulates in fp32."""
    layer = make_layer("softmax_shared")

    def refused(set_up, message):
        model = mok.MoE(layer.config, accumulate_grad=True, generator=torch.Generator().manual_seed(0))
        set_up(model)
        with pytest.raises(ValueError, match=message):
            model(layer.x)

    bf16 = r"must be a contiguous bfloat16 tensor of shape \({}\) on cpu \(accumulate_grad: .*\); got "

    def transposed(p):
        p.grad = torch.zeros_like(p).transpose(-1, -2).contiguous().transpose(-1, -2)

    refused(lambda m: transposed(m.w1), "^w1.grad " + bf16.format("4, 128, 64") + r"torch.bfloat16 .*, not contiguous$")
    refused(lambda m: transposed(m.shared_w1), "^shared_w1.grad " + bf16.format("128, 64") + ".*not contiguous$")
    refused(lambda m: _grad_of_another_dtype(m.w1, torch.float32),
            "^w1.grad " + bf16.format("4, 128, 64") + r"torch.float32 \(4, 128, 64\) on cpu$")
    refused(lambda m: _grad_of_another_dtype(m.router, torch.bfloat16),
            r"^router.grad must be a contiguous float32 .*\(the router's is float32\); got torch.bfloat16")
    if hasattr(torch.Tensor, "grad_dtype"):
        refused(lambda m: setattr(m.w2, "grad_dtype", torch.float32), "^w2.grad " + bf16.format("4, 64, 64"))
        model = mok.MoE(layer.config, accumulate_grad=True)
        for p in (model.w1, model.w2, model.shared_w1, model.shared_w2):
            p.grad_dtype = torch.float32
        model(layer.x).float().square().mean().backward()
        assert all(p.grad.dtype == torch.float32 and p.grad.abs().sum() > 0 for p in model.parameters())


def test_module_main_grad_names_the_parameter_whose_main_grad_is_wrong():
    """mok.MoE(main_grad=True) with a bf16 w1.main_grad blamed w2 ("accumulate_into.w2 must be a contiguous
    bfloat16 tensor": w1's dtype decided what the others must be), and named every bad main_grad as
    accumulate_into.X. Now the message names the parameter's main_grad and the float32 it needs."""
    layer = make_layer("softmax_shared")
    fp32 = r"must be a contiguous float32 tensor of shape \({}\) on cpu \(main_grad: .*\); got "
    for name, main_grad, message in (
            ("w1", lambda p: torch.zeros_like(p), "^w1.main_grad " + fp32.format("4, 128, 64") + "torch.bfloat16"),
            ("shared_w2", lambda p: torch.zeros(p.shape[::-1]).t(),
             "^shared_w2.main_grad " + fp32.format("64, 64") + "torch.float32 .*, not contiguous$"),
            ("router", lambda p: torch.zeros_like(p, dtype=torch.bfloat16),
             r"^router.main_grad must be a contiguous float32 .*\(the router's is float32\)"),
            ("w2", lambda p: 5, "^w2.main_grad must be a Tensor, got int$")):
        model = mok.MoE(layer.config, main_grad=True)
        getattr(model, name).main_grad = main_grad(getattr(model, name))
        with pytest.raises(ValueError, match=message):
            model(layer.x)


def test_a_number_too_large_for_a_float_is_named_as_it_is():
    """A Fraction past float64's range was called "an integer too large for a float"."""
    from fractions import Fraction

    message = "^routed_scale must be a finite number, got a Fraction too large for a float$"
    with pytest.raises(ValueError, match=message):
        mok.MoEConfig(experts=4, hidden=64, intermediate=64, top_k=2, routed_scale=Fraction(10**400, 3))


def test_a_capacity_without_a_group_is_refused_quoting_no_bound():
    """capacity_rows without a group (one GPU) was refused quoting the bound over G > 1 GPUs computed for one
    ("need 0, or over gpus G > 1 a value in [1, 2]": the module's, for one token per rank), though no value
    but 0 is taken there. Now the message says the rule, by mok.MoE, mok.moe and mok.quantize_weights."""
    layer = make_layer("softmax_shared")
    rule = (r"^capacity_rows = {} \(need 0 without a group: a capacity is taken only over a process group of G > 1 "
            r"GPUs, group=\.\.\.; on one GPU every routed row is its own\)$")
    shared = (layer.shared_w1, layer.shared_w2)
    for capacity in (5, -5):
        with pytest.raises(ValueError, match=rule.format(capacity)):
            mok.MoE(layer.config, capacity_rows=capacity)
        with pytest.raises(ValueError, match=rule.format(capacity)):
            mok.moe(layer.x, layer.router, layer.w1, layer.w2, config=layer.config, shared=shared,
                    capacity_rows=capacity)
    fp8 = mok.MoEConfig(experts=4, hidden=128, intermediate=128, top_k=2, precision="fp8")
    model = mok.MoE(fp8)
    with pytest.raises(ValueError, match=rule.format(5)):
        mok.quantize_weights(model.w1, model.w2, config=fp8, capacity_rows=5)


def test_a_dynamic_token_dimension_is_refused_by_export():
    """torch.export with a Dim on x's tokens raised "tokens_per_rank must be an integer, got s77", a field the
    caller never set: the message now says the ops take the token count as a constant."""
    layer = make_layer("softmax_shared")
    model = mok.MoE(layer.config, ring_rows=RING_ROWS)
    with pytest.raises(ValueError, match="a symbolic or traced size. mok's ops take the token count as a constant"):
        torch.export.export(model, (layer.x,), dynamic_shapes=({0: torch.export.Dim("tokens")},))
    # Another integer given as a tensor is no token count: the plain message.
    with pytest.raises(ValueError, match=r"^ring_rows must be an integer, got tensor\(128\)$"):
        mok.MoE(layer.config, ring_rows=torch.tensor(128))(layer.x)
