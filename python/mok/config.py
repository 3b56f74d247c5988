"""The layer's configuration (mok::LayerConfig) and its packing into the ops' argument lists.

The field names and their order come from the extension (mok._C.CONFIG_INT_FIELDS, ...), which is the
one place that lists them; MoEConfig must name the same fields, checked at import.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import numbers
import sys
from dataclasses import dataclass

import torch

from mok import _C

INT_FIELDS: tuple[str, ...] = tuple(_C.CONFIG_INT_FIELDS)
FLOAT_FIELDS: tuple[str, ...] = tuple(_C.CONFIG_FLOAT_FIELDS)
LAUNCH_FIELDS: tuple[str, ...] = tuple(_C.LAUNCH_FIELDS)
ROUTING_MODES: tuple[str, ...] = tuple(_C.ROUTING_MODES)  # index = the op's routing_mode
SCORE_MODES: tuple[str, ...] = tuple(_C.SCORE_MODES)
PRECISIONS: tuple[str, ...] = tuple(_C.PRECISIONS)

DEFAULT_RING_ROWS = 0  # the layer's default ring: an average rank's rows (mok::gpu::LaunchConfig)


def _require_bool(name: str, value) -> None:
    """A flag packed as an int: int() would take 2, and fail on "yes" naming no field. A bool or a
    numpy.bool_ (a flag read from an array or an HDF5 attribute); not 1 or 1.0, which equal True but say
    nothing of a flag (an argument in the wrong place, say)."""
    if isinstance(value, bool):
        return
    numpy = sys.modules.get("numpy")  # a numpy.bool_ exists only once numpy is imported: no import here
    if numpy is None or not isinstance(value, numpy.bool_):
        raise ValueError(f"{name} must be a bool, got {value!r}")


def _require_int(name: str, value) -> None:
    """An integer packed as an int: int() would truncate 4.9 to 4 without a word, fail on "4" naming no
    field, and take True as 1 (experts=True: one expert?)."""
    if name == "tokens_per_rank" and isinstance(value, (torch.SymInt, torch.Tensor)):  # torch.export's Dim, jit.trace
        raise ValueError(f"{name} must be an integer, got {value!r}: a symbolic or traced size. mok's ops take the "
                         "token count as a constant (in their config_ints), so x's token dimension cannot be dynamic "
                         "in torch.export or torch.jit.trace (torch.compile compiles a graph for each token count)")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not -(2**63) <= value < 2**63:  # the ops' int lists are int64: torch's error past it names no field
        raise ValueError(f"{name} = {value} is outside the 64-bit integer range of the ops' arguments")


def _require_real(name: str, value) -> None:
    """A number packed as a float: float() would take "2.5" and fail on None; a bool is no number, as it is
    no integer."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:  # an integer (or a Fraction) past float64's range: float() raised OverflowError, naming no field
        float(value)
    except OverflowError:
        # "an integer" said of Fraction(10**400, 3) too: say what the value is
        what = "an integer" if isinstance(value, numbers.Integral) else f"a {type(value).__name__}"
        raise ValueError(f"{name} must be a finite number, got {what} too large for a float") from None


def _require_list(name: str, values, fields: tuple[str, ...], require_element) -> None:
    """One of the ops' lists (config_ints, config_floats) handed to mok._C: a list, a tuple (any sequence
    but a str) or a numpy array, as mok._C takes, each element checked by require_element under its index
    and field. Another type (a str, None, a dict) or an element mok._C cannot convert (2.5 among the ints,
    "x" among the floats) raised pybind11's TypeError ("check_config(): incompatible function arguments"),
    naming no argument."""
    numpy = sys.modules.get("numpy")  # an array exists only once numpy is imported: no import here
    is_array = numpy is not None and isinstance(values, numpy.ndarray)
    if not is_array and (isinstance(values, (str, bytes)) or not isinstance(values, collections.abc.Sequence)):
        raise ValueError(f"{name} must be a list or tuple, got {type(values).__name__}")
    for i, value in enumerate(values):
        require_element(f"{name}[{i}]" + (f" ({fields[i]})" if i < len(fields) else ""), value)


@dataclass(frozen=True)
class MoEConfig:
    """One MoE layer: shapes and routing rules (docs/python.md).

    tokens_per_rank is the number of tokens of one call per rank; mok.functional.moe sets it from x,
    so a config describes a layer whatever the batch. ranks > 1 simulates expert-parallel ranks on
    one device (the same bits for every ranks, a test of the layer's determinism). With a
    torch.distributed process group of G processes (mok.moe(..., group=...)), ranks counts the ranks of
    each GPU: the layer has G * ranks of them.
    """

    experts: int
    hidden: int  # a multiple of 64
    intermediate: int  # a multiple of 64
    top_k: int
    ranks: int = 1
    tokens_per_rank: int = 1
    score_mode: str = "softmax"  # or "sigmoid" (DeepSeek-V3: group-limited, bias, routed_scale)
    renormalize: bool = True  # divide the selected weights by their sum
    n_group: int = 1
    topk_group: int = 1
    routed_scale: float = 1.0  # sigmoid mode; stored as float32
    swiglu_limit: float = 0.0  # > 0: clamped SwiGLU; stored as float32
    shared_intermediate: int = 0  # > 0: a shared expert of this intermediate size
    # "fp8": the expert GEMMs on E4M3 operands in blocks with power-of-two scales (docs/numerics.md;
    # hidden, intermediate and shared_intermediate multiples of 128). The GPU op runs both passes.
    precision: str = "bf16"

    def __post_init__(self) -> None:
        for name in INT_FIELDS:
            value = getattr(self, name)
            if name in ("score_mode", "precision"):  # names, checked below
                continue
            if name == "renormalize":
                _require_bool(name, value)
            else:
                _require_int(name, value)
        for name in FLOAT_FIELDS:
            _require_real(name, getattr(self, name))
        if self.ranks < 1:  # the tokens are split over the ranks before any op checks the config
            raise ValueError(f"ranks = {self.ranks} (need >= 1)")
        if self.score_mode not in SCORE_MODES:
            raise ValueError(f"score_mode must be one of {SCORE_MODES}, got {self.score_mode!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")

    def pack(self, tokens_per_rank: int | None = None, ranks: int | None = None) -> tuple[list[int], list[float]]:
        """(config_ints, config_floats) for the ops, optionally with another tokens_per_rank or ranks."""
        values = {name: getattr(self, name) for name in INT_FIELDS}
        values["score_mode"] = SCORE_MODES.index(self.score_mode)
        values["precision"] = PRECISIONS.index(self.precision)
        if tokens_per_rank is not None:  # checked as the fields are: int() would truncate 2.5 to 2
            _require_int("tokens_per_rank", tokens_per_rank)
            values["tokens_per_rank"] = tokens_per_rank
        if ranks is not None:
            _require_int("ranks", ranks)
            values["ranks"] = ranks
        return [int(values[name]) for name in INT_FIELDS], [float(getattr(self, name)) for name in FLOAT_FIELDS]

    @classmethod
    def unpack(cls, config_ints: list[int], config_floats: list[float]) -> MoEConfig:
        """The config the ops' lists describe (ValueError, as a call's, for lists no call takes: a short list
        raised KeyError, a score_mode of 5 IndexError)."""
        _require_list("config_ints", config_ints, INT_FIELDS, _require_int)
        _require_list("config_floats", config_floats, FLOAT_FIELDS, _require_real)
        _C.check_config(config_ints, config_floats)
        values: dict = dict(zip(INT_FIELDS, config_ints))
        values.update(zip(FLOAT_FIELDS, config_floats))
        values["score_mode"] = SCORE_MODES[values["score_mode"]]
        values["precision"] = PRECISIONS[values["precision"]]
        values["renormalize"] = bool(values["renormalize"])
        return cls(**values)

    @property
    def tokens(self) -> int:
        return self.ranks * self.tokens_per_rank

    def tokens_per_rank_of(self, tokens: int) -> int:
        """T for a call of `tokens` tokens, which must split evenly over the ranks."""
        if tokens == 0:  # else the op names tokens_per_rank = 0, which the caller never set
            raise ValueError("x has no tokens: a call needs at least one (x [..., H] with no zero dimension)")
        if tokens % self.ranks:
            raise ValueError(f"{tokens} tokens do not split over ranks = {self.ranks}")
        return tokens // self.ranks


def pack_launch(ring_rows: int = DEFAULT_RING_ROWS, blocks: int = 0, recompute: bool = False, comm: int = 0,
                gpus: int = 1, capacity_rows: int = 0, fp8_weight_gradients: bool = False) -> list[int]:
    """The ops' launch list: ring rows per rank (0: the layer's default, else a multiple of 128; no bit
    depends on it), persistent blocks per GPU (0: all that fit; the CPU ignores it), recompute (saved
    holds the dispatch layout alone, the backward pulls x and recomputes h and a, the shared expert's
    too: less memory between the passes, the same bits), and the communicator of an expert-parallel call:
    comm, an ncclComm_t as an integer (0: none), gpus, its size G (mok.distributed: the call is then this GPU's
    share of the layer), and capacity_rows, the routed rows each GPU's experts can hold (0: the most any routing
    gives them; only over G > 1); fp8_weight_gradients: the fp8 mode's routed-expert weight gradients on E4M3
    operands too (other bits than the default bf16 ones; docs/accuracy.md, "FP8 weight gradients")."""
    values = {"ring_rows": ring_rows, "blocks": blocks, "recompute": recompute, "comm": comm, "gpus": gpus,
              "capacity_rows": capacity_rows, "fp8_weight_gradients": fp8_weight_gradients}
    for name, value in values.items():
        if name in ("recompute", "fp8_weight_gradients"):
            _require_bool(name, value)
        else:
            _require_int(name, value)
    return [int(values[name]) for name in LAUNCH_FIELDS]


def launch_field(launch, name: str) -> int:
    """One field of an op's launch list, by name."""
    return launch[LAUNCH_FIELDS.index(name)]


def _check_vocabulary() -> None:
    ours = {f.name for f in dataclasses.fields(MoEConfig)}
    theirs = set(INT_FIELDS) | set(FLOAT_FIELDS)
    if ours != theirs:
        raise ImportError(f"mok.MoEConfig's fields {sorted(ours ^ theirs)} disagree with mok._C's LayerConfig fields")


_check_vocabulary()
