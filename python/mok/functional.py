"""The MoE layer as a function of its tensors (mok::forward, with autograd through mok::backward_consuming)."""

from __future__ import annotations

import contextlib
import functools
from typing import NamedTuple, Optional, Union

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake

from mok import _C
from mok._ops import named_pairs, unaliased_message
from mok.config import DEFAULT_RING_ROWS, ROUTING_MODES, MoEConfig, _require_bool, pack_launch


class Routing(NamedTuple):
    """A call's routing: topk_idx [N, k] int32, topk_w [N, k] fp32 and the router's logits [N, E]
    fp32 ([0, E] when the routing was given). None of them carries a gradient."""

    topk_idx: Tensor
    topk_w: Tensor
    logits: Tensor


class GradAccumulators(NamedTuple):
    """Tensors a backward adds the layer's weight gradients into (mok::backward_accumulate), as a training
    step accumulates gradients over micro-batches, instead of returning them for autograd to add into
    the weights' .grad (no gradient tensors, no separate addition pass): router [E, H] fp32 (None with
    replay="full", which reads no router), w1 and w2 shaped as the weights (with a group, this rank's
    experts), shared the shared expert's pair (with one). Contiguous, on x's device.

    w1, w2 and shared are all float32 or all bfloat16. float32 (main_grad): one fp32 rounding per
    element, the reference's bits, no bf16 rounding of each micro-batch's gradient. bfloat16 (the
    weights' own .grad, say): each gradient rounded to bf16 and added as autograd adds it into a bf16
    .grad, so the bits are those of autograd's .grad, without its gradient tensors."""

    router: Optional[Tensor]
    w1: Tensor
    w2: Tensor
    shared: Optional[tuple[Tensor, Tensor]] = None


# A routing to replay: a Routing, a (topk_idx, topk_w) pair, or topk_idx alone.
RoutingArg = Union[Routing, tuple, Tensor, None]


def routing_mode(routing: RoutingArg, replay: Optional[str]) -> tuple[int, Optional[Tensor], Optional[Tensor]]:
    """The op's routing_mode, topk_idx and topk_w for a routing argument.

    replay="ids": the ids are replayed, the weights (and logits, and the router's gradient) come from
    the live router (RL routing replay, R3). replay="full": ids and weights are replayed, no router
    runs; topk_w gets a gradient. Default: "full" when weights are given, else "ids".
    """
    if routing is None:
        if replay is not None:
            raise ValueError(f"replay={replay!r} needs a routing to replay")
        return ROUTING_MODES.index("router"), None, None
    if isinstance(routing, Tensor):
        topk_idx, topk_w = routing, None
    elif isinstance(routing, Routing) or (isinstance(routing, (tuple, list)) and len(routing) == 2):
        topk_idx, topk_w = routing[0], routing[1]  # a Routing's logits are the router's output: not replayed
    else:  # routing[0] raised IndexError or TypeError, naming no argument; a plain 3-list lost its third
        raise ValueError("routing must be topk_idx (a Tensor), a (topk_idx, topk_w) pair or a mok.Routing, got "
                         + (f"a {type(routing).__name__} of length {len(routing)}"
                            if isinstance(routing, (tuple, list)) else type(routing).__name__))
    if not isinstance(topk_idx, Tensor) or not (topk_w is None or isinstance(topk_w, Tensor)):
        raise ValueError("routing's topk_idx must be a Tensor and its topk_w a Tensor or None, got "
                         f"{type(topk_idx).__name__} and {type(topk_w).__name__}")
    for name, t in (("topk_idx", topk_idx), ("topk_w", topk_w)):
        _require_dense(f"routing's {name}", t)
    if replay is None:  # `replay or ...` took "", False and 0 for the default without a word
        replay = "ids" if topk_w is None else "full"
    if replay == "ids":
        return ROUTING_MODES.index("replay_ids"), topk_idx, None
    if replay == "full":
        if topk_w is None:
            raise ValueError('replay="full" needs topk_w: pass routing=(topk_idx, topk_w)')
        return ROUTING_MODES.index("given"), topk_idx, topk_w
    raise ValueError(f'replay must be "ids", "full" or None, got {replay!r}')


# typed: a cached 0 must not let False (or 128.0 after 128) past pack_launch's checks.
@functools.lru_cache(maxsize=256, typed=True)
def _op_lists(config: MoEConfig, tokens_per_rank: int, ring_rows: int, blocks: int, recompute: bool, comm: int = 0,
              gpus: int = 1, capacity_rows: int = 0, fp8_weight_gradients: bool = False) -> tuple:
    """config_ints, config_floats and launch for the op, packed once per layer, batch size and
    communicator (packing in Python costs more than the op's own argument checks). Over G GPUs the
    layer has G * config.ranks ranks."""
    return (*config.pack(tokens_per_rank=tokens_per_rank, ranks=config.ranks * gpus),
            pack_launch(ring_rows, blocks, recompute, comm, gpus, capacity_rows, fp8_weight_gradients))


def _checked_op_lists(*args) -> tuple:
    """_op_lists, whose cache raised TypeError ("unhashable type: 'list'") for an unhashable argument
    (ring_rows=[128]), naming none: uncached, pack_launch's checks name it."""
    try:
        return _op_lists(*args)
    except TypeError:
        return _op_lists.__wrapped__(*args)


def moe(
    x: Tensor,
    router: Tensor,
    w1: Tensor,
    w2: Tensor,
    *,
    config: MoEConfig,
    shared: Optional[tuple[Tensor, Tensor]] = None,
    expert_bias: Optional[Tensor] = None,
    routing: RoutingArg = None,
    replay: Optional[str] = None,
    ring_rows: int = DEFAULT_RING_ROWS,
    blocks: int = 0,
    recompute: bool = False,
    return_routing: bool = False,
    group=None,
    capacity_rows: int = 0,
    fp8_weights: Optional[Tensor] = None,
    accumulate_into: Optional[GradAccumulators] = None,
    fp8_weight_gradients: bool = False,
) -> Union[Tensor, tuple[Tensor, Routing]]:
    """y = MoE(x): x [..., H] bf16; router [E, H] fp32; w1 [E, 2I, H] bf16 (gate rows, then up rows);
    w2 [E, H, I] bf16; shared = (shared_w1 [2Is, H], shared_w2 [H, Is]) bf16; expert_bias [E] fp32
    (sigmoid mode's selection bias; refused in softmax mode). Tensors must be contiguous, on one device
    (CPU: the reference; CUDA: the megakernel; the same bits). The tokens are x's leading dimensions, R * T of them.
    recompute: autograd saves the dispatch layout alone (no xe and h, nor the shared expert's h and
    a); the backward pulls x and recomputes them, with the same bits. Its forward writes no h (nor, in the
    fp8 mode, xe and a) and needs that much less workspace, so a call autograd does not record (no_grad,
    inference_mode, or no input requiring a gradient) runs in recompute mode without a group: the same y.

    group: a torch.distributed process group with an NCCL backend, one process per GPU (expert
    parallelism on the group's communicator; mok.distributed). Rank g of G holds its own tokens x
    [..., H] (every rank the same number T) and its experts' weights w1 [E/G, 2I, H], w2 [E/G, H, I]
    (experts [g E/G, (g+1) E/G)); router, expert_bias and shared are whole, the same on every rank. The
    result is the single-device layer's on the concatenation of the ranks' tokens in rank order, bit for
    bit: y, dx and the routing are this rank's rows, w1.grad and w2.grad its experts' gradients,
    router.grad and the shared expert's gradients whole and identical on every rank (no all-reduce
    needed). config.ranks counts the ranks of each GPU (the layer has G * config.ranks). Every rank
    makes the same calls in the same order (each is collective; the first of a config builds its layer
    on the communicator, collectively); see mok.distributed.release before destroying the group.
    capacity_rows (with a group): the routed rows each GPU's experts can hold; its per-row buffers
    (saved included) are sized for it instead of the most any routing can give, N min(k, E/G), which
    grows with the global batch. A routing that gives some GPU more raises an error on every rank
    naming that GPU and the capacity that holds it; no row is dropped, no bit depends on it.
    fp8_weights (the fp8 mode, CUDA): w1, w2 and shared as mok.quantize_weights quantized them (once per
    optimizer step); the forward, and autograd's backward, read them instead of quantizing the weights
    themselves (the backward W and W^T), with the same bits. They must be the quantization of these
    weights (not checked), unchanged until the backward.
    accumulate_into: the backward adds the weights' gradients into these accumulators (GradAccumulators:
    fp32, or the bf16 .grad tensors themselves) and autograd gives the weights no gradient (their .grad
    changes only where it is an accumulator); x (and a replayed topk_w) get theirs as usual.
    fp8_weight_gradients (the fp8 mode): the routed experts' weight gradients on E4M3 operands too (dh,
    x, w dy and a quantized per 128 token rows; the shared expert's stay bf16): other bits than the
    default bf16 weight gradients, the same on CPU and GPU. Slower on the H200 today (docs/benchmarks.md).
    """
    with _group_failures_marked(group, x):  # as mok.MoE's forward, whose own checks come before _moe's
        return _moe(x, router, w1, w2, config=config, shared=shared, expert_bias=expert_bias, routing=routing,
                    replay=replay, ring_rows=ring_rows, blocks=blocks, recompute=recompute,
                    return_routing=return_routing, group=group, capacity_rows=capacity_rows, fp8_weights=fp8_weights,
                    accumulate_into=accumulate_into, fp8_weight_gradients=fp8_weight_gradients)


def _group_failures_marked(group, x):
    """With a group, a context in which an error marks the group's communicator on x's device
    (mok.distributed.failures_marked); without one, nothing."""
    if group is None:
        return contextlib.nullcontext()
    from mok import distributed

    return distributed.failures_marked(group, x.device if isinstance(x, Tensor) and x.is_cuda else None)


def _moe(x: Tensor, router: Tensor, w1: Tensor, w2: Tensor, *, config: MoEConfig, shared, expert_bias,
         routing: RoutingArg, replay: Optional[str], ring_rows: int, blocks: int, recompute: bool,
         return_routing: bool, group, capacity_rows: int, fp8_weights: Optional[Tensor],
         accumulate_into: Optional[GradAccumulators], fp8_weight_gradients: bool,
         accumulators_of: Optional[str] = None) -> Union[Tensor, tuple[Tensor, Routing]]:
    """moe; accumulators_of: mok.MoE's accumulate_into holds its parameters' "grad" or "main_grad", which its
    errors name (w1.grad, not accumulate_into.w1: the caller passed no accumulate_into)."""
    shared_w1, shared_w2 = _shared_pair(shared)
    _check_arguments(config, x=x, router=router, w1=w1, w2=w2,
                     optional=dict(expert_bias=expert_bias, shared_w1=shared_w1, shared_w2=shared_w2,
                                   fp8_weights=fp8_weights))
    _require_bool("return_routing", return_routing)  # by its truth "no" returned the routing
    if x.dim() == 0:
        raise ValueError("x must be [..., H] (tokens by hidden), got a 0-d tensor")
    shape, hidden = x.shape, x.shape[-1]
    if x.dim() != 2:
        if hidden != config.hidden:  # else view(-1, 0)'s error for an x of no hidden elements
            raise ValueError(f"x must be [..., H] with H = hidden = {config.hidden}, got shape {list(shape)}")
        if not x.is_contiguous():
            raise ValueError("x is not contiguous (mok does not copy its inputs: pass .contiguous())")
        x = x.view(-1, hidden)
    tokens_per_rank = config.tokens_per_rank_of(x.shape[0])
    comm, gpus = 0, 1
    if group is not None:
        from mok import distributed

        comm, gpus = distributed.communicator(group, x.device, config.experts, config.ranks)

    def op_lists(recompute):
        return _checked_op_lists(config, tokens_per_rank, ring_rows, blocks, recompute, comm, gpus, capacity_rows,
                                 fp8_weight_gradients)

    config_ints, config_floats, launch = op_lists(recompute)
    _check_capacity(capacity_rows, gpus, group)
    mode, topk_idx, topk_w = routing_mode(routing, replay)
    inputs = (x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w)
    if not recompute and group is None and not _records_backward(inputs, accumulate_into):
        # Nothing will read `saved`: recompute mode's keeps the layout alone, and its forward writes no h.
        config_ints, config_floats, launch = op_lists(True)
    if accumulate_into is not None:
        _check_accumulators(accumulate_into, x, router, w1, w2, shared, mode, accumulators_of, inputs)
    if accumulate_into is not None and torch.is_grad_enabled():
        # mok.MoE(accumulate_grad=True): the parameters whose .grad the backward adds into, as it finds them (the
        # router's absent where accumulate_into holds none: replay="full")
        owners = None
        if accumulators_of == "grad":
            owners = GradAccumulators(None if accumulate_into.router is None else router, w1, w2, shared)
        y, idx, w, logits, _ = _IntoAccumulators.apply((accumulate_into, owners), *inputs,
                                                       (config_ints, config_floats, mode, launch), fp8_weights)
    else:  # the overload itself, not the packet torch.ops.mok.forward: a lookup less per call
        y, idx, w, logits, _ = torch.ops.mok.forward.default(*inputs, config_ints, config_floats, mode, launch,
                                                             fp8_weights)
    if len(shape) != 2:
        y = y.view(shape)
    return (y, Routing(idx, w, logits)) if return_routing else y


def _records_backward(inputs: tuple, accumulate_into: Optional[GradAccumulators]) -> bool:
    """Whether autograd records this call, so that its backward may read the forward's saved activations:
    the op's own rule (grad mode on and an input requiring a gradient), or accumulators to add into. A
    call it does not record runs in recompute mode on one device (mok.moe's docstring)."""
    if not torch.is_grad_enabled():
        return False
    return accumulate_into is not None or any(isinstance(t, Tensor) and t.requires_grad for t in inputs)


def _check_arguments(config: MoEConfig, optional: Optional[dict] = None, **tensors) -> None:
    """A config that is no MoEConfig, or a required tensor that is no Tensor, failed deep inside (an
    AttributeError, or torch's "tensor does not have a device" naming no argument); an optional tensor
    (by name in `optional`) that is neither a Tensor nor None reached the op's argument parser, whose
    RuntimeError names the op's schema."""
    if not isinstance(config, MoEConfig):
        raise ValueError(f"config must be a mok.MoEConfig, got {type(config).__name__}")
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a Tensor, got {type(t).__name__}")
        _require_dense(name, t)
    for name, t in (optional or {}).items():
        if t is not None and not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a Tensor or None, got {type(t).__name__}")
        _require_dense(name, t)


def _require_dense(name: str, t: Optional[Tensor]) -> None:
    """The ops take dense (strided) tensors: a sparse one raised the dispatcher's NotImplementedError ("Could
    not run 'mok::forward' with arguments from the 'SparseCPU' backend"), a nested one a RuntimeError
    ("Internal error: NestedTensorImpl doesn't support sizes"), neither naming the argument."""
    if t is not None and (t.is_nested or t.layout != torch.strided):
        raise ValueError(f"{name} must be a dense (strided) tensor, got "
                         + ("a nested tensor" if t.is_nested else f"layout {t.layout}"))


def _check_capacity(capacity_rows: int, gpus: int, group) -> None:
    """A capacity is taken over a process group of G > 1 GPUs alone. On one GPU the op's message quoted the
    bound of G > 1 computed for G = 1 ("need 0, or over gpus G > 1 a value in [1, 64]"), a range no value of
    which a call without a group takes."""
    if capacity_rows != 0 and gpus == 1:
        where = "without a group" if group is None else "on a group of one GPU"
        raise ValueError(f"capacity_rows = {capacity_rows} (need 0 {where}: a capacity is taken only over a process "
                         f"group of G > 1 GPUs, group=...; on one GPU every routed row is its own)")


def _shared_pair(shared) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """(shared_w1, shared_w2) of a shared argument, (None, None) for None. Unpacking anything else named no
    argument ("too many values to unpack"), and a tensor of two rows would unpack into two tensors."""
    if shared is None:
        return None, None
    if not isinstance(shared, (tuple, list)) or len(shared) != 2:
        got = f"a {type(shared).__name__} of length {len(shared)}" if isinstance(shared, (tuple, list)) \
            else type(shared).__name__
        raise ValueError(f"shared must be a (shared_w1, shared_w2) pair or None, got {got}")
    return shared[0], shared[1]


# The parameter of each accumulator: mok.MoE's errors name its .grad or .main_grad.
_PARAMETER_OF = {"router": "router", "w1": "w1", "w2": "w2", "shared[0]": "shared_w1", "shared[1]": "shared_w2"}


def _has_own_bytes(t, x: Tensor) -> bool:
    """Whether t is a tensor whose bytes check_apart can compare: one the op's checks will let through (on x's
    device, contiguous; the others it refuses by name) and not a functorch wrapper (torch.vmap's, which has no
    storage to point at)."""
    return (isinstance(t, Tensor) and t.device == x.device and t.is_contiguous()
            and not torch._C._functorch.is_functorch_wrapped_tensor(t))


_INPUT_NAMES = ("x", "router", "expert_bias", "w1", "w2", "shared_w1", "shared_w2", "topk_idx", "topk_w")


def _check_accumulators(acc: GradAccumulators, x: Tensor, router: Tensor, w1: Tensor, w2: Tensor,
                        shared: Optional[tuple[Tensor, Tensor]], mode: int, of: Optional[str] = None,
                        inputs: tuple = ()) -> None:
    """At the call, not at the backward: each accumulator a tensor of its weight's shape, contiguous, on
    x's device (on the GPU 16-byte aligned, as the layer's tensors: eager only, the op checks it at the backward
    under torch.compile), the router's fp32 and the others
    all fp32 or all bf16 (w1's decides); the router's absent exactly when replay="full" reads no router,
    the shared pair given exactly with a shared expert, no two overlapping in memory nor any overlapping one of
    `inputs` (mok.moe's tensor arguments, in _INPUT_NAMES' order), which the backward reads.

    of: "grad" or "main_grad", mok.MoE's accumulators (its parameters' .grad or .main_grad), which the errors
    name (w1.grad); the weights' dtype is then the usual one (bf16 for .grad, as the weights; fp32 for
    main_grad) unless all of them hold the other: a float32 w1.grad beside bf16 others was blamed on w2
    ("accumulate_into.w2 must be a contiguous float32 tensor"), and any bad .grad on accumulate_into.X,
    which the module's caller never passed."""
    if not isinstance(acc, GradAccumulators):
        raise ValueError(f"accumulate_into must be a mok.GradAccumulators, got {type(acc).__name__}")
    given = mode == ROUTING_MODES.index("given")
    if given and acc.router is not None:
        raise ValueError('accumulate_into.router must be None with replay="full", which reads no router')
    if not given and acc.router is None:
        raise ValueError("accumulate_into.router is missing: the router's gradient would have nowhere to go "
                         '(only replay="full" reads no router)')
    if (acc.shared is None) != (shared is None):
        raise ValueError("accumulate_into.shared must be given exactly when the layer has a shared expert")
    if acc.shared is not None and (not isinstance(acc.shared, (tuple, list)) or len(acc.shared) != 2):
        raise ValueError("accumulate_into.shared must be a pair: shared_w1's and shared_w2's accumulators")
    pairs = [("w1", acc.w1, w1), ("w2", acc.w2, w2)] + ([("router", acc.router, router)] if not given else [])
    if shared is not None:
        pairs += [("shared[0]", acc.shared[0], shared[0]), ("shared[1]", acc.shared[1], shared[1])]
    if of is None:
        bf16 = isinstance(acc.w1, Tensor) and acc.w1.dtype == torch.bfloat16
        weights_rule = " (w1, w2 and shared: all float32 or all bfloat16)"
    else:
        usual_bf16 = of == "grad"
        other = torch.float32 if usual_bf16 else torch.bfloat16
        all_other = all(isinstance(a, Tensor) and a.dtype == other for name, a, _ in pairs if name != "router")
        bf16 = usual_bf16 != all_other
        weights_rule = (" (accumulate_grad: w1's, w2's and the shared expert's .grad all bfloat16, as the weights, "
                        "or all float32)" if usual_bf16 else
                        " (main_grad: w1's, w2's and the shared expert's all float32, or all bfloat16)")

    def label(name: str) -> str:
        return f"accumulate_into.{name}" if of is None else f"{_PARAMETER_OF[name]}.{of}"

    # Eager only: Dynamo cannot trace a storage's address (nor data_ptr's alignment), and is_inference is kept
    # out of the trace with it (under torch.compile the op itself refuses an inference tensor, overlapping ones
    # and misaligned data at the backward, op_tensors.cpp).
    eager = not torch.compiler.is_compiling()
    # Meta and fake tensors hold no memory (every storage's address is 0): a meta call (the fake kernels), or one
    # under FakeTensorMode (memory estimates), was refused as "shares its memory with the weight itself". The
    # device check below puts every accumulator on x's device.
    addresses = eager and not x.is_meta and not is_fake(x)
    for name, a, weight in pairs:
        if not isinstance(a, Tensor):
            raise ValueError(f"{label(name)} is missing (got {type(a).__name__})" if of is None else
                             f"{label(name)} must be a Tensor, got {type(a).__name__}")
        dtype = torch.bfloat16 if bf16 and name != "router" else torch.float32
        if a.dtype != dtype or a.shape != weight.shape or a.device != x.device or not a.is_contiguous():
            rule = " (the router's is float32)" if name == "router" else weights_rule
            raise ValueError(f"{label(name)} must be a contiguous {str(dtype)[6:]} tensor of shape "
                             f"{tuple(weight.shape)} on {x.device}{rule}; got {a.dtype} {tuple(a.shape)} on "
                             f"{a.device}{'' if a.is_contiguous() else ', not contiguous'}")
        if eager and a.is_cuda and a.data_ptr() % 16:
            raise ValueError(f"{label(name)} is not 16-byte aligned (the GPU layer reads 16-byte vectors)")
        # The backward adds into it in place, behind autograd: a tensor autograd tracks, or the weight's own
        # memory, would be changed under the graph (the weight while the backward reads it).
        if a.requires_grad:
            raise ValueError(f"{label(name)} requires grad: the backward adds into it in place, which autograd does "
                             "not record" + (" (pass the weight's .grad, a main_grad buffer or another tensor that "
                                             "requires no grad)" if of is None else ""))
        if eager:
            if addresses and a.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr():
                raise ValueError(f"{label(name)} shares its memory with the weight itself")
            if a.is_inference():  # no version counter for the backward to move
                raise ValueError(f"{label(name)} is an inference tensor (made under torch.inference_mode), "
                                 "which no backward may write")
    if addresses:  # the op's own checks (op_tensors.cpp), here at the call rather than at the backward
        named = [(label(name), a) for name, a, _ in pairs]
        _C.check_disjoint(named)
        _C.check_apart(named, [(name, t) for name, t in zip(_INPUT_NAMES, inputs) if _has_own_bytes(t, x)])
    if not eager:
        _check_unaliased_under_trace([(label(name), a) for name, a, _ in pairs])


def _check_unaliased_under_trace(named: list) -> None:
    """Under a trace, accumulators that are one tensor or views of one (a flat gradient buffer's slices, as
    Megatron's main_grad) are refused: Inductor's compiled backward, which copies a mutated input in and out,
    added into them wrong (values past each view, NaN; the CPU as the GPU, python/tests/test_autograd.py), and
    its graph, cached, served later calls. Addresses are not traceable, views are (`_base`): eagerly (also where
    Dynamo falls back from this raise, without fullgraph) the exact overlap checks above run instead, and views
    that do not overlap are taken. Storage shared otherwise (.detach(), .data, set_) only the fake tensors see:
    mok::check_unaliased refuses it while the trace records the call (an error even without fullgraph)."""
    def root(t):
        return t if t._base is None else t._base

    for name, a, other, b in named_pairs(named):
        if root(a) is root(b):
            raise ValueError(unaliased_message(name, other, "are one tensor or views of one"))
    torch.ops.mok.check_unaliased([a for _, a in named], ",".join(name for name, _ in named))


def _zeros_for_grad(p: Tensor) -> Tensor:
    """Zeros as autograd's .grad of p would be made: torch's grad_dtype where set, else p's dtype (a bf16 .grad
    under grad_dtype float32 raised torch's RuntimeError, naming no parameter), contiguous."""
    return torch.zeros_like(p, dtype=getattr(p, "grad_dtype", None) or p.dtype, memory_format=torch.contiguous_format)


@torch.no_grad()
def _grads_at_the_backward(owners: GradAccumulators) -> GradAccumulators:
    """accumulate_grad, eager: the .grad each of owners' parameters holds when the backward runs (zeros made where
    it is None), which is where plain autograd adds. The forward's may be gone: set to None by
    optimizer.zero_grad() before loss.backward() (the step's gradient went into tensors no parameter held, and the
    optimizer skipped them all without a word), or replaced (a checkpoint's recomputed forward, another forward
    after zero_grad). The op checks them as it checks any accumulator."""
    def grad_of(p: Optional[Tensor]) -> Optional[Tensor]:
        if p is not None and p.grad is None:
            p.grad = _zeros_for_grad(p)
        return None if p is None else p.grad

    shared = None if owners.shared is None else (grad_of(owners.shared[0]), grad_of(owners.shared[1]))
    return GradAccumulators(grad_of(owners.router), grad_of(owners.w1), grad_of(owners.w2), shared)


class _IntoAccumulators(torch.autograd.Function):
    """mok::forward whose backward is mok::backward_accumulate into the caller's accumulators: the
    weights get no gradient from autograd (theirs are added into the accumulators); x and a replayed
    topk_w get theirs. The saved tensors and the gradients' layout are MoEFunction's (python/src/
    autograd.cpp): keep the two in step."""

    @staticmethod
    def forward(ctx, accumulators_and_owners, x, router, expert_bias, w1, w2, shared_w1, shared_w2, topk_idx, topk_w,
                lists, fp8_weights):
        config_ints, config_floats, mode, launch = lists
        y, idx, w, logits, saved = torch.ops.mok.forward.default(x, router, expert_bias, w1, w2, shared_w1, shared_w2,
                                                                 topk_idx, topk_w, config_ints, config_floats, mode,
                                                                 launch, fp8_weights)
        ctx.mark_non_differentiable(idx, w, logits, saved)
        ctx.set_materialize_grads(False)  # no zero gradient of saved's size for the backward (autograd.cpp)
        # expert_bias not saved, as autograd.cpp's: the backward reads the experts it selected from idx.
        ctx.save_for_backward(x, router, None, w1, w2, shared_w1, shared_w2, idx, w, logits, saved, fp8_weights)
        (ctx.accumulators, ctx.owners), ctx.lists = accumulators_and_owners, lists
        return y, idx, w, logits, saved

    @staticmethod
    def backward(ctx, dy, *_):
        # Not once_differentiable, which runs the op under no_grad and raises only where dy requires grad: under
        # create_graph dx then required no grad, and a second derivative through it was taken as zero without a
        # word. Here the op's autograd fallback (autograd.cpp) gives dx and d_topk_w a node that raises, as
        # mok::backward_consuming's.
        if dy is None:  # no gradient reached y: none for the inputs, nothing to add (autograd.cpp)
            return (None,) * 12
        x, router, expert_bias, w1, w2, shared_w1, shared_w2, idx, w, logits, saved, fp8_weights = ctx.saved_tensors
        acc = ctx.accumulators
        if ctx.owners is not None and not torch.compiler.is_compiling():
            acc = _grads_at_the_backward(ctx.owners)
        config_ints, config_floats, mode, launch = ctx.lists
        shared_acc = acc.shared if acc.shared is not None else (None, None)
        # Detached: the same memory and version counter, no view history. Under create_graph the op runs with
        # grad mode on, and its autograd fallback refused to write into views made under no_grad or by split.
        into = [None if a is None else a.detach() for a in (acc.router, acc.w1, acc.w2, *shared_acc)]
        dx, d_topk_w, _ = torch.ops.mok.backward_accumulate.default(
            x, router, expert_bias, w1, w2, shared_w1, shared_w2, idx, w, logits, saved, dy.contiguous(), *into,
            config_ints, config_floats, mode, launch, fp8_weights)
        given = mode == ROUTING_MODES.index("given")
        # One per forward input: (accumulators, owners), x, router, expert_bias, w1, w2, shared_w1, shared_w2,
        # topk_idx, topk_w, lists, fp8_weights.
        return None, dx, None, None, None, None, None, None, None, d_topk_w if given else None, None, None


def quantize_weights(
    w1: Tensor,
    w2: Tensor,
    *,
    config: MoEConfig,
    shared: Optional[tuple[Tensor, Tensor]] = None,
    tokens_per_rank: Optional[int] = None,
    ring_rows: int = DEFAULT_RING_ROWS,
    blocks: int = 0,
    recompute: bool = False,
    group=None,
    capacity_rows: int = 0,
    fp8_weight_gradients: bool = False,
) -> Tensor:
    """The fp8 mode's weights quantized once (E4M3, a power-of-two scale per 128 x 128 block), a uint8
    tensor on w1's CUDA device for mok.moe(..., fp8_weights=...): as training frameworks do, quantize
    after each optimizer step and reuse the result for every micro-batch's forward, which then (with its
    backward) skips the quantization and its workspace. Enqueued on the current stream, no
    synchronisation. The arguments are moe's (with a group, this rank's experts' w1 and w2;
    tokens_per_rank: the forwards' T, default config.tokens_per_rank): the launch arguments
    (tokens_per_rank, ring_rows, blocks, recompute, group, capacity_rows, fp8_weight_gradients) pick the
    cached layer, so they must be the forwards' or another layer is built (with a group, another window on
    the communicator). The CPU op quantizes in each forward and backward and takes no fp8_weights."""
    shared_w1, shared_w2 = _shared_pair(shared)
    _check_arguments(config, w1=w1, w2=w2, optional=dict(shared_w1=shared_w1, shared_w2=shared_w2))
    comm, gpus = 0, 1
    if group is not None:
        from mok import distributed

        comm, gpus = distributed.communicator(group, w1.device, config.experts, config.ranks)
    # `is None`, not `or`: an explicit tokens_per_rank = 0 is refused by the op, not replaced by the default.
    tokens_per_rank = config.tokens_per_rank if tokens_per_rank is None else tokens_per_rank
    config_ints, config_floats, launch = _checked_op_lists(config, tokens_per_rank, ring_rows, blocks, recompute,
                                                           comm, gpus, capacity_rows, fp8_weight_gradients)
    _check_capacity(capacity_rows, gpus, group)
    return torch.ops.mok.quantize_weights.default(w1, w2, shared_w1, shared_w2, config_ints, config_floats, launch)
