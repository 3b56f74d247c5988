"""mok.capture: one real layer call (forward and backward) written as a golden file
(docs/golden-format.md, through the C++ writer), so `mok-verify FILE --backend reference` can check
its bits against the CPU reference."""

from __future__ import annotations

import collections.abc
import os
from typing import Optional

import torch
from torch import Tensor

from mok import _C
from mok._ops import backward_float32
from mok.config import DEFAULT_RING_ROWS, ROUTING_MODES, MoEConfig, pack_launch
from mok.functional import RoutingArg, _check_arguments, _shared_pair, routing_mode
from mok.nn import MoE


# What a layer dict may hold: mok.moe's arguments that a golden records.
_LAYER_KEYS = ("router", "w1", "w2", "config", "shared", "expert_bias", "ring_rows", "recompute",
               "fp8_weight_gradients")


def capture(path: str | os.PathLike, layer: MoE | dict, x: Tensor, dy: Optional[Tensor] = None, *,
            routing: RoutingArg = None, replay: Optional[str] = None, name: str = "capture",
            description: str = "") -> None:
    """Runs mok::forward and the backward (fp32 weight gradients: backward_float32) once on x (and dy: by default
    normal values from seed 0, rounded to bf16) and writes every input and result to `path`.

    layer: an MoE module, or a dict of mok.functional.moe's arguments (router, w1, w2, config and
    optionally shared, expert_bias, ring_rows, recompute, fp8_weight_gradients). Replayed ids (replay="ids")
    have no place in golden format v1 and raise ValueError.
    """
    # Before the call: "" failed only at the end ("cannot rename ./..tmp.N.0 to ''"), None at os.fspath.
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise ValueError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    if not os.fspath(path):
        raise ValueError("path must name a file, got an empty path")
    # The writer takes the file system's bytes: a str with a NUL was cut there (capture("a\0b.h5") wrote "a"),
    # and a str with surrogate escapes (os.fsdecode's of a non-UTF-8 name) failed write_golden's str argument
    # with a TypeError, after the call had run.
    path_bytes = os.fsencode(path)
    if b"\0" in path_bytes:
        raise ValueError(f"path must not contain a NUL byte, got {path!r}")
    _C.require_writable_file(path_bytes)  # else found by the writer, after the whole call had run
    if isinstance(layer, MoE):
        if layer.group is not None:
            raise ValueError("capture writes a whole layer's call; this MoE holds one rank's shard of a process "
                             "group's layer")
        shared = (layer.shared_w1, layer.shared_w2) if layer.shared_w1 is not None else None
        args = dict(router=layer.router, w1=layer.w1, w2=layer.w2, config=layer.config, shared=shared,
                    expert_bias=layer.expert_bias, ring_rows=layer.ring_rows, recompute=layer.recompute,
                    fp8_weight_gradients=layer.fp8_weight_gradients)
    elif isinstance(layer, collections.abc.Mapping):
        args = dict(layer)
        missing = [k for k in ("router", "w1", "w2", "config") if k not in args]
        if missing:  # else a bare KeyError
            raise ValueError(f"capture: the layer dict lacks {', '.join(missing)} (mok.moe's router, w1, w2 and "
                             "config are required)")
        # Else ignored without a word: recompute misspelt, or a share's capacity_rows.
        unknown = [k for k in args if k not in _LAYER_KEYS]
        if unknown:
            raise ValueError(f"capture: the layer dict has {', '.join(map(str, unknown))}, which capture does not "
                             f"take (it takes {', '.join(_LAYER_KEYS)})")
    else:  # dict(layer) raised TypeError naming no argument ("'int' object is not iterable")
        raise ValueError(f"layer must be a mok.MoE or a dict of mok.moe's arguments, got {type(layer).__name__}")
    config: MoEConfig = args["config"]
    shared_w1, shared_w2 = _shared_pair(args.get("shared"))
    _check_arguments(config, x=x, router=args["router"], w1=args["w1"], w2=args["w2"],
                     optional=dict(dy=dy, expert_bias=args.get("expert_bias"), shared_w1=shared_w1,
                                   shared_w2=shared_w2))
    for what, text in (("name", name), ("description", description)):
        if not isinstance(text, str):  # else write_golden's TypeError, naming no argument
            raise ValueError(f"{what} must be a str, got {type(text).__name__}")
        try:  # a lone surrogate: write_golden's TypeError too, after the call had run
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{what} must be text that UTF-8 can encode, got {text!r} ({e.reason})") from None
        if "\0" in text:  # else refused by the writer (an HDF5 string ends at a NUL), after the call had run
            raise ValueError(f"{what} must not contain a NUL character, got {text!r}")
    _C.validate_case_name(name)  # else refused by the writer, after the whole call had run
    for what, t in (("x", x), ("dy", dy)):
        if t is not None and t.is_meta:  # a meta call runs the fake kernels: no values to write (copying out raised)
            raise ValueError(f"capture writes a call's values: {what} is on the meta device, which holds none")
    launch = pack_launch(args.get("ring_rows", DEFAULT_RING_ROWS), 0, args.get("recompute", False),
                         fp8_weight_gradients=args.get("fp8_weight_gradients", False))
    if x.dim() == 0 or x.shape[-1] != config.hidden:
        raise ValueError(f"x must be [..., H] with H = hidden = {config.hidden}, got shape {list(x.shape)}")
    x = x.reshape(-1, config.hidden)
    config_ints, config_floats = config.pack(tokens_per_rank=config.tokens_per_rank_of(x.shape[0]))
    mode, topk_idx, topk_w = routing_mode(routing, replay)
    if ROUTING_MODES[mode] == "replay_ids":
        raise ValueError("golden format v1 holds a router's routing or a given one, not replayed ids")
    if dy is None:
        dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float32,
                         device="cpu").to(torch.bfloat16)
    if dy.dim() == 0 or dy.shape[-1] != config.hidden or dy.numel() != x.numel():  # else reshape's error or a misread
        raise ValueError(f"dy must have x's shape (N = {x.shape[0]} tokens by H = {config.hidden}), got shape "
                         f"{list(dy.shape)}")
    dy = dy.reshape(x.shape).to(x.device).contiguous()

    inputs = dict(x=x, router=args["router"], expert_bias=args.get("expert_bias"), w1=args["w1"], w2=args["w2"],
                  shared_w1=shared_w1, shared_w2=shared_w2)
    op_args = (config_ints, config_floats, mode, launch)
    with torch.no_grad():
        y, idx, w, logits, saved = torch.ops.mok.forward(*inputs.values(), topk_idx, topk_w, *op_args)
        grads = backward_float32(*inputs.values(), idx, w, logits, saved, dy, *op_args)  # a golden's are fp32
    tensors = dict(inputs, dy=dy, given_topk_idx=topk_idx, given_topk_w=topk_w, topk_idx=idx, topk_w=w,
                   logits=logits, saved=saved, y=y)
    names = ("dx", "d_topk_w", "d_logits", "d_router", "d_w1", "d_w2", "d_shared_w1", "d_shared_w2")
    tensors.update(zip(names, grads))
    # What the golden does not hold for this config and mode is absent here (None, or no elements).
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items() if v is not None and v.numel()}
    _C.write_golden(path_bytes, name, description, config_ints, config_floats, mode, launch, tensors)
