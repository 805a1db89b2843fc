"""aten.convolution_backward compiles (GraphBuilder::convolutionBackward): the input and
weight gradients as conv_input_grad and conv_weight_grad (cuDNN's or oneDNN's backward
convolutions where the library is there; else a transposed convolution, and a convolution with
the batch as channels), the bias gradient as a sum. Training steps of plain and transposed convolutions in 1 to 3
spatial dims, with strides, padding, dilation, groups (depthwise too), inputs whose last rows no
window reaches, and each subset of gradients, match eager with no op left to it."""
import pytest
import torch
import torch.nn.functional as F

import braze
from _device import braze_opt, eager

CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}

# (name, spatial dims, input shape, weight shape, keyword arguments, transposed)
CASES = [
    ("1d stride 2", 1, (2, 4, 17), (6, 4, 3), dict(stride=2, padding=1), False),
    ("2d groups dilation", 2, (2, 6, 13, 11), (4, 3, 3, 2),
     dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2), False),
    ("2d depthwise", 2, (2, 8, 10, 10), (8, 1, 3, 3), dict(padding=1, groups=8), False),
    ("2d rows no window reaches", 2, (2, 3, 12, 9), (5, 3, 3, 3), dict(stride=2), False),
    ("2d one tap stride 2", 2, (2, 8, 9, 9), (4, 8, 1, 1), dict(stride=2), False),
    ("2d stem", 2, (2, 3, 20, 20), (8, 3, 7, 7), dict(stride=2, padding=3), False),
    ("3d", 3, (1, 3, 6, 7, 5), (4, 3, 2, 3, 2), dict(stride=(1, 2, 1), padding=(0, 1, 1)), False),
    ("2d transposed", 2, (2, 4, 5, 6), (4, 3, 3, 3), dict(stride=2, padding=1, output_padding=1),
     True),
    ("2d transposed groups dilation", 2, (2, 4, 6, 5), (4, 2, 3, 2),
     dict(stride=2, dilation=(1, 3), groups=2, output_padding=(1, 2)), True),
    ("1d transposed", 1, (3, 2, 9), (2, 5, 4), dict(stride=3, padding=2), True),
]


def _tolerance(dtype):
    return {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float64: dict(rtol=1e-9, atol=1e-9)}[dtype]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16],
                         ids=["f32", "f64", "bf16"])
def test_convolution_backward_matches_eager(device, case, dtype):
    _, dims, xs, ws, kw, transposed = case
    conv = (CONV_T if transposed else CONV)[dims]
    torch.manual_seed(0)
    out_channels = ws[1] * kw.get("groups", 1) if transposed else ws[0]
    with torch.device("cpu"):
        x0, w0 = torch.randn(xs, dtype=dtype), torch.randn(ws, dtype=dtype)
        b0 = torch.randn(out_channels, dtype=dtype)
    x0, w0, b0 = x0.to(device), w0.to(device), b0.to(device)

    with torch.no_grad():
        gy = torch.randn_like(conv(x0, w0, b0, **kw))

    def step(x, w, b):  # the output's gradient is gy, the same in every dtype
        return (conv(x, w, b, **kw) * gy.to(x.dtype)).sum()

    for need in ((True, True, True), (False, True, True), (True, False, False)):
        def leaves():
            return [t.clone().requires_grad_(r) for t, r in zip((x0, w0, b0), need)]
        torch._dynamo.reset()
        before = braze.counters()["fallback_ops"]
        got_in = leaves()
        torch.compile(step, backend="braze")(*got_in).backward()
        assert braze.counters()["fallback_ops"] == before, need
        want_in = leaves()
        eager(step, *want_in).backward()
        if dtype == torch.bfloat16:
            # Rounding orders differ: braze's error against float64 is at most twice eager's.
            truth = [t.detach().double().requires_grad_(r) for t, r in zip((x0, w0, b0), need)]
            step(*truth).backward()
            for g, w, t in zip(got_in, want_in, truth):
                if w.requires_grad:
                    eager_err = (w.grad.double() - t.grad).abs().max().item()
                    err = (g.grad.double() - t.grad).abs().max().item()
                    assert err <= 2 * eager_err + 1e-2, (need, err, eager_err)
            continue
        for g, w in zip(got_in, want_in):
            if w.requires_grad:
                torch.testing.assert_close(g.grad, w.grad, **_tolerance(dtype))


def test_cnn_training_step_is_one_graph_pair():
    """A small CNN's training step: the forward and the backward are one partition each (the
    convolutions' backward no longer cuts the backward into pieces)."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, stride=2, groups=2, bias=False),
                                torch.nn.Flatten(), torch.nn.LazyLinear(4))
    x = torch.randn(4, 3, 16, 16)
    model(x)
    compiled = torch.compile(model, backend="braze")
    torch._dynamo.reset()
    before = braze.counters()
    compiled(x).square().sum().backward()
    after = braze.counters()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().sum().backward()
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-4)
    assert after["fallback_ops"] == before["fallback_ops"]
    assert after["partitions"] - before["partitions"] == 2


@pytest.mark.parametrize("switch", [True, False], ids=["default", "cuda_off"])
def test_convolution_backward_compiles_by_default(device, monkeypatch, switch):
    """Plain and grouped convolution backward compile on both devices by default; with
    rules_nn.COMPILE_CUDA_CONV_BACKWARD off, CUDA's run in eager (counted, with the reason) and
    the CPU's still compile."""
    from braze import rules_nn
    if not switch:
        monkeypatch.setattr(rules_nn, "COMPILE_CUDA_CONV_BACKWARD", False)
    torch.manual_seed(2)
    for groups in (1, 2):
        with torch.device("cpu"):
            x0, w = torch.randn(2, 4, 9, 9), torch.randn(6, 4 // groups, 3, 3)
        x = x0.to(device).requires_grad_()
        w = w.to(device).requires_grad_()
        torch._dynamo.reset()
        before = braze.fallback_ops_by_op().get("aten.convolution_backward.default", 0)
        out = torch.compile(lambda x, w: F.conv2d(x, w, groups=groups).square().sum(),
                            backend="braze")(x, w)
        out.backward()
        after = braze.fallback_ops_by_op().get("aten.convolution_backward.default", 0)
        assert (after > before) == (device == "cuda" and not switch), (groups, device, switch)


class _ResidualStem(torch.nn.Module):
    """A ResNet's stem and one basic block, with in-place ReLUs (torchvision's layout)."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 7, 2, 3, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(16)
        self.pool = torch.nn.MaxPool2d(3, 2, 1)
        self.conv2 = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(16)
        self.conv3 = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn3 = torch.nn.BatchNorm2d(16)
        self.relu = torch.nn.ReLU(inplace=True)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = self.pool(self.relu(self.bn1(self.conv1(x))))
        out = self.bn3(self.conv3(self.relu(self.bn2(self.conv2(x)))))
        out += x
        out = self.relu(out)
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(out, 1), 1))


def test_channels_last_residual_training_step_compiles(device):
    """A channels-last residual CNN's training step (max pool indices and a convolution's result
    held channels-last, then read by the max pool's backward) compiles whole and matches eager.
    Its backward once lowered to an invalid loop program and ran in eager."""
    torch.manual_seed(3)
    model = _ResidualStem().to(device, memory_format=torch.channels_last).train()
    x = torch.randn(2, 3, 32, 32, device=device).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (2,), device=device)

    def grads(fn):
        model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(fn(x), labels)
        loss.backward()
        return [loss.detach()] + [p.grad.clone() for p in model.parameters()]
    torch._dynamo.reset()
    before = braze.counters()
    got = grads(torch.compile(model, backend="braze"))
    after = braze.counters()
    want = grads(model)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-3)
    assert after["fallback_graphs"] == before["fallback_graphs"]
    assert after["fallback_ops"] == before["fallback_ops"]


def test_long_weight_gradient_reductions_compile_through_cudnn(device):
    """A weight gradient summing over more than CUDA_WEIGHT_GRAD_MAX_POSITIONS batch and output
    positions compiles on CUDA as cuDNN's backward-filter convolution; only without cuDNN does
    it run in eager there (braze's kernels would run it on a few blocks), counted. On the CPU,
    and for the input gradient alone, it compiles. Either way the gradients match eager."""
    from braze import rules_nn
    from braze import cuda as cuda_support
    torch.manual_seed(4)
    with torch.device("cpu"):
        x0, w0 = torch.randn(2, 4, 96, 96), torch.randn(8, 4, 3, 3)
    assert 2 * 94 * 94 > rules_nn.CUDA_WEIGHT_GRAD_MAX_POSITIONS
    for weight_grad in (True, False):
        x = x0.to(device).requires_grad_()
        w = w0.to(device).requires_grad_(weight_grad)
        torch._dynamo.reset()
        before = braze.fallback_ops_by_op().get("aten.convolution_backward.default", 0)
        torch.compile(lambda x, w: F.conv2d(x, w).square().sum(), backend="braze")(x, w).backward()
        after = braze.fallback_ops_by_op().get("aten.convolution_backward.default", 0)
        to_eager = device == "cuda" and weight_grad and cuda_support.cudnn_library() is None
        assert (after > before) == to_eager, (device, weight_grad)
        xe, we = x0.to(device).requires_grad_(), w0.to(device).requires_grad_(weight_grad)
        F.conv2d(xe, we).square().sum().backward()
        torch.testing.assert_close(x.grad, xe.grad, rtol=1e-3, atol=1e-3)
        if weight_grad:
            torch.testing.assert_close(w.grad, we.grad, rtol=1e-3, atol=1e-2)


def _text_shape(s):
    return "[" + ", ".join(str(v) for v in s) + "]"


@pytest.mark.cpu_only("checks CUDA's loop programs on the CPU")
@pytest.mark.parametrize("case", [c for c in CASES if not c[5]], ids=lambda c: c[0])
def test_cuda_gradient_loops_compute_what_eager_does(case, tmp_path):
    """On CUDA with cuDNN the weight and input gradients are one conv_weight_grad and one
    conv_input_grad computation each, whose loops (the direct forms, launched when cuDNN
    declines a problem) are the fallback for cuDNN's backward-filter and backward-data calls.
    The loop programs braze-opt prints for CUDA run here on the CPU (braze-opt --run) against
    eager's gradients; so do the graphs, as the CPU compiles them."""
    import subprocess
    from braze.package import _write_safetensors
    _, spatial, xs, ws, kw, _ = case
    exe = braze_opt()
    torch.manual_seed(5)
    x, w = torch.randn(xs), torch.randn(ws)
    y = CONV[spatial](x, w, **kw)
    dy = torch.randn_like(y)
    per = lambda v: list(v) if isinstance(v, tuple) else [v] * spatial  # noqa: E731
    stride, padding = per(kw.get("stride", 1)), per(kw.get("padding", 0))
    dilation, groups = per(kw.get("dilation", 1)), kw.get("groups", 1)
    dx, dw, _ = torch.ops.aten.convolution_backward(dy, x, w, None, stride, padding, dilation,
                                                    False, [0] * spatial, groups,
                                                    [True, True, False])
    attrs = f"{{dilation={dilation}, groups={groups}, padding={padding}, stride={stride}}}"
    graph = tmp_path / "g.txt"
    graph.write_text(
        f"graph(%x: f32{_text_shape(xs)}, %dy: f32{_text_shape(dy.shape)}, "
        f"%w: f32{_text_shape(ws)}) {{\n"
        f"  %dw = conv_weight_grad(%x, %dy) {attrs} : f32{_text_shape(ws)}\n"
        f"  %dx = conv_input_grad(%dy, %w) {attrs} : f32{_text_shape(xs)}\n"
        f"  return %dw, %dx\n}}\n")
    loops = subprocess.run([exe, str(graph), "--cuda", "--cudnn", "--print=loops"],
                           capture_output=True, text=True)
    assert loops.returncode == 0, loops.stderr
    assert "conv_weight_grad(%x, %dy" in loops.stdout and "conv_input_grad(%dy, %w" in loops.stdout
    (tmp_path / "loops.txt").write_text(loops.stdout)
    tensors = tmp_path / "t.safetensors"
    _write_safetensors(str(tensors), [("x", x), ("dy", dy), ("w", w),
                                      ("expected:0", dw.contiguous()),
                                      ("expected:1", dx.contiguous())])
    for program in (tmp_path / "loops.txt", graph):  # CUDA's loops; the CPU's decomposition
        run = subprocess.run([exe, str(program), f"--run={tensors}", "--atol=1e-3",
                              "--rtol=1e-4"], capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr
