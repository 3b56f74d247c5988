"""Python registrations of the C++ ops (schemas, kernels and the autograd formula: python/src): fake
(meta) kernels for torch.compile and opcheck, which first make the checks the kernel would make (mok._C's
check_*: tracing raises its ValueError), and backward_float32."""

from __future__ import annotations

import torch

from mok import _C
from mok.config import ROUTING_MODES, MoEConfig, launch_field

GIVEN = ROUTING_MODES.index("given")


def _shapes(config_ints, config_floats, routing_mode, launch):
    """The config, this call's tokens and experts (with a communicator of G GPUs, this GPU's share: N / G
    and E / G) and the rows of logits (absent tensors have first dimension 0)."""
    c = MoEConfig.unpack(config_ints, config_floats)
    gpus = launch_field(launch, "gpus")
    n, e = c.tokens // gpus, c.experts // gpus
    return c, n, e, 0 if routing_mode == GIVEN else n


@torch.library.register_fake("mok::forward")
def _forward_fake(x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w, config_ints, config_floats,
                  routing_mode, launch, fp8_weights=None):
    _C.check_forward(x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w, config_ints,
                     config_floats, routing_mode, launch, fp8_weights)
    c, n, _, logit_rows = _shapes(config_ints, config_floats, routing_mode, launch)
    k = c.top_k
    # Over G GPUs each GPU's saved holds its own experts' rows, for its capacity (mok/core/saved_layout.h).
    saved_bytes = _C.saved_bytes(config_ints, config_floats, bool(launch_field(launch, "recompute")),
                                 launch_field(launch, "gpus"), launch_field(launch, "capacity_rows"))
    return (
        x.new_empty((n, c.hidden), dtype=torch.bfloat16),
        x.new_empty((n, k), dtype=torch.int32),
        x.new_empty((n, k), dtype=torch.float32),
        x.new_empty((logit_rows, c.experts), dtype=torch.float32),
        x.new_empty((saved_bytes,), dtype=torch.uint8),
    )


@torch.library.register_fake("mok::quantize_weights")
def _quantize_weights_fake(w1, w2, shared_w1, shared_w2, config_ints, config_floats, launch):
    _C.check_quantize_weights(w1, w2, shared_w1, shared_w2, config_ints, config_floats, launch)
    return w1.new_empty((_C.fp8_weights_bytes(config_ints, config_floats, launch),), dtype=torch.uint8)


def _gradient_shapes(config_ints, config_floats, routing_mode, launch):
    """Shapes of dx, d_topk_w, d_logits, d_router, d_w1, d_w2, d_shared_w1, d_shared_w2 (d_router and the
    shared expert's whole on every GPU, d_w1 and d_w2 this GPU's experts)."""
    c, n, own_e, logit_rows = _shapes(config_ints, config_floats, routing_mode, launch)
    h, i, e, s = c.hidden, c.intermediate, c.experts, c.shared_intermediate
    return ((n, h), (n, c.top_k), (logit_rows, e), (0 if routing_mode == GIVEN else e, h), (own_e, 2 * i, h),
            (own_e, h, i), (2 * s, h), (h, s))


# mok::backward's dtypes: dx and the expert weights' gradients bf16 (each fp32 gradient rounded once),
# the rest fp32.
_GRADIENT_DTYPES = (torch.bfloat16, torch.float32, torch.float32, torch.float32) + (torch.bfloat16,) * 4


def _gradient_fakes(x, config_ints, config_floats, routing_mode, launch):
    shapes = _gradient_shapes(config_ints, config_floats, routing_mode, launch)
    return tuple(x.new_empty(shape, dtype=dtype) for shape, dtype in zip(shapes, _GRADIENT_DTYPES))


@torch.library.register_fake("mok::backward")
def _backward_fake(x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w, logits, saved, dy,
                   config_ints, config_floats, routing_mode, launch, fp8_weights=None):
    _C.check_backward(x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w, logits, saved, dy,
                      None, None, None, None, None, config_ints, config_floats, routing_mode, launch, fp8_weights)
    return _gradient_fakes(x, config_ints, config_floats, routing_mode, launch)


torch.library.register_fake("mok::backward_consuming")(_backward_fake)  # saved is written, not resized


@torch.library.register_fake("mok::backward_accumulate")
def _backward_accumulate_fake(x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w, logits, saved,
                              dy, d_router, d_w1, d_w2, d_shared_w1, d_shared_w2, config_ints, config_floats,
                              routing_mode, launch, fp8_weights=None):
    _C.check_backward(x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w, logits, saved, dy,
                      d_router, d_w1, d_w2, d_shared_w1, d_shared_w2, config_ints, config_floats, routing_mode, launch,
                      fp8_weights)
    return _gradient_fakes(x, config_ints, config_floats, routing_mode, launch)[:3]


def backward_float32(x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w, logits, saved, dy,
                     config_ints, config_floats, routing_mode, launch):
    """mok::backward's results with every weight gradient in float32 (d_router, d_w1, d_w2, d_shared_*,
    absent ones with no elements): mok::backward_accumulate into zeros, one call; 0 + g is g's bits
    (the chains start from +0, so no gradient is -0)."""
    shapes = _gradient_shapes(config_ints, config_floats, routing_mode, launch)
    grads = [torch.zeros(shape, dtype=torch.float32, device=x.device) for shape in shapes[3:]]
    dx, d_topk_w, d_logits = torch.ops.mok.backward_accumulate(
        x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w, logits, saved, dy,
        *(g if g.numel() else None for g in grads), config_ints, config_floats, routing_mode, launch)
    return (dx, d_topk_w, d_logits, *grads)


def named_pairs(named: list):
    """Each two of named's (name, tensor) items, the later first: (name, a, other, b)."""
    for i, (name, a) in enumerate(named):
        for other, b in named[:i]:
            yield name, a, other, b


def unaliased_message(name: str, other: str, how: str) -> str:
    """Why two accumulators are refused under a trace (see check_unaliased)."""
    return (f"{name} and {other} {how}: under torch.compile the backward's adds into such accumulators go wrong "
            "(Inductor's copies of aliased inputs); pass tensors of their own, or call mok.moe outside the compiled "
            "region")


@torch.library.custom_op("mok::check_unaliased", mutates_args=())
def check_unaliased(accumulators: list[torch.Tensor], names: str) -> None:
    """Nothing at run time (eagerly mok.moe checks the accumulators' bytes exactly). Its fake kernel, run while
    a trace records the call, refuses two accumulators that share a storage: fake tensors share one where the
    traced inputs do, however made (views, .detach(), .data, set_), which the trace's Python cannot see. names:
    the accumulators', comma-separated (a schema takes no list of strings)."""


@check_unaliased.register_fake
def _check_unaliased_fake(accumulators, names):
    for name, a, other, b in named_pairs(list(zip(names.split(","), accumulators, strict=True))):
        if torch._C._is_alias_of(a, b):
            raise ValueError(unaliased_message(name, other, "share a storage"))
