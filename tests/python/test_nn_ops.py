"""Transposed / 3-d / integer convolution, N-d and adaptive pooling, max-pooling backward, grid
sampling, distances, embedding bags and soft-margin loss compile (no fallback) and match eager."""
import pytest
import torch
import torch.nn.functional as F

import braze
from _device import eager, eager_cpu, on_cuda

HALF = (torch.float16, torch.bfloat16)


def compiled_matches(fn, *args, exact_half=False, cuda_half_tol=1e-2, reference=eager):
    """exact_half: half-precision results equal eager's bit for bit, which braze guarantees
    against eager's CPU kernels (their rounding order); CUDA kernels round in their own order,
    and library kernels (cuDNN) sum in theirs: cuda_half_tol bounds the difference there.
    `reference` computes the expected result (eager_cpu: the CPU kernels' on every device)."""
    torch._dynamo.reset()
    before = braze.counters()["fallback_ops"]
    expected = reference(fn, *args)
    actual = torch.compile(fn, backend="braze")(*args)
    assert braze.counters()["fallback_ops"] == before, "an op fell back to eager"
    tol = {}
    if args[0].dtype in HALF:
        exact = exact_half and not on_cuda(*args)
        t = cuda_half_tol if on_cuda(*args) else 1e-2
        tol = dict(atol=0, rtol=0) if exact else dict(atol=t, rtol=t)
    torch.testing.assert_close(actual, expected, equal_nan=True, **tol)


def rand(*shape, dtype=torch.float32):
    if dtype.is_floating_point:
        return (torch.randn(*shape) * 3).to(dtype)
    return torch.randint(-20, 20, shape).to(dtype)


def test_convolution():
    # Transposed 1/2/3-d (stride, padding, output_padding, dilation, groups), 3-d, and integer
    # convolution (which wraps around in the dtype, as eager's does).
    torch.manual_seed(0)
    compiled_matches(lambda x1, w1, b, x2, w2, x3, w3: (
        F.conv_transpose1d(x1, w1, b, stride=2, padding=1, output_padding=1, groups=2,
                           dilation=2),
        F.conv_transpose2d(x2, w2, stride=(2, 3), padding=(0, 2), output_padding=(1, 0)),
        F.conv_transpose3d(x3, w3, stride=2, padding=1, groups=2),
        F.conv3d(x3, w3.transpose(0, 1).contiguous(), stride=2, padding=1)),
        rand(2, 4, 7), rand(4, 3, 3), rand(6), rand(2, 4, 5, 6), rand(4, 3, 3, 4),
        rand(1, 4, 3, 4, 3), rand(4, 2, 2, 3, 2))
    compiled_matches(lambda x, w, v: (F.conv_transpose2d(x, w, stride=2, padding=1),
                                      F.conv2d(x, w, padding=1), F.conv3d(v, v[:2, :4])),
                     rand(2, 4, 5, 6, dtype=torch.int64), rand(4, 4, 3, 2, dtype=torch.int64),
                     rand(2, 4, 3, 3, 3, dtype=torch.int64))
    compiled_matches(lambda x, w: F.conv1d(x, w, padding=1), rand(2, 3, 9, dtype=torch.int8),
                     rand(4, 3, 3, dtype=torch.int8))


@pytest.mark.parametrize("dtype", HALF)
def test_transposed_convolution_rounds_like_eager(dtype):
    # Eager's gemm + col2im kernel (or oneDNN, for bf16 on CPUs that have it; never with an
    # output_padding as large as the stride) fixes where half-precision results round; braze
    # follows it bit for bit.
    torch.manual_seed(1)
    x, w, b = rand(2, 4, 5, 5, dtype=dtype), rand(4, 3, 3, 3, dtype=dtype), rand(6, dtype=dtype)
    compiled_matches(lambda x, w, b: (
        F.conv_transpose2d(x, w, b, stride=2, padding=1, groups=2),
        F.conv_transpose2d(x, w[:, :2], b[:2], stride=(3, 2), padding=(1, 2),
                           output_padding=(2, 1), dilation=2)), x, w, b, exact_half=True)


def test_pooling():
    # 3-d max pooling with indices (float and integer), 3-d and integer average pooling (i64
    # averages round toward zero, as eager's kernel), and ceil mode's bottom-right window that
    # spans declared padding in one dim and the extra ceil-mode rows in the other.
    torch.manual_seed(0)
    compiled_matches(lambda x, i, j: (
        F.max_pool3d(x, (2, 3, 2), stride=(1, 2, 2), padding=1, dilation=(1, 1, 2),
                     ceil_mode=True, return_indices=True),
        F.max_pool3d(i, 2, return_indices=True),
        F.avg_pool3d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
        F.avg_pool3d(j, (2, 1, 3), divisor_override=4),
        F.avg_pool2d(j[0], 3, 2, 1, ceil_mode=True),
        F.avg_pool2d(torch.ones_like(x[0]), 3, 2, 1, ceil_mode=True)),
        rand(2, 3, 5, 6, 7), rand(2, 3, 4, 4, 5, dtype=torch.int32),
        rand(2, 3, 6, 7, 5, dtype=torch.int64))



@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
@pytest.mark.parametrize("channels_last", [False, True])
def test_max_pool_indices_nan_and_lowest_windows(dtype, channels_last):
    # Eager's index: the last NaN of a window (its test is `v > max || isnan(v)`), and where
    # every tap inside the input holds the lowest value (-inf), the first tap inside, never one
    # in the padding. Ties keep the first maximum. The reference is eager's CPU kernels on
    # every device: eager's CUDA kernel for channels-last images starts each window's index at
    # 0, so a window of only the lowest value gets index 0, a position outside most windows
    # (an H200 run of this test against it: 28 of 672 indices of the first pool differ; the
    # largest, 128 at [0, 2, 5, 6], is that window's first tap inside, row 9 column 11 of 13).
    torch.manual_seed(0)
    x = torch.randint(0, 3, (2, 8, 11, 13)).to(dtype)
    if dtype.is_floating_point:
        x[torch.rand(x.shape) < 0.1] = float("nan")
        x[:, :4][torch.rand(2, 4, 11, 13) < 0.7] = float("-inf")
    else:
        x[:, :4][torch.rand(2, 4, 11, 13) < 0.7] = torch.iinfo(dtype).min
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    compiled_matches(lambda x: (
        F.max_pool2d(x, 3, 2, 1, return_indices=True),
        F.max_pool2d(x, 3, 2, 1, dilation=2, ceil_mode=True, return_indices=True),
        F.max_pool1d(x[0], 4, 3, 2, return_indices=True),
        F.adaptive_max_pool2d(x, (4, 5), return_indices=True) if dtype.is_floating_point
        else ()), x, reference=eager_cpu)

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_adaptive_pooling(dtype):
    # bf16 matches exactly: eager's 3-d average kernel rounds every step in half precision.
    torch.manual_seed(0)
    compiled_matches(lambda x: (
        F.adaptive_max_pool2d(x[0], (3, 4), return_indices=True),
        F.adaptive_max_pool3d(x, (2, 3, 5), return_indices=True),
        F.adaptive_avg_pool2d(x[0], (3, 4)),
        F.adaptive_avg_pool3d(x, (2, 4, 3))), rand(2, 3, 7, 9, 5, dtype=dtype),
        exact_half=True)


def test_max_pool2d_backward():
    torch.manual_seed(0)
    x = rand(2, 3, 7, 9)
    y, i = F.max_pool2d_with_indices(x, (3, 2), (2, 1), 1, dilation=(1, 2), ceil_mode=True)
    compiled_matches(lambda g, x, i: torch.ops.aten.max_pool2d_with_indices_backward(
        g, x, [3, 2], [2, 1], [1, 1], [1, 2], True, i), rand(*y.shape), x, i)


def test_max_pool3d_backward_and_adaptive_pooling_backward():
    # Windows that overlap (adaptive 9 -> 4) and ones of different lengths (7 -> 3); the 3-d
    # max pooling backward over dilated, ceil-mode windows.
    torch.manual_seed(0)
    x3 = rand(1, 2, 5, 6, 7)
    y, i = F.max_pool3d_with_indices(x3, (3, 2, 2), (2, 1, 2), 1, dilation=(1, 2, 1),
                                     ceil_mode=True)
    compiled_matches(lambda g, x, i: torch.ops.aten.max_pool3d_with_indices_backward(
        g, x, [3, 2, 2], [2, 1, 2], [1, 1, 1], [1, 2, 1], True, i), rand(*y.shape), x3, i)
    x = rand(2, 3, 9, 7)
    compiled_matches(lambda g, x: torch.ops.aten._adaptive_avg_pool2d_backward(g, x),
                     rand(2, 3, 4, 3), x)
    compiled_matches(lambda g, x: torch.ops.aten._adaptive_avg_pool3d_backward(g, x),
                     rand(1, 2, 2, 3, 4), x3)
    _, i2 = F.adaptive_max_pool2d(x, (4, 3), return_indices=True)
    compiled_matches(lambda g, x, i: torch.ops.aten.adaptive_max_pool2d_backward(g, x, i),
                     rand(2, 3, 4, 3), x, i2)
    _, i3 = F.adaptive_max_pool3d(x3, (2, 3, 4), return_indices=True)
    compiled_matches(lambda g, x, i: torch.ops.aten.adaptive_max_pool3d_backward(g, x, i),
                     rand(1, 2, 2, 3, 4), x3, i3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_depthwise_convolution(dtype):
    # One channel per group (a fused window sum), 1-3 spatial dims, bias, stride, padding,
    # dilation; and a channel multiplier of 2 (the grouped-matmul form).
    torch.manual_seed(0)
    compiled_matches(lambda x1, w1, b, x2, w2, x3, w3, wm: (
        F.conv1d(x1, w1, b, stride=2, padding=2, groups=6),
        F.conv2d(x2, w2, b, padding=1, groups=6),
        F.conv2d(x2, w2, stride=(2, 1), padding=(0, 2), dilation=2, groups=6),
        F.conv3d(x3, w3, padding=1, groups=6),
        F.conv2d(x2, wm, padding=1, groups=6)),
        rand(2, 6, 11, dtype=dtype), rand(6, 1, 5, dtype=dtype), rand(6, dtype=dtype),
        rand(2, 6, 9, 8, dtype=dtype), rand(6, 1, 3, 3, dtype=dtype),
        rand(1, 6, 4, 5, 3, dtype=dtype), rand(6, 1, 3, 3, 3, dtype=dtype),
        rand(12, 1, 3, 3, dtype=dtype), cuda_half_tol=5e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grid_sample(dtype):
    # bf16 matches because braze computes in the dtype in eager's order of operations.
    torch.manual_seed(0)
    x2, g2 = rand(2, 3, 5, 6, dtype=dtype), (torch.rand(2, 4, 7, 2) * 2.6 - 1.3).to(dtype)
    x3, g3 = rand(1, 2, 4, 5, 3, dtype=dtype), (torch.rand(1, 3, 2, 4, 3) * 2.6 - 1.3).to(dtype)
    compiled_matches(lambda x2, g2, x3, g3: (
        F.grid_sample(x2, g2, mode="bilinear", padding_mode="reflection", align_corners=False),
        F.grid_sample(x2, g2, mode="nearest", padding_mode="border", align_corners=True),
        F.grid_sample(x2, g2, mode="bicubic", padding_mode="zeros", align_corners=False),
        F.grid_sample(x3, g3, mode="bilinear", padding_mode="zeros", align_corners=True),
        F.grid_sample(x3, g3, mode="nearest", padding_mode="reflection", align_corners=True)),
        x2, g2, x3, g3)


def test_distances():
    torch.manual_seed(0)
    a, b = rand(2, 30, 4, dtype=torch.float64), rand(2, 7, 4, dtype=torch.float64)
    compiled_matches(lambda a, b: (
        torch.cdist(a, b),  # matrix-product form (more than 25 rows)
        torch.cdist(a[:, :5], b, p=1), torch.cdist(a[:, :5], b, p=0),
        torch.cdist(a[:, :5], b, p=float("inf")), torch.cdist(a[:, :5], b, p=3.5),
        F.pdist(a[0, :9]), F.pdist(a[0, :9], p=1), F.pdist(a[0, :1])), a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_embedding_bag(dtype):
    torch.manual_seed(0)
    idx, off = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 3, 3, 6])
    # With include_last_offset the last offset is the number of indices (eager's CPU and CUDA
    # kernels disagree about a last bag that stops short of it).
    csr = torch.tensor([0, 3, 3, 8])
    compiled_matches(lambda w, i, o, p, c: (
        F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p),
        F.embedding_bag(i, w, o, mode="mean"),
        F.embedding_bag(i, w, o, mode="max"),
        F.embedding_bag(i.view(2, 4), w, mode="mean", padding_idx=2),
        F.embedding_bag(i, w, c, mode="sum", include_last_offset=True)),
        rand(10, 5, dtype=dtype), idx, off, rand(8, dtype=dtype), csr)


def test_soft_margin_loss_half():
    torch.manual_seed(0)
    x, y = rand(6, 5, dtype=torch.float16), rand(6, 5, dtype=torch.float16)
    compiled_matches(lambda x, y: (F.soft_margin_loss(x, y), F.soft_margin_loss(x, y, reduction="none")),
                     x, y)


def test_embedding_bag_index_out_of_range_is_an_error():
    w, idx, off = torch.randn(4, 3), torch.tensor([0, 7]), torch.tensor([0])
    fn = torch.compile(lambda w, i, o: F.embedding_bag(i, w, o), backend="braze")
    with pytest.raises(Exception, match="out of (range|bounds)|index"):
        fn(w, idx, off)
