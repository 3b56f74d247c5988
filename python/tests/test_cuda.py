"""The ops on the GPU (the megakernel): the CPU op's bits, opcheck, CUDA graphs, streams, torch.compile,
errors, capture, training. Skipped without a CUDA device or without mok's GPU ops."""

import dataclasses

import pytest

torch = pytest.importorskip("torch", reason="the mok package needs PyTorch")

import mok  # noqa: E402
import test_autograd  # noqa: E402
import test_capture  # noqa: E402
import test_errors  # noqa: E402
import test_training  # noqa: E402
from helpers import (CONFIGS, FORWARD_OUTPUTS, GIVEN, GRADIENTS, REPLAY_IDS, RING_ROWS, ROUTER,  # noqa: E402
                     assert_all_same_bits, assert_same_bits, cuda_available, make_layer)
from mok.config import pack_launch  # noqa: E402
from test_autograd import fp8_models  # noqa: E402

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device and mok built with its GPU ops")]

MODES = {"router": ROUTER, "replay_ids": REPLAY_IDS, "given": GIVEN}


def routing_for(layer, mode):
    """The replay modes' input: the router's routing with ids rolled by one slot."""
    if mode == ROUTER:
        return None, None
    _, idx, w, _, _ = layer.forward()
    return idx.roll(1, dims=1).contiguous(), (w if mode == GIVEN else None)


def both(layer, mode):
    """Forward and backward outputs of the CPU op and of the CUDA op (copied to the CPU)."""
    idx, w = routing_for(layer, mode)
    cpu = layer.forward(mode, idx, w)
    gpu_layer = layer.to("cuda")
    gpu = gpu_layer.forward(mode, *(t.cuda() if t is not None else None for t in (idx, w)))
    cpu_grads, gpu_grads = layer.backward(cpu, mode), gpu_layer.backward(gpu, mode)
    mok.check()
    return (cpu, cpu_grads), ([t.cpu() for t in gpu], [t.cpu() for t in gpu_grads])


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
@pytest.mark.parametrize("name", CONFIGS)
def test_gpu_bits_are_the_cpu_bits(name, mode):
    layer = make_layer(name)
    (cpu, cpu_grads), (gpu, gpu_grads) = both(layer, mode)
    absent = layer.absent_outputs(mode)
    assert_all_same_bits(gpu[:4], cpu[:4], FORWARD_OUTPUTS, absent)
    assert_all_same_bits(gpu_grads, cpu_grads, GRADIENTS, absent)
    # saved is compared through its reader (its alignment gaps and spare rows are not specified):
    # the GPU's saved buffer drives the CPU backward to the same bits.
    assert_all_same_bits(layer.backward(tuple(gpu), mode), cpu_grads, GRADIENTS, absent)
    # The fp32 weight gradients behind the bf16 ones.
    gpu_fp32 = layer.to("cuda").backward_float32(tuple(t.cuda() for t in gpu), mode)
    assert_all_same_bits([t.cpu() for t in gpu_fp32], layer.backward_float32(cpu, mode), GRADIENTS, absent)


def test_given_routing_is_copied_by_the_kernel():
    """A given routing is read from the caller's tensors (no copy on the host): the outputs are new
    tensors holding its bits, the inputs stay as they were."""
    layer = make_layer("softmax_shared")
    idx, w = (t.cuda() for t in routing_for(layer, GIVEN))
    kept_idx, kept_w = idx.clone(), w.clone()
    _, out_idx, out_w, _, _ = layer.to("cuda").forward(GIVEN, idx, w)
    mok.check()
    assert out_idx.data_ptr() != idx.data_ptr() and out_w.data_ptr() != w.data_ptr()
    assert_all_same_bits([out_idx, out_w, idx, w], [kept_idx, kept_w, kept_idx, kept_w],
                         ["topk_idx", "topk_w", "given topk_idx", "given topk_w"])


def test_cpu_saved_feeds_the_gpu_backward():
    layer = make_layer("softmax_shared")
    cpu = layer.forward()
    gpu_layer = layer.to("cuda")
    grads = gpu_layer.backward(tuple(t.cuda() for t in cpu))
    assert_all_same_bits([g.cpu() for g in grads], layer.backward(cpu), GRADIENTS)


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_opcheck(mode):
    layer = make_layer("softmax_shared").to("cuda")
    idx, w = (t.cuda() if t is not None else None for t in routing_for(make_layer("softmax_shared"), mode))
    torch.library.opcheck(torch.ops.mok.forward.default, (*layer.weights(), idx, w, *layer.op_args(mode)))
    _, topk_idx, topk_w, logits, saved = layer.forward(mode, idx, w)
    args = (*layer.weights(), topk_idx, topk_w, logits, saved, layer.dy)
    torch.library.opcheck(torch.ops.mok.backward.default, (*args, *layer.op_args(mode)))


def scratch_fits_layer():
    """A layer whose storing backward's scratch fits in its d_w1 (test_backward_scratch_in_d_w1_gives_the_cpus_bits
    checks the sizes)."""
    return make_layer("softmax_shared", tokens=80, experts=8, hidden=256, intermediate=256, top_k=3,
                      shared_intermediate=128)


def test_backward_keeps_saved_and_backward_consuming_writes_it():
    """mok::backward writes no input: saved keeps its bits (its scratch lies in its own d_w1, where it fits), so
    it can run again; mok::backward_consuming (autograd's) writes dh over saved's h and moves its version, with
    the same outputs."""
    layer = scratch_fits_layer().to("cuda")
    _, idx, w, logits, saved = layer.forward()
    before = saved.clone()
    args = (*layer.weights(), idx, w, logits, saved, layer.dy, *layer.op_args())
    kept = torch.ops.mok.backward(*args)
    assert torch.equal(saved, before)
    version = saved._version
    consumed = torch.ops.mok.backward_consuming(*args)
    assert saved._version > version and not torch.equal(saved, before)
    assert_all_same_bits(list(consumed), list(kept), GRADIENTS)


def test_accumulate_matches_cpu():
    layer = make_layer("softmax_shared")
    results = []
    for l in (layer, layer.to("cuda")):
        _, topk_idx, topk_w, logits, saved = l.forward()
        acc = [torch.ones(g.shape, device=l.x.device) * 0.5 for g in l.backward(l.forward())[3:]]
        outs = torch.ops.mok.backward_accumulate(*l.weights(), topk_idx, topk_w, logits, saved, l.dy, *acc,
                                                 *l.op_args())
        results.append([t.cpu() for t in (*outs, *acc)])
    assert_all_same_bits(results[1], results[0])


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_accumulate_into_on_gpu_is_the_cpus(mode):
    test_autograd.accumulate_two_micro_batches("softmax_shared", mode, "cuda")


@pytest.mark.parametrize("mode", (ROUTER, GIVEN), ids=("router", "given"))
def test_accumulate_into_compiles_fullgraph_on_gpu(mode):
    """Compiled (fullgraph) on the GPU, accumulate_into adds the CPU's gradients (the eager call's alignment
    check read data_ptr, which Dynamo cannot trace)."""
    compiled = torch.compile(mok.moe, fullgraph=True)
    test_autograd.accumulate_two_micro_batches("softmax_shared", mode, "cuda", fn=compiled)


def test_a_misaligned_accumulator_is_refused_compiled_at_the_backward():
    """Compiled, the call does not check an accumulator's alignment (Dynamo cannot trace data_ptr): the op refuses
    a misaligned one at the backward."""
    layer = make_layer("softmax_shared").to("cuda")
    acc = test_autograd.accumulators_like(layer)
    buffer = torch.zeros(acc.w1.numel() + 1, device="cuda")
    acc = acc._replace(w1=buffer[1:].view(acc.w1.shape))
    y = test_autograd.moe_of(layer, layer.x.clone().requires_grad_(), layer.w1, acc,
                             torch.compile(mok.moe, fullgraph=True))
    with pytest.raises(ValueError, match="d_w1's data is not 16-byte aligned"):
        (y.float() * layer.dy.float()).sum().backward()


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_bf16_accumulate_into_on_gpu_gives_autograds_grad_bits(mode):
    test_autograd.bf16_accumulators_take_autograds_bits("softmax_shared", mode, "cuda")


@pytest.mark.parametrize("accumulate", (False, True), ids=("grad", "accumulate_into"))
def test_backward_fills_no_zero_gradient_for_saved(accumulate):
    test_autograd.assert_no_zero_gradient_for_saved(accumulate, "cuda")


def test_a_second_backward_of_one_forward_is_refused():
    test_autograd.test_a_second_backward_of_one_forward_is_refused("cuda")


@pytest.mark.parametrize("mode", (ROUTER, GIVEN), ids=("router", "given"))
def test_backward_scratch_in_d_w1_gives_the_cpus_bits(mode):
    """A layer whose backward's scratch fits in its d_w1 (the sizes say so: mok::backward's workspace shorter than
    mok::backward_accumulate's, mok::backward_consuming's shorter still, by dh): autograd's gradients on the GPU
    (mok::backward_consuming: the ring, g, a, dye and the dx_j in d_w1, dW2's tiles before dW1's, dh over the saved
    h) are the CPU op's bits."""
    layer = scratch_fits_layer()
    ints, floats, _, _ = layer.op_args()
    _, backward, consuming, accumulating = mok._C.workspace_bytes(ints, floats, pack_launch(RING_ROWS))
    assert consuming < backward < accumulating
    assert_functional_is_the_cpus(layer, mode)


@pytest.mark.parametrize("recompute", (False, True), ids=("saving", "recompute"))
def test_workspace_bytes_are_what_the_op_allocates(recompute):
    """mok._C.workspace_bytes, the Layer's sizes computed on the host (no Layer built), is the workspace a
    forward and each backward op take from torch's allocator beside their outputs: each call's peak over what
    was allocated before (the Layer's own device words are not torch's)."""
    layer = make_layer("softmax_shared").to("cuda")
    ints, floats, mode, _ = layer.op_args()
    launch = pack_launch(RING_ROWS, recompute=recompute)
    forward, backward, consuming, accumulating = mok._C.workspace_bytes(ints, floats, launch)

    def block(n):  # the caching allocator's sizes (all here below a megabyte: one block each)
        return -(-n // 512) * 512 if n else 0

    def peak(call):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        outputs = call()
        return torch.cuda.max_memory_allocated() - before, sum(block(t.nbytes) for t in outputs)

    def run_forward():
        return torch.ops.mok.forward(*layer.weights(), None, None, ints, floats, mode, launch)

    fwd = run_forward()  # builds the Layer
    used, outputs = peak(run_forward)
    assert used == outputs + block(forward)
    _, idx, w, logits, saved = fwd
    saved_args = (*layer.weights(), idx, w, logits, saved, layer.dy)
    used, outputs = peak(lambda: torch.ops.mok.backward(*saved_args, ints, floats, mode, launch))
    assert used == outputs + block(backward)
    accumulators = [torch.zeros_like(g, dtype=torch.float32) if g.numel() else None
                    for g in torch.ops.mok.backward(*saved_args, ints, floats, mode, launch)[3:]]
    used, outputs = peak(lambda: torch.ops.mok.backward_accumulate(*saved_args, *accumulators, ints, floats, mode,
                                                                   launch))
    assert used == outputs + block(accumulating)
    used, outputs = peak(lambda: torch.ops.mok.backward_consuming(*saved_args, ints, floats, mode, launch))
    assert used == outputs + block(consuming)


def test_cuda_graph_replay():
    layer = make_layer("softmax_shared").to("cuda")
    eager = layer.forward()
    eager_grads = layer.backward(eager)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up off the default stream, as graph capture wants
        layer.backward(layer.forward())
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fwd = layer.forward()
        grads = layer.backward(fwd)
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        mok.check()
        assert_all_same_bits(fwd, eager, FORWARD_OUTPUTS)
        assert_all_same_bits(grads, eager_grads, GRADIENTS)


def test_a_layers_first_call_in_graph_capture_raises_naming_the_fix():
    """A call of a config and launch no call has run yet builds its Layer, which allocates: inside a CUDA graph
    capture it raises, naming the fix (CUDA's own error named neither), and once made eagerly it captures."""
    layer = make_layer("softmax_shared").to("cuda")
    ints, floats = layer.config.pack()
    launch = pack_launch(RING_ROWS, blocks=5)  # a launch no other test builds a Layer of

    def run():
        return torch.ops.mok.forward(*layer.weights(), None, None, ints, floats, ROUTER, launch)

    with pytest.raises(ValueError, match="Make the same call once before capturing"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            run()
    eager = run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    graph.replay()
    torch.cuda.synchronize()
    mok.check()
    assert_all_same_bits(captured, eager, FORWARD_OUTPUTS)


def test_non_default_stream():
    layer = make_layer("sigmoid_grouped").to("cuda")
    want = layer.forward()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got = layer.forward()
        grads = layer.backward(got)
    stream.synchronize()
    mok.check()
    assert_all_same_bits(got, want, FORWARD_OUTPUTS)
    assert_all_same_bits(grads, layer.backward(want), GRADIENTS, layer.absent_outputs())


def test_fp8_accumulate_grad_gives_plain_autograds_grad_bits():
    test_autograd.fp8_accumulate_grad_gives_plain_autograds_grad_bits("cuda")
    mok.check()


@pytest.mark.parametrize("fp8_weight_gradients", [False, True])
def test_fp8_forward_and_backward_are_the_cpus(fp8_weight_gradients):
    """The fp8 mode on the GPU, through autograd: the forward and the backward (the input gradients'
    GEMMs on E4M3 operands; with fp8_weight_gradients the routed experts' weight gradients too) with the
    CPU op's bits, dx and every parameter's gradient."""
    _, cpu_model, gpu_model, x = fp8_models(fp8_weight_gradients=fp8_weight_gradients)
    x_cpu, x_gpu = x.clone().requires_grad_(), x.cuda().requires_grad_()
    want, got = cpu_model(x_cpu), gpu_model(x_gpu)
    assert_same_bits(got.detach().cpu(), want.detach(), "y")
    want.float().sum().backward()
    got.float().sum().backward()
    mok.check()
    assert_same_bits(x_gpu.grad.cpu(), x_cpu.grad, "dx")
    for (name, p_cpu), p_gpu in zip(cpu_model.named_parameters(), gpu_model.parameters()):
        assert (p_cpu.grad is None) == (p_gpu.grad is None), name
        if p_cpu.grad is not None:
            assert_same_bits(p_gpu.grad.cpu(), p_cpu.grad, name)


def test_fp8_weights_quantized_once_give_the_forwards_bits():
    """The fp8 weights quantized once (mok.quantize_weights, the production path: once per optimizer
    step) and read by the forwards of two micro-batches give the bits of the forward that quantizes them
    itself, and the CPU op's; quantize_weights and the forward given its buffer pass opcheck; a buffer
    that does not fit, or the bf16 mode, is refused."""
    config, cpu_model, gpu_model, first = fp8_models()
    xs = [first, torch.randn(40, 128, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)]
    with torch.no_grad():
        q = gpu_model.quantize_weights()
        assert q.dtype == torch.uint8 and q.device == gpu_model.w1.device and q.dim() == 1
        for x in xs:
            want = cpu_model(x)
            assert_same_bits(gpu_model(x.cuda()).cpu(), want, "y, quantized by the forward")
            assert_same_bits(gpu_model(x.cuda(), fp8_weights=q).cpu(), want, "y, quantized once")
        with pytest.raises(ValueError, match=r"fp8_weights \[fp8_weights_bytes\(\)\] has shape"):
            gpu_model(xs[0].cuda(), fp8_weights=q[:-16])
    mok.check()
    ints, floats = config.pack()
    weights = [t.detach() for t in (gpu_model.w1, gpu_model.w2, gpu_model.shared_w1, gpu_model.shared_w2)]
    torch.library.opcheck(torch.ops.mok.quantize_weights.default, (*weights, ints, floats, pack_launch(0)))
    q = torch.ops.mok.quantize_weights.default(*weights, ints, floats, pack_launch(0))
    x = xs[0].cuda()
    router = gpu_model.router.detach()
    torch.library.opcheck(torch.ops.mok.forward.default,
                          (x, router, None, *weights, None, None, ints, floats, ROUTER, pack_launch(0), q))
    layer = make_layer("softmax_shared").to("cuda")
    with pytest.raises(ValueError, match="quantize_weights: the config's precision is bf16"):
        mok.quantize_weights(layer.w1, layer.w2, config=layer.config, shared=(layer.shared_w1, layer.shared_w2))


def test_fp8_backward_reads_the_forwards_fp8_weights():
    """The fp8 backward given the forward's quantized weights (autograd passes the forward's fp8_weights
    to mok::backward) reads W^T from them instead of quantizing the weights again: dx and every
    parameter's gradient have the bits of the backward that quantizes them itself, and the CPU op's;
    mok::backward and mok::backward_accumulate too, and given another layer's buffer they give other
    bits (they read it), as autograd's backward after a forward given it; a buffer that does not fit is
    refused; the op given one passes opcheck."""
    config, cpu_model, gpu_model, x = fp8_models()

    def gradients(model, x, **kwargs):
        """dx and each parameter's gradient of sum(y), on the CPU (None: none)."""
        model.zero_grad(set_to_none=True)
        x = x.clone().requires_grad_()
        model(x, **kwargs).float().sum().backward()
        grads = {"dx": x.grad, **{name: p.grad for name, p in model.named_parameters()}}
        return {name: g.cpu() if g is not None else None for name, g in grads.items()}

    want = gradients(cpu_model, x)
    for fp8_weights in (None, gpu_model.quantize_weights()):
        got = gradients(gpu_model, x.cuda(), fp8_weights=fp8_weights)
        mok.check()
        assert got.keys() == want.keys()
        for name, g in want.items():
            assert (got[name] is None) == (g is None), name
            if g is not None:
                assert_same_bits(got[name], g, f"{name}, fp8_weights given: {fp8_weights is not None}")

    def expert_weights(model):
        return [t.detach() for t in (model.w1, model.w2, model.shared_w1, model.shared_w2)]

    def quantized(model):
        return torch.ops.mok.quantize_weights.default(*expert_weights(model), *config.pack(), pack_launch(0))

    args = (*config.pack(), ROUTER, pack_launch(0))
    q = quantized(gpu_model)
    other = quantized(mok.MoE(config, device="cuda", generator=torch.Generator().manual_seed(6)))
    inputs = (x.cuda(), gpu_model.router.detach(), None, *expert_weights(gpu_model))
    _, idx, w, logits, saved = torch.ops.mok.forward.default(*inputs, None, None, *args, q)
    dy = torch.randn(40, 128, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16).cuda()
    saved_args = (*inputs, idx, w, logits, saved, dy)

    def backward(*fp8_weights):
        return [t.cpu() for t in torch.ops.mok.backward.default(*saved_args, *args, *fp8_weights)]

    def accumulated(*fp8_weights):
        """mok::backward_accumulate's dx, d_topk_w, d_logits and its sums into fp32 zeros."""
        acc = [torch.zeros(g.shape, device="cuda") if g.numel() else None for g in quantizing[3:]]
        out = torch.ops.mok.backward_accumulate.default(*saved_args, *acc, *args, *fp8_weights)
        return [t.cpu() for t in (*out, *(a for a in acc if a is not None))]

    quantizing = backward()
    assert_all_same_bits(backward(q), quantizing, GRADIENTS)
    assert not torch.equal(backward(other)[0], quantizing[0]), "dx does not depend on the backward's fp8_weights"
    assert_all_same_bits(accumulated(q), accumulated())
    assert not torch.equal(accumulated(other)[0], quantizing[0]), "backward_accumulate's dx ignores fp8_weights"
    # Through autograd the backward reads the forward's buffer: given another layer's, dx is the op's
    # given that buffer, not the op's that quantizes w1 and w2 itself. The ops first: autograd's backward
    # consumes the forward's saved buffer (mok::backward_consuming), mok::backward keeps it.
    x_grad = inputs[0].clone().requires_grad_()
    y, *forward_outputs = torch.ops.mok.forward.default(x_grad, *inputs[1:], None, None, *args, other)
    reading_other = torch.ops.mok.backward.default(*inputs, *forward_outputs, dy, *args, other)[0]
    quantizing_w = torch.ops.mok.backward.default(*inputs, *forward_outputs, dy, *args)[0]
    y.backward(dy)
    assert_same_bits(x_grad.grad, reading_other, "dx through autograd given another layer's fp8_weights")
    assert not torch.equal(x_grad.grad, quantizing_w), "autograd's backward quantized w1 and w2 itself"
    with pytest.raises(ValueError, match=r"fp8_weights \[fp8_weights_bytes\(\)\] has shape"):
        backward(q[:-16])
    mok.check()
    torch.library.opcheck(torch.ops.mok.backward.default, (*saved_args, *args, q))


def test_quantize_weights_fake_raises_the_cuda_ops_error():
    """mok::quantize_weights' fake kernel (FakeTensorMode's, so torch.compile's) raises the CUDA op's
    ValueError, with its message, for the arguments it refuses (the bf16 mode, a weight's shape, dtype or
    device, a missing shared expert; not the alignment: a fake tensor has no data), and gives the right
    ones the result's shape."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    config = mok.MoEConfig(experts=4, hidden=128, intermediate=256, top_k=2, tokens_per_rank=40, precision="fp8",
                           shared_intermediate=128)
    model = mok.MoE(config, device="cuda", generator=torch.Generator().manual_seed(3))
    w1, w2, sw1, sw2 = (t.detach() for t in (model.w1, model.w2, model.shared_w1, model.shared_w2))
    bf16 = dataclasses.replace(config, precision="bf16")
    cases = [(bf16, (w1, w2, sw1, sw2), "quantize_weights: the config's precision is bf16"),
             (config, (w1[:, :256].contiguous(), w2, sw1, sw2), r"w1 must have shape \[4, 512, 128\]"),
             (config, (w1, w2.float(), sw1, sw2), "w2 must be BFloat16, got Float"),
             (config, (w1, w2, sw1.cpu(), sw2), "shared_w1 is on cpu but w1 is on cuda"),
             (config, (w1, w2, None, None), "shared_w1 is missing"),
             (config, (w1, w2.transpose(1, 2).contiguous().transpose(1, 2), sw1, sw2), "w2 is not contiguous")]
    for c, weights, message in cases:
        args = (*c.pack(), pack_launch(0))
        with pytest.raises(ValueError, match=message) as real:
            torch.ops.mok.quantize_weights(*weights, *args)
        with FakeTensorMode() as mode:
            fakes = [mode.from_tensor(t) if t is not None else None for t in weights]
            with pytest.raises(ValueError, match=message) as fake:
                torch.ops.mok.quantize_weights(*fakes, *args)
        assert str(fake.value).splitlines()[0] == str(real.value).splitlines()[0], message
    with FakeTensorMode() as mode:
        q = torch.ops.mok.quantize_weights(*(mode.from_tensor(t) for t in (w1, w2, sw1, sw2)), *config.pack(),
                                           pack_launch(0))
        assert q.dtype == torch.uint8 and q.device == w1.device
        assert q.shape == (mok._C.fp8_weights_bytes(*config.pack(), pack_launch(0)),)


def test_quantize_weights_fake_with_symbolic_sizes_checks_what_it_can():
    """With symbolic sizes (torch.compile's dynamic shapes) the fake raises the CUDA op's errors on the
    precision, a dtype, a device and a missing shared expert, and leaves the shape (which it cannot
    compare) to the kernel."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    config = mok.MoEConfig(experts=4, hidden=128, intermediate=256, top_k=2, tokens_per_rank=40, precision="fp8",
                           shared_intermediate=128)
    model = mok.MoE(config, device="cuda", generator=torch.Generator().manual_seed(3))
    w1, w2, sw1, sw2 = (t.detach() for t in (model.w1, model.w2, model.shared_w1, model.shared_w2))
    bf16 = dataclasses.replace(config, precision="bf16")

    def symbolic(mode, weights):
        fakes = [mode.from_tensor(t, static_shapes=False, source=ConstantSource(f"w{i}")) if t is not None else None
                 for i, t in enumerate(weights)]
        assert all(isinstance(s, torch.SymInt) for s in fakes[0].shape), "the fakes' sizes are not symbolic"
        return fakes

    refused = [(bf16, (w1, w2, sw1, sw2), "quantize_weights: the config's precision is bf16"),
               (config, (w1, w2.float(), sw1, sw2), "w2 must be BFloat16, got Float"),
               (config, (w1, w2, sw1.cpu(), sw2), "shared_w1 is on cpu but w1 is on cuda"),
               (config, (w1, w2, None, None), "shared_w1 is missing")]
    for c, weights, message in refused:
        with FakeTensorMode(shape_env=ShapeEnv()) as mode:
            with pytest.raises(ValueError, match=message):
                torch.ops.mok.quantize_weights(*symbolic(mode, weights), *c.pack(), pack_launch(0))
    narrow_w1 = w1[:, :256].contiguous()
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:  # a wrong shape passes here; the kernel refuses it
        torch.ops.mok.quantize_weights(*symbolic(mode, (narrow_w1, w2, sw1, sw2)), *config.pack(), pack_launch(0))


def assert_functional_is_the_cpus(layer, mode, fn=mok.moe):
    """y and every input gradient through autograd on the GPU (fn) are the CPU op's bits."""
    cpu_y, cpu_grads = test_autograd.run_functional(layer, mode)
    y, grads = test_autograd.run_functional(layer.to("cuda"), mode, fn)
    assert_same_bits(y, cpu_y, "y")
    for k, v in cpu_grads.items():
        assert (grads[k] is None) == (v is None), k
        if v is not None:
            assert_same_bits(grads[k], v, k)


@pytest.mark.parametrize("mode", (ROUTER, GIVEN), ids=("router", "given"))
def test_compile_on_gpu_is_eager_and_cpu(mode):
    assert_functional_is_the_cpus(make_layer("softmax_shared"), mode, torch.compile(mok.moe, fullgraph=True))


def test_a_cpu_tensor_or_misaligned_data_is_named():
    layer = make_layer("softmax_shared").to("cuda")
    with pytest.raises(ValueError, match="w1 is on cpu but x is on cuda"):
        torch.ops.mok.forward(layer.x, layer.router, None, layer.w1.cpu(), layer.w2, layer.shared_w1,
                              layer.shared_w2, None, None, *layer.op_args())
    buffer = torch.zeros(layer.x.numel() + 1, dtype=torch.bfloat16, device="cuda")
    misaligned = buffer[1:].view(layer.x.shape)
    with pytest.raises(ValueError, match="x's data is not 16-byte aligned"):
        torch.ops.mok.forward(misaligned, *layer.weights()[1:], None, None, *layer.op_args())


def test_fake_kernels_make_the_cuda_kernels_checks():
    """The fakes of CUDA calls (torch.compile's tracing) raise what the CUDA kernels would: a dtype, a
    shape, a CPU tensor beside CUDA ones, an accumulator's dtype; not the data's alignment."""
    layer = make_layer("softmax_shared").to("cuda")
    forward, backward = torch.ops.mok.forward, torch.ops.mok.backward
    check = test_errors.assert_fake_raises_the_kernels_error
    check(forward, test_errors.forward_args(layer, w1=layer.w1.float()), "w1 must be BFloat16")
    check(forward, test_errors.forward_args(layer, x=layer.x[:16]), r"x must have shape \[32, 64\]")
    check(forward, test_errors.forward_args(layer, router=layer.router.cpu()), "router is on cpu but x is on cuda")
    check(backward, test_errors.backward_args(layer, saved=lambda t: t.to(torch.int8)), "saved must be Byte")
    check(torch.ops.mok.backward_accumulate, test_errors.backward_args(layer, True, d_w2=lambda t: t.to(torch.bfloat16)),
          "d_w2 must be Float, got BFloat16")
    misaligned = torch.zeros(layer.x.numel() + 1, dtype=torch.bfloat16, device="cuda")[1:].view(layer.x.shape)
    with pytest.raises(ValueError, match="x's data is not 16-byte aligned"):
        forward(*test_errors.forward_args(layer, x=misaligned))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:  # a fake tensor has no data: the kernel checks the alignment when it runs
        forward(*test_errors.fake_args(mode, test_errors.forward_args(layer, x=misaligned)))


def test_kernel_errors_raise_at_check_then_clear():
    """Errors only the kernels see are raised by mok.check() (or the layer's next call), then cleared."""
    layer = make_layer("softmax_shared").to("cuda")
    huge = torch.full_like(layer.router, 3e38)
    y = torch.ops.mok.forward(layer.x, huge, *layer.weights()[2:], None, None, *layer.op_args())[0]
    with pytest.raises(ValueError, match=r"router logit of token \d+ overflows"):
        mok.check()
    assert torch.isnan(y).all()  # the failed launch's y: NaN, not stale memory
    _, idx, w, _, _ = layer.forward()
    bad = idx.clone()
    bad[0, 0] = 99
    layer.forward(GIVEN, bad, w)
    with pytest.raises(ValueError, match=r"the given routing of token 0 has an expert id outside \[0, E = "
                                         rf"{layer.config.experts}\)"):
        mok.check()
    fwd = layer.forward()  # works again
    mok.check()
    assert_same_bits(fwd[0].cpu(), make_layer("softmax_shared").forward()[0])


def test_non_finite_expert_bias_raises_naming_the_expert():
    """The kernel checks expert_bias before any token is selected (the CPU op refuses it at the call)."""
    layer = make_layer("sigmoid_grouped").to("cuda")
    bias = layer.expert_bias.clone()
    bias[6], bias[2] = float("inf"), float("nan")
    y, _, w, logits, _ = dataclasses.replace(layer, expert_bias=bias).forward()
    with pytest.raises(ValueError, match="expert_bias of expert 2 is NaN or Inf"):
        mok.check()
    for name, output in (("y", y), ("topk_w", w), ("logits", logits)):
        assert torch.isnan(output).all(), name  # filled behind the error
    fwd = layer.forward()  # works again
    mok.check()
    assert_same_bits(fwd[0].cpu(), make_layer("sigmoid_grouped").forward()[0])


def test_raw_op_refuses_an_unknown_communicator():
    """A launch list naming an integer mok.distributed.communicator did not hand out is refused (it was
    dereferenced as an ncclComm_t: a crash)."""
    layer = make_layer("softmax_shared").to("cuda")
    launch = pack_launch(RING_ROWS, comm=12345)
    with pytest.raises(ValueError, match="comm = 12345 is not a communicator mok.distributed.communicator"):
        torch.ops.mok.forward(*layer.weights(), None, None, *layer.config.pack(), ROUTER, launch)
    layer.forward()  # works
    mok.check()


def test_backward_refuses_another_forwards_saved_buffer_on_the_gpu():
    """The kernel checks the saved layout against topk_idx (the host could not without a copy) and names
    the first token the routings differ at, as the CPU op does (test_errors)."""
    layer = make_layer("softmax_shared").to("cuda")
    y, idx, w, logits, saved = layer.forward()
    other = make_layer("softmax_shared", seed=5).to("cuda").forward()
    first = int((other[1] != idx).any(dim=1).nonzero()[0])
    layer.backward((y, other[1], other[2], other[3], saved))
    with pytest.raises(ValueError, match=f"its dispatch layout routes token {first} otherwise"):
        mok.check()
    layer.backward((y, idx, w, logits, saved))  # works again
    mok.check()


def test_capture_from_gpu(tmp_path):
    layer = make_layer("sigmoid_grouped").to("cuda")
    path = tmp_path / "gpu.h5"
    mok.capture(path, test_capture.layer_args(layer), layer.x, layer.dy, name="gpu")
    test_capture.verify_with_reference(path)  # the GPU's bits against the CPU reference, by mok-verify


def test_training_on_gpu_is_reproducible():
    test_training.assert_same_runs(test_training.train("cuda"), test_training.train("cuda"))


def test_model_output_is_the_cpus():
    """The same initial model (drawn on the CPU) gives the same output bits on both devices. (Training
    runs then differ: the loss and Adam run on each device's own PyTorch kernels.)"""
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.no_grad():
        cpu = test_training.TwoLayers("cpu")(x)
        gpu = test_training.TwoLayers("cuda")(x.cuda())
    assert_same_bits(gpu.cpu(), cpu)
