"""CUDA convolutions through cuDNN: forms, dtypes and layouts match eager (cuDNN's own TF32 off
on both sides), and each runs as a cuDNN call with the loop kernel only as a fallback."""
import pytest
import torch
import torch.nn.functional as F

import braze
from braze import cuda as cuda_support

CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
TOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}

# (spatial dims, in, out, kernel, stride, padding, dilation, groups, bias, size)
CASES = [
    (2, 3, 8, 3, 1, 1, 1, 1, False, 9),
    (2, 6, 4, 3, 2, 1, 2, 2, True, 11),
    (2, 8, 8, 3, 1, 1, 1, 8, False, 10),
    (2, 16, 32, 1, 2, 0, 1, 1, True, 8),
    (2, 5, 8, 7, 2, 3, 1, 1, False, 16),
    (1, 4, 6, 5, 2, 2, 1, 1, True, 20),
    (3, 4, 8, 3, 1, 1, 1, 2, True, 6),
]


@pytest.fixture(autouse=True)
def _cuda_only(device):
    if device != "cuda":
        pytest.skip("cuDNN serves CUDA convolutions")
    if cuda_support.cudnn_library() is None:
        pytest.skip("cuDNN was not found")


@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:4])) + f"-g{c[7]}")
def test_convolution_runs_through_cudnn(case, dtype, channels_last):
    dims, cin, cout, k, stride, padding, dilation, groups, bias, size = case
    if channels_last and dims != 2:
        pytest.skip("channels-last is a 4-d layout")
    torch.manual_seed(0)
    conv = CONV[dims]

    def fn(x, w, *b):
        return torch.relu(conv(x, w, b[0] if b else None, stride=stride, padding=padding,
                               dilation=dilation, groups=groups)) * 2
    x = torch.randn(2, cin, *([size] * dims), dtype=dtype)
    w = torch.randn(cout, cin // groups, *([k] * dims), dtype=dtype) / (cin * k) ** 0.5
    if channels_last:
        x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    args = [x, w] + ([torch.randn(cout, dtype=dtype)] if bias else [])
    torch._dynamo.reset()
    before = braze.counters()["fallback_ops"]
    out, sources = braze.run_and_get_code(torch.compile(fn, backend="braze"), *args)
    assert braze.counters()["fallback_ops"] == before
    tol = TOL[dtype]
    torch.testing.assert_close(out, fn(*args), rtol=tol, atol=tol)
    assert any("api->conv(api->ctx" in s for s in sources), "the convolution did not call cuDNN"


def test_resnet_block_in_half_precision_with_cuda_graphs():
    torch.manual_seed(1)
    m = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1, bias=False),
                            torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
                            torch.nn.Conv2d(32, 32, 3, stride=2, padding=1, groups=4),
                            torch.nn.AdaptiveAvgPool2d(1)).eval().half()
    m = m.to(memory_format=torch.channels_last)
    x = torch.randn(4, 16, 20, 20, dtype=torch.half).to(memory_format=torch.channels_last)
    torch._dynamo.reset()
    c = torch.compile(m, backend="braze")
    with torch.no_grad():
        ref = m(x)
        for _ in range(3):  # the second call captures a CUDA graph, the third replays it
            torch.testing.assert_close(c(x), ref, rtol=2e-2, atol=2e-2)


def test_channels_last_weight_read_by_two_convolutions():
    """A weight two convolutions read (tied, as a shared block applied twice) gets one NHWC
    filter copy in a channels-last graph; each convolution made its own, which gave two
    buffers one name and sent the graph to eager. The training step matches eager, compiled
    whole."""
    torch.manual_seed(2)
    conv = torch.nn.Conv2d(8, 8, 3, padding=1).to(memory_format=torch.channels_last)
    x = torch.randn(2, 8, 12, 12).to(memory_format=torch.channels_last)

    def step(x):
        return conv(torch.relu(conv(x))).square().mean()

    before = braze.counters()
    torch._dynamo.reset()
    torch.compile(step, backend="braze")(x).backward()
    got = [p.grad.clone() for p in conv.parameters()]
    conv.zero_grad()
    step(x).backward()
    for g, p in zip(got, conv.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-4)
    after = braze.counters()
    assert after["fallback_graphs"] == before["fallback_graphs"]
    assert after["fallback_ops"] == before["fallback_ops"]
