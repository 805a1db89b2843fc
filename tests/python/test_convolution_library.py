"""CPU f32 convolutions through oneDNN (the onednn-cpu-gomp wheel): every form of convolution
matches eager, runs as a library call (no im2col in the generated code), and the im2col path
(Options(dnnl=False)) still matches too."""
import re

import pytest
import torch
import torch.nn.functional as F

import braze
from braze import cpu as cpu_support

pytestmark = [pytest.mark.skipif(cpu_support.dnnl_library() is None, reason="oneDNN is not installed"),
              pytest.mark.cpu_only("oneDNN runs CPU convolutions")]

CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}

# (spatial dims, in channels, out channels, kernel, stride, padding, dilation, groups, bias, size)
CASES = [
    (2, 3, 8, 3, 1, 1, 1, 1, False, 9),
    (2, 6, 4, 3, 2, 1, 2, 2, True, 11),     # stride, dilation, groups, bias
    (2, 8, 8, 3, 1, 1, 1, 8, False, 10),    # depthwise
    (2, 8, 16, 3, 2, 1, 1, 8, True, 10),    # depthwise with a channel multiplier
    (2, 4, 6, 1, 1, 0, 1, 1, True, 7),      # 1×1
    (2, 5, 7, 7, 2, 3, 1, 1, False, 16),    # a ResNet stem
    (2, 4, 4, 2, 2, 0, 1, 1, False, 5),     # a window that leaves the last row out
    (2, 4, 6, (3, 1), (2, 1), (1, 0), (1, 1), 2, True, 9),
    (1, 4, 6, 5, 2, 2, 1, 1, True, 20),
    (1, 6, 6, 3, 1, 2, 2, 3, False, 17),
    (3, 3, 4, 3, 1, 1, 1, 1, True, 6),
    (3, 4, 4, 3, 2, 1, 1, 4, False, 7),
]


def _conv_fn(case):
    dims, cin, cout, k, stride, padding, dilation, groups, bias, size = case
    conv = CONV[dims]

    def fn(x, w, *b):
        return torch.relu(conv(x, w, b[0] if b else None, stride=stride, padding=padding,
                               dilation=dilation, groups=groups)) * 2
    kernel = k if isinstance(k, tuple) else (k,) * dims
    x = torch.randn(2, cin, *([size] * dims))
    w = torch.randn(cout, cin // groups, *kernel)
    args = [x, w] + ([torch.randn(cout)] if bias else [])
    return fn, args


def _compile(fn, opts=None, **kw):
    torch._dynamo.reset()
    if opts is None:
        return torch.compile(fn, backend="braze", **kw)
    return torch.compile(fn, backend=lambda gm, ex: braze.braze_backend(gm, ex, opts), **kw)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:4])) + f"-g{c[7]}")
def test_convolution_runs_through_onednn(case):
    torch.manual_seed(0)
    fn, args = _conv_fn(case)
    before = braze.counters()["fallback_ops"]
    out, sources = braze.run_and_get_code(_compile(fn), *args)
    assert braze.counters()["fallback_ops"] == before
    torch.testing.assert_close(out, fn(*args), rtol=1e-4, atol=1e-4)
    assert any("braze_dnnl_conv(site" in s for s in sources), "the convolution did not call oneDNN"


@pytest.mark.parametrize("case", CASES[:4], ids=lambda c: "x".join(map(str, c[:4])))
def test_im2col_path_still_matches(case):
    torch.manual_seed(1)
    fn, args = _conv_fn(case)
    out, sources = braze.run_and_get_code(_compile(fn, braze.Options(dnnl=False)), *args)
    torch.testing.assert_close(out, fn(*args), rtol=1e-4, atol=1e-4)
    assert not any("braze_dnnl_conv(site" in s for s in sources)


def test_channels_last_and_strided_inputs():
    torch.manual_seed(2)
    x = torch.randn(2, 8, 12, 10).to(memory_format=torch.channels_last)
    w = torch.randn(16, 8, 3, 3).to(memory_format=torch.channels_last)
    xt = torch.randn(2, 10, 12, 8).transpose(1, 3)  # a permuted view
    fn = lambda x, w, xt: (F.conv2d(x, w, padding=1), F.conv2d(xt, w, stride=2))
    out = _compile(fn)(x, w, xt)
    ref = fn(x, w, xt)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_dynamic_batch_reuses_one_module():
    torch.manual_seed(3)
    w = torch.randn(6, 4, 3, 3)
    fn = lambda x: F.conv2d(x, w, padding=1).sigmoid()
    c = _compile(fn, dynamic=True)
    for n in (1, 3, 5, 3):
        x = torch.randn(n, 4, 9, 9)
        torch.testing.assert_close(c(x), fn(x), rtol=1e-4, atol=1e-4)


def test_conv_bn_relu_block_and_training():
    torch.manual_seed(4)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                            torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3, stride=2, groups=4))
    x = torch.randn(2, 3, 16, 16, requires_grad=True)
    c = _compile(m)
    out = c(x)
    ref = m(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    g = torch.randn_like(ref)
    (gx,) = torch.autograd.grad(out, x, g)
    (rx,) = torch.autograd.grad(ref, x, g)
    torch.testing.assert_close(gx, rx, rtol=1e-4, atol=1e-4)


def test_weight_changes_between_calls_are_seen():
    # oneDNN may reorder the weight into its own layout; the reordered copy must not be kept.
    torch.manual_seed(5)
    x = torch.randn(2, 8, 10, 10).to(memory_format=torch.channels_last)
    w = torch.randn(8, 8, 3, 3)
    fn = lambda x, w: F.conv2d(x, w, padding=1)
    c = _compile(fn)
    torch.testing.assert_close(c(x, w), fn(x, w), rtol=1e-4, atol=1e-4)
    w.mul_(-0.5)
    torch.testing.assert_close(c(x, w), fn(x, w), rtol=1e-4, atol=1e-4)


class _Block(torch.nn.Module):
    """A residual block and an inverted-residual (depthwise) block: enough convolutions for
    braze to run the graph channels-last inside."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, 2, 1), torch.nn.BatchNorm2d(16),
                                        torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1))
        self.a = torch.nn.Conv2d(16, 16, 3, 1, 1, bias=False)
        self.b = torch.nn.Conv2d(16, 16, 3, 1, 1, bias=False)
        self.expand = torch.nn.Conv2d(16, 48, 1)
        self.dw = torch.nn.Conv2d(48, 48, 3, 2, 1, groups=48)
        self.project = torch.nn.Conv2d(48, 24, 1)
        for m in self.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(x + self.b(torch.relu(self.a(x))))
        y = self.project(torch.nn.functional.relu6(self.dw(torch.nn.functional.relu6(self.expand(x)))))
        return y, y.mean((2, 3)), x[:, :, 1:3]


@pytest.mark.parametrize("channels_last_input", [False, True])
def test_cnn_runs_channels_last_inside(channels_last_input):
    torch.manual_seed(6)
    m = _Block().eval()
    x = torch.randn(2, 3, 33, 31)
    if channels_last_input:
        x = x.to(memory_format=torch.channels_last)
    with torch.no_grad():
        out, sources = braze.run_and_get_code(_compile(m), x)
        ref = m(x)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    # A channels-last convolution hands oneDNN an input whose channel stride is 1.
    nhwc = re.compile(r"x_strides\[4\] = \{[^,]+, INT64_C\(1\),")
    assert any(nhwc.search(s) for s in sources), "the graph did not run channels-last"


def test_cnn_channels_last_training():
    torch.manual_seed(7)
    m = _Block().train()
    x = torch.randn(2, 3, 17, 17, requires_grad=True)
    out = _compile(m)(x)
    ref = m(x)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    grads = torch.autograd.grad(sum(o.sum() for o in out), [x] + list(m.parameters()))
    refs = torch.autograd.grad(sum(o.sum() for o in ref), [x] + list(m.parameters()))
    for a, b in zip(grads, refs):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)
