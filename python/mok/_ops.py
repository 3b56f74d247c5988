"""Python registrations of the C++ ops (schemas and kernels: python/src): fake (meta) kernels for
torch.compile and opcheck, and the autograd formula of mok::forward.

Autograd: y is the only differentiable output. topk_idx, topk_w, logits and saved are marked
non-differentiable: the backward op computes the router's gradient from dy alone, so a gradient
arriving at topk_w or logits (e.g. from an auxiliary loss) could not be added; such a loss must compute
its own logits (docs/python.md).
"""

from __future__ import annotations

import torch

from mok import _C
from mok.config import ROUTING_MODES, MoEConfig

GIVEN = ROUTING_MODES.index("given")


def _shapes(config_ints, config_floats, routing_mode):
    c = MoEConfig.unpack(config_ints, config_floats)
    router_rows = 0 if routing_mode == GIVEN else c.tokens  # absent tensors have first dimension 0
    return c, router_rows


@torch.library.register_fake("mok::forward")
def _forward_fake(x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w, config_ints, config_floats,
                  routing_mode, launch):
    c, logit_rows = _shapes(config_ints, config_floats, routing_mode)
    n, k = c.tokens, c.top_k
    return (
        x.new_empty((n, c.hidden), dtype=torch.bfloat16),
        x.new_empty((n, k), dtype=torch.int32),
        x.new_empty((n, k), dtype=torch.float32),
        x.new_empty((logit_rows, c.experts), dtype=torch.float32),
        x.new_empty((_C.saved_bytes(config_ints, config_floats),), dtype=torch.uint8),
    )


def _gradient_fakes(x, config_ints, config_floats, routing_mode):
    """dx, d_topk_w, d_logits, d_router, d_w1, d_w2, d_shared_w1, d_shared_w2."""
    c, logit_rows = _shapes(config_ints, config_floats, routing_mode)
    n, h, i, e, s = c.tokens, c.hidden, c.intermediate, c.experts, c.shared_intermediate
    f32 = torch.float32
    return (
        x.new_empty((n, h), dtype=torch.bfloat16),
        x.new_empty((n, c.top_k), dtype=f32),
        x.new_empty((logit_rows, e), dtype=f32),
        x.new_empty((0 if routing_mode == GIVEN else e, h), dtype=f32),
        x.new_empty((e, 2 * i, h), dtype=f32),
        x.new_empty((e, h, i), dtype=f32),
        x.new_empty((2 * s, h), dtype=f32),
        x.new_empty((h, s), dtype=f32),
    )


@torch.library.register_fake("mok::backward")
def _backward_fake(x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w, logits, saved, dy,
                   config_ints, config_floats, routing_mode, launch):
    return _gradient_fakes(x, config_ints, config_floats, routing_mode)


@torch.library.register_fake("mok::backward_accumulate")
def _backward_accumulate_fake(x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w, logits, saved,
                              dy, d_router, d_w1, d_w2, d_shared_w1, d_shared_w2, config_ints, config_floats,
                              routing_mode, launch):
    return _gradient_fakes(x, config_ints, config_floats, routing_mode)[:3]


def _setup_context(ctx, inputs, output):
    x, router, expert_bias, w1, w2, shared_w1, shared_w2, _, _, config_ints, config_floats, mode, launch = inputs
    _, topk_idx, topk_w, logits, saved = output
    ctx.mark_non_differentiable(topk_idx, topk_w, logits, saved)
    ctx.save_for_backward(x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w, logits, saved)
    ctx.op_args = (config_ints, config_floats, mode, launch)


def _as(grad, param):
    """A weight's gradient in the weight's dtype: bf16 weights get their fp32 gradient rounded once."""
    return None if param is None else grad.to(param.dtype)


def _backward(ctx, dy, *_non_differentiable):
    x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w, logits, saved = ctx.saved_tensors
    dx, d_topk_w, _, d_router, d_w1, d_w2, d_shared_w1, d_shared_w2 = torch.ops.mok.backward(
        x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w, logits, saved, dy.contiguous(),
        *ctx.op_args)
    given = ctx.op_args[2] == GIVEN
    return (
        dx,
        None if given else d_router,  # a given routing does not read the router
        None,  # expert_bias only selects experts: no gradient
        _as(d_w1, w1),
        _as(d_w2, w2),
        _as(d_shared_w1, shared_w1),
        _as(d_shared_w2, shared_w2),
        None,  # topk_idx
        d_topk_w if given else None,  # the given weights' gradient; the router's own weights are internal
        None, None, None, None,
    )


torch.library.register_autograd("mok::forward", _backward, setup_context=_setup_context)
