"""mok.nn.MoE: the layer as a module holding its weights in mok's layout."""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from mok import _C
from mok.config import DEFAULT_RING_ROWS, ROUTING_MODES, MoEConfig, _require_bool, _require_int, pack_launch
from mok.functional import (GradAccumulators, Routing, RoutingArg, _check_arguments, _check_capacity,
                            _group_failures_marked, _moe, _zeros_for_grad, quantize_weights, routing_mode)


def _check_launch(config: MoEConfig, launch: list[int]) -> None:
    """The checks every kernel makes on a call of one token per rank with this launch list (the fake
    kernels' on meta tensors of the layer's shapes: no memory, no GPU)."""

    def meta(dtype: torch.dtype, *shape: int) -> Tensor:
        return torch.empty(shape, dtype=dtype, device="meta")

    e, h, i, s = config.experts, config.hidden, config.intermediate, config.shared_intermediate
    bf16, f32 = torch.bfloat16, torch.float32
    bias = meta(f32, e) if config.score_mode == "sigmoid" else None
    shared = (meta(bf16, 2 * s, h), meta(bf16, h, s)) if s else (None, None)
    _C.check_forward(meta(bf16, config.ranks, h), meta(f32, e, h), bias, meta(bf16, e, 2 * i, h), meta(bf16, e, h, i),
                     *shared, None, None, *config.pack(tokens_per_rank=1), ROUTING_MODES.index("router"), launch, None)


def _zero_main_grad_of(p: torch.nn.Parameter) -> Tensor:
    return torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format)


def _check_generator(generator: Optional[torch.Generator]) -> None:
    """The draws are on the CPU: another generator raised randn's TypeError quoting its signatures, or "Expected
    a 'cpu' device type for generator", naming no argument (and in the constructor after the allocation)."""
    if generator is not None and (not isinstance(generator, torch.Generator) or generator.device.type != "cpu"):
        got = f"one on {generator.device}" if isinstance(generator, torch.Generator) else type(generator).__name__
        raise ValueError(f"generator must be a CPU torch.Generator or None (the weights are drawn on the CPU), "
                         f"got {got}")


class MoE(torch.nn.Module):
    """Parameters: router [E, H] fp32, w1 [E, 2I, H] bf16 (gate rows, then up rows), w2 [E, H, I] bf16,
    and with config.shared_intermediate > 0 shared_w1 [2Is, H], shared_w2 [H, Is] bf16. In sigmoid mode
    the buffer expert_bias [E] fp32 (zeros) biases the selection (updated by the caller, not by
    gradients); in softmax mode, which takes no bias, expert_bias is None (no buffer). Gradients of the
    bf16 weights are the layer's fp32 gradients rounded to bf16 once.

    group: a torch.distributed NCCL process group of G processes, one per GPU (mok.moe's group): this
    rank g holds only its experts' shard, w1 [E/G, 2I, H] and w2 [E/G, H, I] (experts
    [expert_begin, expert_begin + E/G), expert_begin = g E/G), and router, expert_bias and the shared
    expert whole; forward takes this rank's tokens. The same generator seed on every rank gives every
    rank the same router and shared expert and the shards of the experts a single-device MoE of that
    seed holds (reset_parameters), so a single-device state_dict's w1[expert_begin : expert_begin + E/G]
    is this rank's w1. capacity_rows: mok.moe's (with a group). fp8_weight_gradients: mok.moe's (the
    fp8 mode's weight gradients on E4M3 operands).

    main_grad: the backward adds the parameters' gradients into fp32 tensors `p.main_grad` (mok.moe's
    accumulate_into; zeros at construction, moved with the module) instead of giving them a .grad, as
    Megatron-LM's gradient-accumulation fusion does: each micro-batch's fp32 gradient is added once,
    with no bf16 gradient in between and no separate addition pass. torch.optim reads .grad, and data
    parallelism (DDP, FSDP) reduces .grad: hand main_grad to the optimizer and reduce it yourself. Zero
    them (zero_main_grad) once an optimizer step has used them. A frozen parameter (requires_grad
    False) still accumulates; with replay="full" the router's stays as it is (no router runs).

    accumulate_grad: the backward adds the parameters' gradients into their own .grad (bf16 weights, fp32
    router; eagerly the .grad each holds when the backward runs, as plain autograd's, zeros made where it is None,
    e.g. after optimizer.zero_grad(); under torch.compile the .grad the forward found; in torch's grad_dtype where
    set (float32 on every weight: fp32 accumulation, as all-fp32 accumulate_into); with replay="full" the router
    gets none, as from autograd): the bits autograd's .grad would hold (but where
    autograd's .grad starts as None and takes a NaN gradient as it is: 0x7fc0 there, 0x7fff in the
    accumulator; docs/numerics.md, backward step 10), without autograd's gradient tensors and
    additions (gradient accumulation over micro-batches at less memory). torch.optim reads these .grad
    as usual. Every parameter must require grad (a frozen one is refused: the backward would add into
    it). Autograd itself gives the parameters no gradient: a hook on one (register_hook) sees None,
    while the gradient accumulators' post hooks run,
    and with them DistributedDataParallel's reduction of these .grad (tested with default DDP options,
    one backward, gloo on the CPU; not NCCL, no_sync() or FSDP). Under torch.compile(fullgraph=True) the
    .grad tensors must exist before the compiled call (without fullgraph the call breaks the graph there
    and makes them). Exclusive with main_grad.
    """

    def __init__(self, config: MoEConfig, *, ring_rows: int = DEFAULT_RING_ROWS, blocks: int = 0,
                 recompute: bool = False, device: Optional[torch.device | str] = None,
                 generator: Optional[torch.Generator] = None, group=None, capacity_rows: int = 0,
                 main_grad: bool = False, accumulate_grad: bool = False, fp8_weight_gradients: bool = False):
        super().__init__()
        for name, value in (("main_grad", main_grad), ("accumulate_grad", accumulate_grad)):
            _require_bool(name, value)  # by their truth, main_grad="no" turned main_grad on
        if main_grad and accumulate_grad:
            raise ValueError("main_grad and accumulate_grad exclude each other: the backward adds the gradients "
                             "into p.main_grad or into p.grad, not both")
        _check_arguments(config)
        # Before the parameters take memory for a config no call accepts (the batch is the call's: one token
        # per rank here); the launch arguments' types too (else the first forward refused them).
        _C.check_config(*config.pack(tokens_per_rank=1))
        # And their values (ring_rows = 100, blocks = -1, a capacity without a group, fp8_weight_gradients in the
        # bf16 mode were taken here and refused by every forward). The capacity apart: its bound is the
        # forwards' with a group (N min(k, E/G) grows with their batch), so only its sign here; without one,
        # the launch check's message quoted a bound of G > 1 computed for one GPU ("[1, 2]").
        _require_int("capacity_rows", capacity_rows)
        if group is not None and capacity_rows < 0:
            raise ValueError(f"capacity_rows = {capacity_rows} (need 0, or the routed rows each GPU's experts hold)")
        if group is None:
            _check_capacity(capacity_rows, 1, None)
        _check_launch(config, pack_launch(ring_rows, blocks, recompute, fp8_weight_gradients=fp8_weight_gradients))
        _check_generator(generator)
        self.config, self.ring_rows, self.blocks, self.recompute = config, ring_rows, blocks, recompute
        self.group, self.capacity_rows, self.main_grad = group, capacity_rows, main_grad
        self.accumulate_grad, self.fp8_weight_gradients = accumulate_grad, fp8_weight_gradients
        e, h, i, s = config.experts, config.hidden, config.intermediate, config.shared_intermediate
        own = e
        self.expert_begin = 0
        if group is not None:
            from mok import distributed

            gpus = distributed.check_group(group, e, config.ranks)
            _check_capacity(capacity_rows, gpus, group)
            own = e // gpus
            self.expert_begin = group.rank() * own

        def param(dtype: torch.dtype, *shape: int) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.empty(shape, dtype=dtype, device=device))

        self.router = param(torch.float32, e, h)
        self.w1 = param(torch.bfloat16, own, 2 * i, h)
        self.w2 = param(torch.bfloat16, own, h, i)
        self.shared_w1 = param(torch.bfloat16, 2 * s, h) if s else None
        self.shared_w2 = param(torch.bfloat16, h, s) if s else None
        bias = torch.zeros(e, dtype=torch.float32, device=device) if config.score_mode == "sigmoid" else None
        self.register_buffer("expert_bias", bias)
        self.reset_parameters(generator)
        if main_grad:
            for p in self.parameters():
                p.main_grad = _zero_main_grad_of(p)

    def _apply(self, fn, recurse=True):
        # Module.to() keeps the Parameter objects (a main_grad would stay on the old device) or makes new
        # ones (it would be lost): each parameter's main_grad follows it, kept fp32.
        main_grads = [getattr(p, "main_grad", None) for p in self.parameters()]
        super()._apply(fn, recurse)
        for p, g in zip(self.parameters(), main_grads):
            if g is None:
                continue
            if g.is_meta and not p.is_meta:  # to_empty() of a meta module: no values to copy ("Cannot copy out of
                # meta tensor"); zeros, as at construction
                p.main_grad = _zero_main_grad_of(p)
            else:
                p.main_grad = g.to(device=p.device)
        return self

    @torch.no_grad()
    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        """Normal weights with std 1/sqrt(fan_in) (the router's 0.1/sqrt(H): near-uniform scores at
        first). Drawn on the CPU in fp32 and then rounded, so a seed gives the same bits on any device.
        w1 and w2 are drawn one expert at a time, every expert of the layer in order (a shard keeps its
        own and skips the others' draws): a shard holds the single-device layer's experts, and the draws
        after w1 and w2 (the shared expert's) are the same on every rank."""
        _check_generator(generator)
        if self.router.is_meta:  # no values to hold: the draws (on the CPU) took minutes for a large layer
            return
        h, e, own = self.config.hidden, self.config.experts, self.w1.shape[0]
        begin = self.expert_begin

        def draw(shape) -> Tensor:  # fp32 on the CPU whatever torch's default dtype and device
            return torch.randn(shape, generator=generator, dtype=torch.float32, device="cpu")

        for p, std in ((self.router, 0.1 / math.sqrt(h)), (self.w1, 1 / math.sqrt(h)),
                       (self.w2, 1 / math.sqrt(self.config.intermediate)), (self.shared_w1, 1 / math.sqrt(h)),
                       (self.shared_w2, 1 / math.sqrt(max(self.config.shared_intermediate, 1)))):
            if p is None:
                continue
            if p is self.w1 or p is self.w2:
                for expert in range(e):
                    values = draw(p.shape[1:])
                    if begin <= expert < begin + own:
                        p[expert - begin].copy_(values * std)
            else:
                p.copy_(draw(p.shape) * std)

    def forward(self, x: Tensor, routing: RoutingArg = None, replay: Optional[str] = None,
                return_routing: bool = False, fp8_weights: Optional[Tensor] = None) -> Tensor | tuple[Tensor, Routing]:
        """See mok.functional.moe (x [..., H] bf16 on the module's device; fp8_weights: quantize_weights')."""
        with _group_failures_marked(self.group, x):  # the checks below too, not only _moe's
            return self._forward(x, routing, replay, return_routing, fp8_weights)

    def _forward(self, x: Tensor, routing: RoutingArg, replay: Optional[str], return_routing: bool,
                 fp8_weights: Optional[Tensor]) -> Tensor | tuple[Tensor, Routing]:
        shared = (self.shared_w1, self.shared_w2) if self.shared_w1 is not None else None
        accumulators = None
        if (self.main_grad or self.accumulate_grad) and torch.is_grad_enabled():
            accumulators = self._accumulators(routing_mode(routing, replay)[0] == ROUTING_MODES.index("given"))
        # mok.moe's, its accumulators' errors naming the parameters' .grad or .main_grad (w1.grad, not
        # accumulate_into.w1, which the caller never passed)
        return _moe(x, self.router, self.w1, self.w2, config=self.config, shared=shared, expert_bias=self.expert_bias,
                    routing=routing, replay=replay, ring_rows=self.ring_rows, blocks=self.blocks,
                    recompute=self.recompute, return_routing=return_routing, group=self.group,
                    capacity_rows=self.capacity_rows, fp8_weights=fp8_weights, accumulate_into=accumulators,
                    fp8_weight_gradients=self.fp8_weight_gradients,
                    accumulators_of="main_grad" if self.main_grad else "grad")

    def _accumulators(self, replay_full: bool) -> GradAccumulators:
        """The parameters' main_grad tensors (main_grad) or their .grad (accumulate_grad; zeros where None) as
        mok.moe's accumulate_into; the router's left out when replay="full" reads no router."""

        option = "main_grad" if self.main_grad else "accumulate_grad"

        def into(name: str, p: torch.nn.Parameter) -> Tensor:
            if not p.is_leaf:  # its .grad or main_grad would be a temporary's: the step's gradient lost, silently
                raise ValueError(f"{name} is not a leaf tensor (a parametrization's value, or a tensor "
                                 f"torch.func.functional_call put in): {option} adds its gradient into that "
                                 f"tensor's own {'main_grad' if self.main_grad else '.grad'}, which no parameter "
                                 f"holds; use the module without {option} for such weights")
            if self.main_grad:
                if getattr(p, "main_grad", None) is None:  # a parameter put in after construction (e.g.
                    # load_state_dict(assign=True)): its main_grad starts at zero, as the module's did
                    if torch.compiler.is_compiling():  # made inside the graph, inductor failed on it, naming nothing
                        raise ValueError("main_grad under torch.compile needs every parameter's main_grad made before "
                                         "the compiled call (a parameter put in after construction, e.g. by "
                                         "load_state_dict(assign=True), has none: zero_main_grad() makes it)")
                    p.main_grad = _zero_main_grad_of(p)
                return p.main_grad
            if not p.requires_grad:  # plain autograd would leave its .grad alone
                raise ValueError("accumulate_grad: a parameter does not require grad; the backward would add its "
                                 "gradient into its .grad (freeze none, or use main_grad)")
            if p.grad is None:
                if torch.compiler.is_compiling():  # inductor cannot make a .grad inside the graph
                    raise ValueError("accumulate_grad under torch.compile needs every parameter's .grad made "
                                     "before the compiled call (zeros; optimizer.zero_grad(set_to_none=False) keeps "
                                     "them)")
                p.grad = _zeros_for_grad(p)
            return p.grad

        shared = (into("shared_w1", self.shared_w1), into("shared_w2", self.shared_w2)) if self.shared_w1 is not None \
            else None
        return GradAccumulators(None if replay_full else into("router", self.router), into("w1", self.w1),
                                into("w2", self.w2), shared)

    @torch.no_grad()
    def zero_main_grad(self) -> None:
        """Zeros every parameter's main_grad (main_grad=True), e.g. after the optimizer step that used them, and
        makes those a parameter put in after construction (load_state_dict(assign=True)) lacks."""
        if self.main_grad:
            for p in self.parameters():
                if getattr(p, "main_grad", None) is None:
                    p.main_grad = _zero_main_grad_of(p)
                else:
                    p.main_grad.zero_()

    @torch.no_grad()
    def quantize_weights(self, tokens_per_rank: Optional[int] = None) -> Tensor:
        """The fp8 mode's weights quantized once (mok.quantize_weights), for forward(..., fp8_weights=...)
        and its backward until the next optimizer step changes them (CUDA only). tokens_per_rank: the
        forwards' x tokens / config.ranks (default config.tokens_per_rank); another builds and caches
        another layer."""
        shared = (self.shared_w1, self.shared_w2) if self.shared_w1 is not None else None
        return quantize_weights(self.w1, self.w2, config=self.config, shared=shared, tokens_per_rank=tokens_per_rank,
                                ring_rows=self.ring_rows, blocks=self.blocks, recompute=self.recompute,
                                group=self.group, capacity_rows=self.capacity_rows,
                                fp8_weight_gradients=self.fp8_weight_gradients)

    def extra_repr(self) -> str:
        shard = "" if self.group is None else f", experts [{self.expert_begin}, {self.expert_begin + self.w1.shape[0]})"
        capacity = f", capacity_rows={self.capacity_rows}" if self.capacity_rows else ""
        grads = ", main_grad=True" if self.main_grad else ", accumulate_grad=True" if self.accumulate_grad else ""
        grads += ", fp8_weight_gradients=True" if self.fp8_weight_gradients else ""
        return f"{self.config}, ring_rows={self.ring_rows}, recompute={self.recompute}{shard}{capacity}{grads}"
