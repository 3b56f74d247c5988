"""mok: a deterministic Mixture-of-Experts layer for PyTorch whose results equal the CPU reference bit
for bit, on the CPU (the reference itself) and on Hopper GPUs (the megakernel). docs/python.md."""

try:
    import torch  # noqa: F401  (loads libtorch, which mok._C links against)
except ImportError as e:  # pragma: no cover
    raise ImportError("mok needs PyTorch (pip install torch): its layer is a set of PyTorch operators") from e

from mok import _C, _ops, distributed  # noqa: F401  (_ops registers the fake kernels; the autograd formula is C++)
from mok.capture import capture
from mok.config import MoEConfig
from mok.functional import GradAccumulators, Routing, moe, quantize_weights
from mok.nn import MoE


def check() -> None:
    """Waits for the GPU layers' streams and raises (ValueError) the first error their kernels found:
    a router logit overflow, a given expert id out of range, a watchdog. Without it such an error is
    raised by the layer's next call. A no-op on the CPU, whose ops raise at once."""
    _C.check()


__all__ = [
    "GradAccumulators", "MoE", "MoEConfig", "Routing", "capture", "check", "distributed", "moe", "quantize_weights"
]
