"""Convolution, pooling and normalization layers compile (no fallback) and match eager."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import braze

torch.manual_seed(0)
_X = torch.randn(2, 6, 11, 13)


def _x():
    """The shared input, on the device the test runs on (conftest.py)."""
    return _X.to(torch.get_default_device())
W1, W2, B2 = torch.randn(4, 6, 3, 3), torch.randn(4, 3, 3, 2), torch.randn(4)
W3, W4 = torch.randn(6, 1, 3, 3), torch.randn(5, 6, 3)

def _d(t):
    """A module-level tensor on the device the test runs on."""
    return t.to(torch.get_default_device())


CASES = {
    "conv2d": lambda x: F.conv2d(x, _d(W1)),
    "conv2d_stride_pad_groups_bias": lambda x: F.conv2d(x, _d(W2), _d(B2), stride=2, padding=1,
                                                        groups=2),
    "conv2d_depthwise_dilated": lambda x: F.conv2d(x, _d(W3), padding=2, dilation=2, groups=6),
    "conv1d": lambda x: F.conv1d(x[:, :, 0], _d(W4), padding=1),
    "max_pool": lambda x: F.max_pool2d(x, 3, 2, 1),
    "max_pool_ceil": lambda x: F.max_pool2d(x, 2, ceil_mode=True),
    "max_pool_indices": lambda x: F.max_pool2d_with_indices(x, 3, 2, 1)[1],
    "adaptive_avg_pool": lambda x: F.adaptive_avg_pool2d(x, 1),
    "avg_pool": lambda x: F.avg_pool2d(x, 2),
    "avg_pool_pad_ceil": lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True),
    "avg_pool_exclude_pad": lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
    "avg_pool_ceil_exclude_pad": lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True,
                                                        count_include_pad=False),
    "avg_pool_divisor": lambda x: F.avg_pool2d(x, (2, 3), divisor_override=5),
    "batch_norm_eval": lambda x: F.batch_norm(x, torch.arange(6.0, device=x.device),
                                              torch.arange(1.0, 7.0, device=x.device),
                                              torch.ones(6, device=x.device) * 2,
                                              torch.zeros(6, device=x.device), False),
    # Training without running statistics (track_running_stats=False, instance-norm style):
    # aten._native_batch_norm_legit.no_stats, which fell back to eager.
    "batch_norm_train_no_stats": lambda x: F.batch_norm(x, None, None,
                                                        torch.linspace(0.5, 2, 6, device=x.device),
                                                        torch.ones(6, device=x.device), True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_compiles(name):
    fn = CASES[name]
    before = braze.counters()["fallback_ops"]
    out = torch.compile(fn, backend="braze", dynamic=False)(_x())
    torch.testing.assert_close(out, fn(_x()), rtol=1e-4, atol=1e-4)
    assert braze.counters()["fallback_ops"] == before


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.down(x) if self.down is not None else x))


def resnet_like():
    """A ResNet-18-shaped CNN at reduced width: stem, four stages of two basic blocks, head."""
    layers = [nn.Conv2d(3, 8, 7, 2, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 8
    for cout, stride in ((8, 1), (16, 2), (32, 2), (64, 2)):
        layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10)]
    model = nn.Sequential(*layers).eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.normal_(0, 0.1)
    return model


def test_resnet_shaped_cnn_is_one_graph_without_fallback():
    torch.manual_seed(0)
    model = resnet_like()
    x = torch.randn(2, 3, 64, 64)
    before = braze.counters()
    with torch.no_grad():
        out, code = braze.run_and_get_code(torch.compile(model, backend="braze"), x)
        torch.testing.assert_close(out, model(x), rtol=1e-3, atol=1e-3)
    after = braze.counters()
    assert len(code) == 1
    assert after["fallback_ops"] == before["fallback_ops"]
    assert after["fallback_graphs"] == before["fallback_graphs"]


def _no_further_than_eager(got, eager, exact):
    """Each of braze's results is no further from the float64 one than twice eager's, plus 2e-6
    (16 f32 roundings), relative to the result's largest magnitude: braze's sums run in another
    order than eager's (a weight gradient over 32768 positions differs by about 1e-6). A
    variance whose f32 sums cancelled would be off by about 1e-2 here."""
    for k, (g, w, e) in enumerate(zip(got, eager, exact)):
        scale = max(float(e.abs().max()), 1e-30)
        braze_err = float((g.double() - e).abs().max()) / scale
        eager_err = float((w.double() - e).abs().max()) / scale
        assert braze_err <= 2 * eager_err + 2e-6, (k, braze_err, eager_err)


@pytest.mark.parametrize("offset", (0.0, 1e3))
@pytest.mark.parametrize("channels_last", (False, True))
def test_batch_norm_statistics_in_one_pass_are_as_close_as_eager(offset, channels_last):
    # Training batch norm over 8 x 64 x 64 positions: its variance is one pass of float64 sums
    # (decompose's one-pass variance), so the input is read once. Against a float64 run, braze's
    # output, running statistics and gradients are no further off than eager's float32 ones,
    # also with a mean 300 stds from zero, where an f32 sum of squares would cancel.
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(8, 16, 64, 64, generator=g, device="cpu") * 3 + offset).to(
        torch.get_default_device())
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    up = torch.randn(x.shape, generator=g, device="cpu").to(x.device)
    results = []
    for which in ("braze", "eager", "float64"):
        bn = nn.BatchNorm2d(16).to(x.device).train()
        xi = (x.double() if which == "float64" else x).clone().requires_grad_()
        if which == "float64":
            bn = bn.double()
        f = torch.compile(bn, backend="braze") if which == "braze" else bn
        torch._dynamo.reset()
        out = f(xi)
        (out * up.to(out.dtype)).sum().backward()
        results.append([out.detach(), bn.running_mean, bn.running_var, xi.grad, bn.weight.grad,
                        bn.bias.grad])
    _no_further_than_eager(*results)


@pytest.mark.parametrize("offset", (0.0, 1e3))
def test_column_variances_in_one_pass_are_as_close_as_eager(offset):
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(40000, 8, generator=g, device="cpu") * 2 + offset).to(
        torch.get_default_device())

    def stats(x):
        v, m = torch.var_mean(x, 0, correction=1)
        return v, m, x.var(0, correction=0, keepdim=True), x.std(0)
    torch._dynamo.reset()
    got = torch.compile(stats, backend="braze")(x)
    exact = [t.double() for t in stats(x.double())]
    _no_further_than_eager(got, stats(x), exact)
    assert all(a.dtype == b.dtype and a.shape == b.shape for a, b in zip(got, stats(x)))
