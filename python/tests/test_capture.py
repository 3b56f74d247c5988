"""mok.capture writes golden files the C++ reader and mok-verify accept (CPU here; the GPU variant in
test_cuda.py)."""

import os
import subprocess

import pytest

torch = pytest.importorskip("torch", reason="the mok package needs PyTorch")

import mok  # noqa: E402
from helpers import CONFIGS, GIVEN, RING_ROWS, assert_same_bits, make_layer  # noqa: E402


def verify_with_reference(path):
    """mok-verify's reference backend reruns the CPU reference on the file's inputs and compares."""
    tool = os.environ.get("MOK_VERIFY")
    if not tool or not os.path.exists(tool):
        pytest.skip("MOK_VERIFY (the mok-verify binary) is not set: run through ctest")
    run = subprocess.run([tool, str(path), "--backend", "reference", "--quiet"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def layer_args(layer):
    return dict(router=layer.router, w1=layer.w1, w2=layer.w2, config=layer.config, expert_bias=layer.expert_bias,
                shared=(layer.shared_w1, layer.shared_w2) if layer.shared_w1 is not None else None,
                ring_rows=RING_ROWS)


@pytest.mark.parametrize("name", CONFIGS)
def test_capture_round_trip(tmp_path, name):
    layer = make_layer(name)
    path = tmp_path / f"{name}.h5"
    mok.capture(path, layer_args(layer), layer.x, layer.dy, name=name, description="test")
    g = mok._C.read_golden(path)  # a pathlib.Path, as capture takes
    assert g["name"] == name and g["config_ints"] == layer.config.pack()[0]
    y = layer.forward()[0]
    assert_same_bits(g["tensors"]["y"], y, "y")
    assert_same_bits(g["tensors"]["dx"], layer.backward(layer.forward())[0], "dx")
    verify_with_reference(path)


def test_capture_module_with_given_routing(tmp_path):
    layer = make_layer("sigmoid_grouped")
    model = mok.MoE(layer.config, ring_rows=RING_ROWS, generator=torch.Generator().manual_seed(5))
    _, routing = model(layer.x, return_routing=True)
    path = tmp_path / "given.h5"
    mok.capture(path, model, layer.x, routing=routing, replay="full")
    g = mok._C.read_golden(str(path))
    assert g["routing_mode"] == GIVEN and "logits" not in g["tensors"]
    verify_with_reference(path)


@pytest.mark.parametrize("fp8_weight_gradients", [False, True])
def test_capture_fp8_module(tmp_path, fp8_weight_gradients):
    """An fp8 layer's call (the CPU op) is captured with its precision and its weight gradients' option,
    and the reference reproduces it."""
    config = mok.MoEConfig(experts=4, hidden=128, intermediate=128, top_k=2, shared_intermediate=128,
                           precision="fp8")
    model = mok.MoE(config, ring_rows=RING_ROWS, generator=torch.Generator().manual_seed(6),
                    fp8_weight_gradients=fp8_weight_gradients)
    x = torch.randn(24, 128, generator=torch.Generator().manual_seed(7)).bfloat16()
    path = tmp_path / "fp8.h5"
    mok.capture(path, model, x, name="fp8")
    g = mok._C.read_golden(str(path))
    assert mok.MoEConfig.unpack(g["config_ints"], g["config_floats"]).precision == "fp8"
    assert g["fp8_weight_gradients"] == fp8_weight_gradients
    assert_same_bits(g["tensors"]["y"], model(x), "y")
    verify_with_reference(path)


def test_capture_refuses_replayed_ids(tmp_path):
    layer = make_layer()
    _, idx, _, _, _ = layer.forward()
    with pytest.raises(ValueError, match="not replayed ids"):
        mok.capture(tmp_path / "ids.h5", layer_args(layer), layer.x, routing=idx)
