"""Expert parallelism on a torch.distributed NCCL process group (mok.moe / mok.MoE with group=...):
the bits of the single-process layer, each rank holding its tokens and its experts; and data
parallelism over mok.MoE(accumulate_grad=True).

CPU (no GPU needed): the op's launch list with a communicator (the CPU op refuses it, the fake kernels
give the shares' shapes), the NCCL version check, group validation, the sharded MoE's initialisation;
DistributedDataParallel over gloo in two processes reducing accumulate_grad's .grad.
CUDA (marked cuda; skipped without CUDA torch, NCCL or a Hopper GPU): (a) a one-process group in this
process: every output and gradient of mok.moe with the group equals mok.moe's without it; (b) two
processes on two GPUs (skipped with fewer): each rank's rows and expert slices equal a single-process
run's, router and shared-expert gradients equal on both ranks and to the single run's.
"""

import dataclasses
import datetime
import os
import pathlib
import time

import pytest

torch = pytest.importorskip("torch", reason="the mok package needs PyTorch")

import mok  # noqa: E402
from helpers import CONFIGS, GIVEN, REPLAY_IDS, RING_ROWS, ROUTER, assert_same_bits, make_layer  # noqa: E402
from mok.config import LAUNCH_FIELDS, MoEConfig, pack_launch  # noqa: E402

MODES = {"router": ROUTER, "replay_ids": REPLAY_IDS, "given": GIVEN}
WORKER_TIMEOUT_S = 240  # a spawned test's workers' whole run, process group init included; then they are killed


def _dist_skip_reason():
    """Why the GPU tests cannot run here, or None."""
    import torch.distributed as dist

    if torch.version.cuda is None:
        return "torch is a CPU build"
    if not dist.is_available() or not dist.is_nccl_available():
        return "torch has no NCCL backend"
    if not mok._C.HAS_CUDA:
        return "mok._C was built without the GPU ops"
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.cuda.get_device_capability(0) != (9, 0):
        return "no Hopper GPU (compute capability 9.0)"
    return None


def _hopper_gpus():
    n = 0
    while n < torch.cuda.device_count() and torch.cuda.get_device_capability(n) == (9, 0):
        n += 1
    return n


# --- CPU: the op's vocabulary, errors, fake shapes, validation -------------------------------------------


def test_launch_list_carries_the_communicator_and_capacity():
    assert LAUNCH_FIELDS == ("ring_rows", "blocks", "recompute", "comm", "gpus", "capacity_rows",
                             "fp8_weight_gradients")
    assert pack_launch(128, 0, True, comm=1234, gpus=2, capacity_rows=512, fp8_weight_gradients=True) == [
        128, 0, 1, 1234, 2, 512, 1]


def test_cpu_op_refuses_a_communicator():
    layer = make_layer("softmax_shared")
    ints, floats = layer.config.pack()
    with pytest.raises(ValueError, match="runs on the GPU only"):
        torch.ops.mok.forward(*layer.weights(), None, None, ints, floats, ROUTER, pack_launch(128, comm=1, gpus=1))


def test_launch_list_rules():
    layer = make_layer("softmax_shared")
    ints, floats = layer.config.pack()
    with pytest.raises(ValueError, match="gpus = 2 needs a communicator"):
        torch.ops.mok.forward(*layer.weights(), None, None, ints, floats, ROUTER, pack_launch(128, gpus=2))
    with pytest.raises(ValueError, match="is not a multiple of gpus G = 2"):  # ranks R = 1
        torch.ops.mok.forward(*layer.weights(), None, None, ints, floats, ROUTER, pack_launch(128, comm=1, gpus=2))
    with pytest.raises(ValueError, match=r"capacity_rows = 64 \(need 0, or over gpus G > 1"):
        torch.ops.mok.forward(*layer.weights(), None, None, ints, floats, ROUTER, pack_launch(128, capacity_rows=64))


def test_capacity_beyond_the_most_rows_is_refused():
    layer = make_layer("softmax_shared")
    c = dataclasses.replace(layer.config, ranks=2, tokens_per_rank=layer.config.tokens // 2)
    most = c.tokens * min(c.top_k, c.experts // 2)
    with pytest.raises(ValueError, match=rf"capacity_rows = {most + 1} .* \[1, {most}\]"):
        torch.ops.mok.forward(*layer.weights(), None, None, *c.pack(), ROUTER,
                              pack_launch(128, comm=1, gpus=2, capacity_rows=most + 1))


def test_fake_kernels_give_the_shares_shapes():
    """With a communicator of G = 2 the per-token outputs hold N / 2 rows and the expert gradients E / 2
    experts; d_router and the shared expert's gradients stay whole, saved holds this GPU's rows."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    layer = make_layer("softmax_shared")
    c = dataclasses.replace(layer.config, ranks=2, tokens_per_rank=layer.config.tokens // 2)
    n, e, h, i, s, k = c.tokens, c.experts, c.hidden, c.intermediate, c.shared_intermediate, c.top_k
    ints, floats = c.pack()
    launch = pack_launch(128, comm=1, gpus=2)
    with FakeTensorMode():  # CUDA tensors, as a process group's (the CPU op refuses a communicator)
        def bf16(*shape):
            return torch.empty(shape, dtype=torch.bfloat16, device="cuda")

        x, router = bf16(n // 2, h), torch.empty(e, h, device="cuda")
        w1, w2, sw1, sw2 = bf16(e // 2, 2 * i, h), bf16(e // 2, h, i), bf16(2 * s, h), bf16(h, s)
        y, idx, w, logits, saved = torch.ops.mok.forward(x, router, None, w1, w2, sw1, sw2, None, None, ints, floats,
                                                         ROUTER, launch)
        assert [tuple(t.shape) for t in (y, idx, w, logits)] == [(n // 2, h), (n // 2, k), (n // 2, k), (n // 2, e)]
        assert saved.shape[0] == mok._C.saved_bytes(ints, floats, False, 2)  # this GPU's experts' rows
        held = torch.ops.mok.forward(x, router, None, w1, w2, sw1, sw2, None, None, ints, floats, ROUTER,
                                     pack_launch(128, comm=1, gpus=2, capacity_rows=40))[4]
        assert held.shape[0] == mok._C.saved_bytes(ints, floats, False, 2, 40)
        grads = torch.ops.mok.backward(x, router, None, w1, w2, sw1, sw2, idx, w, logits, saved, bf16(n // 2, h),
                                       ints, floats, ROUTER, launch)
        assert [tuple(t.shape) for t in grads] == [(n // 2, h), (n // 2, k), (n // 2, e), (e, h), (e // 2, 2 * i, h),
                                                   (e // 2, h, i), (2 * s, h), (h, s)]


def test_saved_bytes_fall_with_the_capacity():
    """Over G GPUs saved's per-row sections hold capacity_rows rows (plus each expert's last tile's
    padding) instead of the most a routing can give, N min(k, E/G)."""
    c = MoEConfig(experts=16, hidden=64, intermediate=64, top_k=4, ranks=8, tokens_per_rank=256)
    ints, floats = c.pack()
    most, capacity = c.tokens * min(4, 16 // 8), c.tokens * 4 // 8 * 2  # twice the balanced share of G = 8
    assert mok._C.saved_bytes(ints, floats, False, 8, capacity) < mok._C.saved_bytes(ints, floats, False, 8) == \
        mok._C.saved_bytes(ints, floats, False, 8, most)


def test_nccl_versions():
    """mok's NCCL headers are the loaded library's and torch's (a build against torch's nvidia-nccl wheel)."""
    if not mok._C.HAS_CUDA:
        assert mok._C.NCCL_VERSION is None and mok._C.nccl_version() is None
        pytest.skip("mok._C was built without the GPU ops")
    assert mok._C.nccl_version() == mok._C.NCCL_VERSION
    mok.distributed.check_nccl_versions()


def test_a_group_without_nccl_is_refused(tmp_path):
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch without torch.distributed")
    with pytest.raises(ValueError, match="must be a torch.distributed ProcessGroup"):
        mok.distributed.check_group("world", 8)
    if not dist.is_gloo_available():
        pytest.skip("torch without gloo")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        with pytest.raises(ValueError, match="NCCL"):
            mok.distributed.check_group(dist.group.WORLD, 8)
        # release, which the docs ask for after an error, says so too (without a GPU it raised CUDA's "Found no
        # NVIDIA driver", the group never checked)
        with pytest.raises(ValueError, match="group's CUDA backend is ProcessGroupGloo, not NCCL"):
            mok.distributed.release(dist.group.WORLD)
        with pytest.raises(ValueError, match="group must be a torch.distributed ProcessGroup"):
            mok.distributed.release(5)
        # An error inside failures_marked comes out as it went in, whether or not a communicator is found to mark.
        for group in (dist.group.WORLD, None, "not a group"):
            with pytest.raises(KeyError, match="the body's"):
                with mok.distributed.failures_marked(group):
                    raise KeyError("the body's")
    finally:
        dist.destroy_process_group()


class _FakeGroup:
    """What mok.MoE asks of a group once mok.distributed.check_group accepted it."""

    def __init__(self, rank, size):
        self._rank, self._size = rank, size

    def rank(self):
        return self._rank

    def size(self):
        return self._size


@pytest.mark.parametrize("name", ["softmax_shared", "sigmoid_grouped"])
def test_sharded_module_holds_the_single_modules_experts(monkeypatch, name):
    """MoE(group=...) of rank g, seeded alike, holds experts [g E/G, (g+1) E/G) of the single-device MoE
    of that seed, and the same router and shared expert."""
    config = CONFIGS[name][0]
    gpus = 2
    monkeypatch.setattr(mok.distributed, "check_group", lambda group, experts, ranks=1: group.size())
    whole = mok.MoE(config, generator=torch.Generator().manual_seed(5))
    own = config.experts // gpus
    for rank in range(gpus):
        shard = mok.MoE(config, generator=torch.Generator().manual_seed(5), group=_FakeGroup(rank, gpus))
        assert shard.expert_begin == rank * own
        for pname, p in whole.named_parameters():
            q = getattr(shard, pname)
            want = p[rank * own:(rank + 1) * own] if pname in ("w1", "w2") else p
            assert_same_bits(q.detach(), want.detach(), pname)


# --- CUDA ------------------------------------------------------------------------------------------------


def replay_routing(config, tokens):
    """A routing to replay: distinct ids per token, positive weights, from fixed seeds."""
    t = torch.arange(tokens)[:, None]
    j = torch.arange(config.top_k)[None, :]
    idx = ((3 * t + j) % config.experts).to(torch.int32)
    w = torch.rand(tokens, config.top_k, generator=torch.Generator().manual_seed(3)) + 0.1
    return idx.contiguous(), w.contiguous()


def run_layer(layer, mode, device, group=None, token_rows=None, experts=None):
    """mok.moe under autograd on `device`: y, the routing and every gradient, on the CPU. token_rows and
    experts select this rank's share of the whole layer's tensors (slices), all of them by default."""
    c = layer.config
    token_rows = token_rows or slice(0, c.tokens)
    experts = experts or slice(0, c.experts)

    def leaf(t, rows=None):
        if t is None:
            return None
        t = (t[rows] if rows is not None else t).contiguous().to(device)
        return t.requires_grad_() if t.is_floating_point() else t

    x, router, w1, w2 = leaf(layer.x, token_rows), leaf(layer.router), leaf(layer.w1, experts), leaf(layer.w2, experts)
    shared = (leaf(layer.shared_w1), leaf(layer.shared_w2)) if layer.shared_w1 is not None else None
    bias = layer.expert_bias.to(device) if layer.expert_bias is not None else None
    routing = None
    if mode != ROUTER:
        idx, w = replay_routing(c, c.tokens)
        idx, w = leaf(idx, token_rows), leaf(w, token_rows)
        routing = idx if mode == REPLAY_IDS else (idx, w)
    y, r = mok.moe(x, router, w1, w2, config=c, shared=shared,
                   expert_bias=bias, routing=routing, ring_rows=128, return_routing=True, group=group)
    y.backward(layer.dy[token_rows].contiguous().to(device))
    mok.check()
    out = dict(y=y, topk_idx=r.topk_idx, topk_w=r.topk_w, logits=r.logits, dx=x.grad, d_router=router.grad,
               d_w1=w1.grad, d_w2=w2.grad)
    if shared is not None:
        out.update(d_shared_w1=shared[0].grad, d_shared_w2=shared[1].grad)
    if mode == GIVEN:
        out["d_topk_w"] = routing[1].grad
    return {k: (v.detach().cpu() if v is not None else None) for k, v in out.items()}


def assert_same_results(got, want, what, absent=()):
    """run_layer's results bit for bit; absent: the outputs the problem lacks (absent_outputs)."""
    assert got.keys() == want.keys(), what
    for k in want:
        assert (got[k] is None) == (want[k] is None), f"{what}: {k}"
        if want[k] is not None:
            assert_same_bits(got[k], want[k], f"{what}: {k}", absent=k in absent)


@pytest.fixture(scope="module")
def one_rank_group(tmp_path_factory):
    """A one-process NCCL group on cuda:0 in this process (its communicator created eagerly)."""
    reason = _dist_skip_reason()
    if reason:
        pytest.skip(reason)
    import torch.distributed as dist

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda", 0),
                            timeout=datetime.timedelta(seconds=60))
    group = dist.group.WORLD
    yield group
    mok.distributed.release(group)
    dist.destroy_process_group()


@pytest.mark.cuda
@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
@pytest.mark.parametrize("name", CONFIGS)
def test_one_rank_group_gives_the_bits_without_it(one_rank_group, name, mode):
    layer = make_layer(name)
    want = run_layer(layer, mode, "cuda:0")
    got = run_layer(layer, mode, "cuda:0", group=one_rank_group)
    assert_same_results(got, want, f"{name}/{mode}", layer.absent_outputs(mode))


@pytest.mark.cuda
def test_one_rank_group_module_and_errors(one_rank_group):
    config = CONFIGS["sigmoid_grouped"][0]
    x = torch.randn(24, config.hidden, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).cuda()
    single = mok.MoE(config, device="cuda", generator=torch.Generator().manual_seed(2))
    grouped = mok.MoE(config, device="cuda", generator=torch.Generator().manual_seed(2), group=one_rank_group)
    for p, q in zip(single.parameters(), grouped.parameters()):
        assert_same_bits(q.detach(), p.detach())
    assert_same_bits(grouped(x), single(x), "y")
    with pytest.raises(ValueError, match="runs on its GPU"):
        grouped(x.cpu())
    mok.check()
    with pytest.raises(RuntimeError, match=r"call mok\.distributed\.release\(group\)"):  # MoE's error marked it
        grouped(x)
    mok.distributed.release(one_rank_group)  # after an error, as every rank must
    assert_same_bits(grouped(x), single(x), "y after the release")


@pytest.mark.cuda
def test_a_rank_whose_call_failed_is_refused_until_it_releases(one_rank_group):
    """A call that fails on a rank may leave its layers a launch behind their peers': its next call on the group
    is refused, naming mok.distributed.release, until the release; then the layer gives the bits of a call
    without the group. The error raised by a kernel (mok.check(): a router overflowing its logits) marks the
    group, and so does one raised in Python before the op (a capacity on a group of one GPU)."""
    layer = make_layer("softmax_shared")
    want = run_layer(layer, ROUTER, "cuda:0")
    x, router, w1, w2 = (t.to("cuda:0") for t in (layer.x, layer.router, layer.w1, layer.w2))
    shared = (layer.shared_w1.to("cuda:0"), layer.shared_w2.to("cuda:0"))

    def call(router=router, **kwargs):
        return mok.moe(x, router, w1, w2, config=layer.config, shared=shared, ring_rows=128, group=one_rank_group,
                       **kwargs)

    failures = [(lambda: (call(router=torch.full_like(router, 3e38)), mok.check()), ValueError, "overflow"),
                (lambda: call(capacity_rows=64), ValueError, "on a group of one GPU")]
    for fail, error, message in failures:
        with pytest.raises(error, match=message):
            fail()
        with pytest.raises(RuntimeError, match=r"call mok\.distributed\.release\(group\) on every rank"):
            call()
        mok.distributed.release(one_rank_group)
        assert_same_results(run_layer(layer, ROUTER, "cuda:0", group=one_rank_group), want, message)


def _worker(rank, world, store_path, out_dir):
    """One rank of test (b): its share of every config and mode, and a sharded module's output."""
    import torch.distributed as dist

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("nccl", store=store, rank=rank, world_size=world, device_id=torch.device("cuda", rank),
                            timeout=datetime.timedelta(seconds=60))
    group = dist.group.WORLD
    device = f"cuda:{rank}"
    results = {}
    for name in CONFIGS:
        layer = make_layer(name)
        n, e = layer.config.tokens // world, layer.config.experts // world
        for mode_name, mode in MODES.items():
            results[(name, mode_name)] = run_layer(layer, mode, device, group, slice(rank * n, (rank + 1) * n),
                                                   slice(rank * e, (rank + 1) * e))
    config = CONFIGS["sigmoid_grouped"][0]
    module = mok.MoE(config, device=device, generator=torch.Generator().manual_seed(2), group=group)
    x = torch.randn(24, config.hidden, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.no_grad():
        results["module"] = dict(w1=module.w1.cpu(), y=module(x[rank * 12:(rank + 1) * 12].to(device)).cpu())
    mok.check()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    mok.distributed.release(group)
    dist.destroy_process_group()


def _poisoned(rank, worker, world, *args):
    """worker(rank, world, *args) with the GPU ops' outputs poisoned, as conftest.py does in the test process."""
    mok._C._set_poison_outputs(True)
    worker(rank, world, *args)


def _run_ranks(worker, world, *args):
    """worker(rank, world, *args) in `world` spawned processes; the test fails (and they are killed) past
    WORKER_TIMEOUT_S."""
    import torch.multiprocessing as mp

    context = mp.start_processes(_poisoned, args=(worker, world, *args), nprocs=world, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    try:
        while not context.join(timeout=5):
            if time.monotonic() > deadline:
                pytest.fail(f"the ranks did not finish within {WORKER_TIMEOUT_S} s")
    finally:
        for p in context.processes:
            if p.is_alive():
                p.kill()


def _ddp_worker(rank, world, store_path, out_dir):
    """One rank of the DDP test: mok.MoE(accumulate_grad=True) and a plain mok.MoE with zeroed .grad, each
    under DistributedDataParallel over gloo, a step on this rank's tokens; saves each one's .grad."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    layer = make_layer("softmax_shared")
    x = make_layer("softmax_shared", seed=rank + 1).x
    grads = {}
    for accumulate in (True, False):
        model = mok.MoE(layer.config, ring_rows=RING_ROWS, generator=torch.Generator().manual_seed(5),
                        accumulate_grad=accumulate)
        nones = []  # per parameter hook call: whether autograd's gradient was None (the accumulate path)
        for p in model.parameters():
            p.register_hook(lambda g: nones.append(g is None))
            if not accumulate:
                p.grad = torch.zeros_like(p)
        ddp = torch.nn.parallel.DistributedDataParallel(model)  # alive through the backward: its hooks reduce
        (ddp(x).float() * layer.dy.float()).sum().backward()
        assert nones and all(n == accumulate for n in nones)
        grads[accumulate] = {name: p.grad for name, p in model.named_parameters()}
    torch.save(grads, os.path.join(out_dir, f"ddp{rank}.pt"))
    dist.destroy_process_group()


def test_ddp_reduces_accumulate_grad_as_it_reduces_autograds(tmp_path):
    """DistributedDataParallel (gloo, two CPU processes) reduces the .grad that mok.MoE(accumulate_grad=True)
    adds into, as it reduces autograd's (its post-accumulate hooks run): on both ranks the bits of plain
    DDP over zeroed .grad, the same on both, and not a rank's own gradient."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch without gloo")
    world = 2
    _run_ranks(_ddp_worker, world, str(tmp_path / "store"), str(tmp_path))
    ranks = [torch.load(tmp_path / f"ddp{r}.pt", weights_only=False) for r in range(world)]
    layer = make_layer("softmax_shared")
    alone = mok.MoE(layer.config, ring_rows=RING_ROWS, generator=torch.Generator().manual_seed(5),
                    accumulate_grad=True)
    (alone(make_layer("softmax_shared", seed=1).x).float() * layer.dy.float()).sum().backward()
    for name, p in alone.named_parameters():
        for r, grads in enumerate(ranks):
            assert_same_bits(grads[True][name], grads[False][name], f"{name}, rank {r}")
            assert_same_bits(grads[True][name], ranks[0][True][name], f"{name}, rank {r} against rank 0")
        assert not torch.equal(ranks[0][True][name], p.grad), f"{name}: rank 0's own, not reduced"


@pytest.mark.cuda
def test_two_ranks_give_the_single_process_bits(tmp_path):
    reason = _dist_skip_reason()
    if reason:
        pytest.skip(reason)
    if _hopper_gpus() < 2:
        pytest.skip("needs 2 Hopper GPUs")
    world = 2
    _run_ranks(_worker, world, str(tmp_path / "store"), str(tmp_path))
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]

    for name in CONFIGS:
        layer = make_layer(name)
        n, e = layer.config.tokens // world, layer.config.experts // world
        for mode_name, mode in MODES.items():
            want = run_layer(layer, mode, "cuda:0")
            for r, results in enumerate(ranks):
                got = results[(name, mode_name)]
                what = f"{name}/{mode_name} rank {r}"
                absent = layer.absent_outputs(mode)
                assert got.keys() == want.keys(), what
                for k, v in want.items():
                    if v is None:
                        assert got[k] is None, f"{what}: {k}"
                    elif k in ("d_w1", "d_w2"):
                        assert_same_bits(got[k], v[r * e:(r + 1) * e], f"{what}: {k}")
                    elif k in ("d_router", "d_shared_w1", "d_shared_w2"):  # whole on every rank
                        assert_same_bits(got[k], v, f"{what}: {k}", absent=k in absent)
                    else:  # per token: this rank's rows
                        assert_same_bits(got[k], v[r * n:(r + 1) * n], f"{what}: {k}", absent=k in absent)

    config = CONFIGS["sigmoid_grouped"][0]
    single = mok.MoE(config, device="cuda:0", generator=torch.Generator().manual_seed(2))
    x = torch.randn(24, config.hidden, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).cuda()
    with torch.no_grad():
        y = single(x).cpu()
    e = config.experts // world
    for r, results in enumerate(ranks):
        assert_same_bits(results["module"]["w1"], single.w1.detach().cpu()[r * e:(r + 1) * e], f"module w1 rank {r}")
        assert_same_bits(results["module"]["y"], y[r * 12:(r + 1) * 12], f"module y rank {r}")
