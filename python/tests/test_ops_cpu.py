"""The ops on the CPU: registration (opcheck), the committed goldens' bits, accumulation, the config
vocabulary."""

import pytest

torch = pytest.importorskip("torch", reason="the mok package needs PyTorch")

import mok  # noqa: E402
from helpers import (BF16_GRADIENTS, CONFIGS, GIVEN, GOLDEN_DIR, GRADIENTS, REPLAY_IDS, RING_ROWS,  # noqa: E402
                     ROUTER, absent_outputs, assert_same_bits, make_layer)
from mok._ops import backward_float32  # noqa: E402
from mok.config import INT_FIELDS, MoEConfig, pack_launch  # noqa: E402

MODES = {"router": ROUTER, "replay_ids": REPLAY_IDS, "given": GIVEN}


def routing_inputs(layer, mode):
    """A routing for the replay modes: the router's own, with ids rolled by one slot (still distinct)."""
    if mode == ROUTER:
        return None, None
    _, idx, w, _, _ = layer.forward()
    idx = idx.roll(1, dims=1).contiguous()
    return idx, (w if mode == GIVEN else None)


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
@pytest.mark.parametrize("name", CONFIGS)
def test_opcheck_forward(name, mode):
    layer = make_layer(name)
    idx, w = routing_inputs(layer, mode)
    for t in (layer.x, layer.router, layer.w1, layer.w2, w):
        if t is not None:
            t.requires_grad_()
    torch.library.opcheck(torch.ops.mok.forward.default, (*layer.weights(), idx, w, *layer.op_args(mode)))


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_opcheck_backward(mode):
    layer = make_layer("softmax_shared")
    idx, w = routing_inputs(layer, mode)
    _, topk_idx, topk_w, logits, saved = layer.forward(mode, idx, w)
    args = (*layer.weights(), topk_idx, topk_w, logits, saved, layer.dy)
    torch.library.opcheck(torch.ops.mok.backward.default, (*args, *layer.op_args(mode)))
    torch.library.opcheck(torch.ops.mok.backward_consuming.default, (*args, *layer.op_args(mode)))
    accumulators = [torch.randn(g.shape) if g.numel() else None for g in layer.backward(layer.forward(mode, idx, w),
                                                                                         mode)[3:]]
    torch.library.opcheck(torch.ops.mok.backward_accumulate.default, (*args, *accumulators, *layer.op_args(mode)))


@pytest.mark.parametrize("name", CONFIGS)
def test_accumulate_adds_once_per_element(name):
    layer = make_layer(name)
    fwd = layer.forward()
    grads = layer.backward_float32(fwd)
    accumulators = [torch.randn(g.shape, generator=torch.Generator().manual_seed(1)) if g.numel() else None
                    for g in grads[3:]]
    before = [a.clone() if a is not None else None for a in accumulators]
    _, topk_idx, topk_w, logits, saved = fwd
    dx, d_topk_w, d_logits = torch.ops.mok.backward_accumulate(*layer.weights(), topk_idx, topk_w, logits, saved,
                                                               layer.dy, *accumulators, *layer.op_args())
    for out, want in zip((dx, d_topk_w, d_logits), grads[:3]):
        assert_same_bits(out, want)
    for acc, old, g, name in zip(accumulators, before, grads[3:], GRADIENTS[3:]):
        if acc is not None:
            assert_same_bits(acc, old + g, name)


def test_accumulate_refuses_an_inference_tensor_before_adding():
    """The op itself (as torch.compile calls it, past mok.moe's checks) refuses an inference accumulator,
    which has no version counter to move, and leaves the others as they were."""
    layer = make_layer("softmax_shared")
    fwd = layer.forward()
    grads = layer.backward_float32(fwd)
    accumulators = [torch.zeros(g.shape) if g.numel() else None for g in grads[3:]]
    with torch.inference_mode():
        accumulators[2] = torch.zeros(grads[5].shape)  # d_w2
    _, topk_idx, topk_w, logits, saved = fwd
    with pytest.raises(ValueError, match="d_w2 is an inference tensor"):
        torch.ops.mok.backward_accumulate(*layer.weights(), topk_idx, topk_w, logits, saved, layer.dy, *accumulators,
                                          *layer.op_args())
    assert all(not a.any() for a in accumulators if a is not None)


def golden_files():
    return sorted(GOLDEN_DIR.glob("*.h5")) if GOLDEN_DIR.is_dir() else []


def test_the_committed_goldens_are_found():
    """A wrong MOK_GOLDEN_DIR would leave test_committed_golden_bits without a case (a skip, not a failure)."""
    assert len(golden_files()) >= 14, f"{GOLDEN_DIR} holds {len(golden_files())} goldens; the catalogue has 14"


@pytest.mark.parametrize("path", golden_files(), ids=lambda p: p.stem)
def test_committed_golden_bits(path):
    """The CPU ops reproduce every committed golden (read through the C++ reader), bit for bit."""
    g = mok._C.read_golden(str(path))
    t = g["tensors"]
    mode = g["routing_mode"]
    args = (t["x"], t["router"], t.get("expert_bias"), t["w1"], t["w2"], t.get("shared_w1"), t.get("shared_w2"))
    op_args = (g["config_ints"], g["config_floats"], mode,
               pack_launch(RING_ROWS, fp8_weight_gradients=g["fp8_weight_gradients"]))
    y, topk_idx, topk_w, logits, saved = torch.ops.mok.forward(*args, t.get("given_topk_idx"), t.get("given_topk_w"),
                                                                *op_args)
    grads = torch.ops.mok.backward(*args, topk_idx, topk_w, logits, saved, t["dy"], *op_args)
    fp32 = backward_float32(*args, topk_idx, topk_w, logits, saved, t["dy"], *op_args)
    results = dict(zip(GRADIENTS, fp32), y=y, topk_idx=topk_idx, topk_w=topk_w, logits=logits)
    absent = absent_outputs("shared_w1" in t, mode)
    compared = 0
    for name, got in results.items():
        if name in t:
            assert_same_bits(got, t[name], f"{path.stem}: {name}", absent=name in absent)
            compared += 1
        else:
            assert got.numel() == 0, f"{name} has elements the golden does not have"
    assert compared >= 7  # y, topk_idx, topk_w, dx, d_topk_w, d_w1, d_w2 at least
    for name, got in zip(GRADIENTS, grads):  # mok::backward: the same, its weight gradients rounded to bf16 once
        want = results[name].bfloat16() if name in BF16_GRADIENTS else results[name]
        assert_same_bits(got, want, f"{path.stem}: mok::backward's {name}", absent=name in absent)


def test_golden_reader_agrees_with_h5py():
    """The C++ reader's tensors are the file's (docs/golden-format.md's Python reading, independently)."""
    h5py = pytest.importorskip("h5py")
    np = pytest.importorskip("numpy")
    path = GOLDEN_DIR / "smoke.h5"
    ours = mok._C.read_golden(str(path))["tensors"]
    with h5py.File(path, "r") as f:
        for group in ("inputs", "routing", "outputs"):
            for name, ds in f[group].items():
                raw = np.ascontiguousarray(ds[()])
                want = torch.from_numpy(raw.view(np.int16) if ds.attrs["dtype"] == "bf16" else raw)
                got = ours[name]
                got = got.view(torch.int16) if got.dtype == torch.bfloat16 else got
                assert torch.equal(got, want), f"/{group}/{name}"


def test_config_vocabulary():
    ints, floats = mok._C.default_config()
    shapes = {name: v for name, v in zip(INT_FIELDS, ints) if name in ("experts", "hidden", "intermediate", "top_k")}
    defaults = MoEConfig(**shapes)
    assert defaults.pack() == (ints, floats), "MoEConfig's defaults differ from LayerConfig's"
    for name, (config, _) in CONFIGS.items():
        assert MoEConfig.unpack(*config.pack()) == config, name


def test_saved_bytes_is_the_forward_saved_size():
    for name in CONFIGS:
        layer = make_layer(name)
        assert layer.forward()[4].numel() == mok._C.saved_bytes(*layer.config.pack())
