"""Expert parallelism on a torch.distributed process group (docs/python.md, "torch.distributed").

One process per GPU, each with its own tokens and its shard of the experts: mok.moe(..., group=pg) and
mok.MoE(..., group=pg) build the device API's Layer on the group's own NCCL communicator
(mok::gpu::Layer(config, launch, ncclComm_t), docs/multi-gpu.md, "Device API"); no second communicator
is made. The communicator must exist when the layer is first called: init_process_group(...,
device_id=torch.device("cuda", local_rank)) creates it eagerly (else run one collective on the group
first).
"""

from __future__ import annotations

import contextlib
import functools

import torch

from mok import _C


def _version_text(code: int) -> str:
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


@functools.cache
def check_nccl_versions() -> None:
    """Raises RuntimeError unless mok was built against the NCCL that torch uses: the headers mok was
    compiled with (mok._C.NCCL_VERSION) must be the version of the library loaded in this process
    (mok._C.nccl_version(), torch's libnccl.so.2) and the one torch was built against
    (torch.cuda.nccl.version()). A communicator is an object of one library; mok's kernels compile
    NCCL's device API from its headers."""
    if not _C.HAS_CUDA:
        raise RuntimeError("mok was built without its GPU ops: a process group's layer runs on the GPU")
    built, loaded = _C.NCCL_VERSION, _C.nccl_version()
    torch_built = tuple(torch.cuda.nccl.version()[:3])
    fix = ("rebuild mok against torch's NCCL: configure with -DMOK_TORCH=ON and the Python of this torch, "
           "whose nvidia-nccl wheel the build then uses (cmake/TorchNccl.cmake)")
    if loaded != built:
        raise RuntimeError(f"mok was built against NCCL {_version_text(built)} but this process runs NCCL "
                           f"{_version_text(loaded)} (torch's libnccl.so.2): {fix}")
    if torch_built != (built // 10000, built // 100 % 100, built % 100):
        raise RuntimeError(f"mok was built against NCCL {_version_text(built)} but torch against "
                           f"{'.'.join(map(str, torch_built))}: {fix}")


def _nccl_backend(group):
    """The group's NCCL backend for CUDA tensors, or ValueError naming what the group is."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_nccl_available():
        raise ValueError("group: this torch has no torch.distributed NCCL backend")
    if not isinstance(group, dist.ProcessGroup):
        raise ValueError(f"group must be a torch.distributed ProcessGroup (e.g. dist.group.WORLD after "
                         f"init_process_group), got {type(group).__name__}")
    try:
        backend = group._get_backend(torch.device("cuda"))
    except RuntimeError as e:
        raise ValueError(f"group has no backend for CUDA tensors (mok needs NCCL): {e}") from None
    if not isinstance(backend, dist.ProcessGroupNCCL):
        raise ValueError(f"group's CUDA backend is {type(backend).__name__}, not NCCL: mok runs on a process "
                         f"group's NCCL communicator (init_process_group(backend='nccl', ...))")
    return backend


def _checked(group, experts: int, ranks: int):
    backend = _nccl_backend(group)
    check_nccl_versions()
    gpus = group.size()
    if experts % (gpus * ranks):
        raise ValueError(f"experts E = {experts} do not split over the group's {gpus} GPUs"
                         + (f" x ranks = {ranks} per GPU" if ranks > 1 else "")
                         + " (each GPU holds E / G experts)")
    return backend, gpus


def check_group(group, experts: int, ranks: int = 1) -> int:
    """Validates a process group for a layer of `experts` experts and `ranks` ranks per GPU; returns its
    size G. ValueError for a group without NCCL or experts that do not split over G * ranks ranks;
    RuntimeError for mismatched NCCL versions (check_nccl_versions)."""
    return _checked(group, experts, ranks)[1]


def communicator(group, device: torch.device, experts: int, ranks: int = 1) -> tuple[int, int]:
    """(comm, G): the group's NCCL communicator on `device` (an ncclComm_t as an integer, the op's
    launch field comm) and the group's size, after check_group's checks. ValueError when x is not on the
    group's CUDA device or the communicator does not exist yet."""
    backend, gpus = _checked(group, experts, ranks)
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"x is on {device}: a process group's layer runs on its GPU (cuda)")
    bound = getattr(group, "bound_device_id", None)
    if bound is not None and bound != device:
        raise ValueError(f"x is on {device} but the process group is bound to {bound}: each process runs its "
                         f"share on the group's device")
    comm = _comm_on(backend, device)
    if not comm:
        raise ValueError(f"the process group has no NCCL communicator on {device} yet: create it eagerly with "
                         f"init_process_group(..., device_id=torch.device('cuda', local_rank)), or run one "
                         f"collective on the group first")
    _C.register_communicator(comm)
    return comm, gpus


def _comm_on(backend, device) -> int:
    """The backend's communicator on `device` (an ncclComm_t as an integer), 0 when not created yet."""
    with torch.cuda.device(device):
        return backend._comm_ptr()


def _comm_of(group, device=None) -> int:
    """The group's communicator on its bound device, else on `device`, else on the current one. The group is
    checked first (a gloo group's release raised CUDA's "Found no NVIDIA driver" where there is no GPU)."""
    backend = _nccl_backend(group)
    bound = getattr(group, "bound_device_id", None)
    if bound is not None:
        device = bound
    elif device is None:  # `is None`: device 0 is a device
        device = torch.device("cuda", torch.cuda.current_device())
    return _comm_on(backend, device)


def release(group, device=None) -> None:
    """Destroys mok's layers cached on the group's communicator (after waiting for their GPU's work).
    Collective, like their construction: call it on every rank at the same point, with no layer call in
    flight, before torch.distributed.destroy_process_group(group) (a layer's window is registered on the
    communicator, which must outlive it), and after an error on any rank (the layers of a rank whose call
    failed may be a launch behind their peers': its calls on the group are refused until it releases).
    device: the GPU whose communicator, for a group bound to none (default: the current device)."""
    comm = _comm_of(group, device)
    if comm:
        _C.release(comm)


@contextlib.contextmanager
def failures_marked(group, device=None):
    """Marks the group's communicator on `device` (as release finds it) when the body raises
    (mok._C.mark_failed), so that this rank's next call on it is refused until release(group): a call
    refused before its layer ran (here, or by the op) took no launch numbers, and the layers would stay a
    launch behind their peers'. A no-op without a group."""
    try:
        yield
    except BaseException:
        try:
            comm = _comm_of(group, device) if group is not None and _C.HAS_CUDA else 0
        except Exception:  # not a usable NCCL group (or no CUDA): no layer of it exists
            comm = 0
        if comm:
            _C.mark_failed(comm)
        raise
