"""FX rules for neural-network layers: convolution (transposed too), pooling (max, average,
adaptive and max pooling's backward, each one braze graph op that lowering/decompose/Pooling.cpp
lowers), grid sampling, distances (cdist, pdist), embedding bags and the half-precision
soft-margin loss."""
import math
import operator

import torch

from braze.registry import FLOAT_DTYPES, rule, Unsupported, dtype_name, aten, prims  # noqa: F401


def _as_list(v, n):
    """A per-dim parameter given once or per dim, as a list of n ints."""
    if isinstance(v, (list, tuple)):
        v = list(v)
        if len(v) == 1:
            v = v * n
    else:
        v = [v] * n
    if len(v) != n or not all(isinstance(e, int) for e in v):
        raise Unsupported(f"parameter {v!r} for {n} spatial dims")
    return v


def _static_sizes(t, h, dims):
    out = []
    for d in dims:
        n = t.g.sym_str(t.g.shape(h)[d])
        if not n.lstrip("-").isdigit():
            raise Unsupported("dynamic spatial sizes")
        out.append(int(n))
    return out


# ---- convolution ----------------------------------------------------------------------------

@rule(aten.convolution.default)
def _convolution(t, node, x, w, bias, stride, padding, dilation, transposed, output_padding,
                 groups):
    xh, wh = t.arg(x), t.arg(w)
    b = t.arg(bias) if bias is not None else None
    if not transposed:
        return t.g.convolution(xh, wh, b, list(stride), list(padding), list(dilation), groups)
    return _conv_transpose(t, xh, wh, b, stride, padding, dilation, output_padding, groups)


# Whether convolution_backward compiles on CUDA, where its convolutions (one over the batch as
# channels, with the output gradient as a kernel) go to cuDNN's forward kernels. On: H200 f32
# training steps (benchmarks/cnn_training.py --device cuda) were faster with it than with
# cuDNN's backward kernels in eager, and ran as one graph pair (ViT 2.8 -> 2.7 ms, ResNet-18
# shaped 3.2 -> 3.0, MobileNetV2 8.3 -> 7.6). False sends every one on CUDA to eager, counted.
COMPILE_CUDA_CONV_BACKWARD = True

# The weight gradient on CUDA runs as cuDNN's backward-filter convolution (conv_weight_grad).
# Without cuDNN it decomposes into a forward convolution whose output is the weight (few
# positions) and whose reduction runs over the batch and the output gradient's positions,
# which braze's kernels run on a handful of blocks when it is long: there, above this many
# positions, the whole convolution_backward runs in eager, counted. (With cuDNN's forward
# kernels in that form, a torchvision ResNet-50 step took 252 ms against 24 ms in eager on the
# H200.)
CUDA_WEIGHT_GRAD_MAX_POSITIONS = 8192


@rule(aten.convolution_backward.default)
def _convolution_backward(t, node, grad_out, x, w, bias_sizes, stride, padding, dilation,
                          transposed, output_padding, groups, output_mask):
    """The input, weight and bias gradients output_mask asks for, from transposed and plain
    convolutions (GraphBuilder::convolutionBackward, which reads a transposed convolution's
    output padding from the sizes); None where it does not."""
    dt = t.g.dtype(t.arg(x))
    if dt not in FLOAT_DTYPES:
        raise Unsupported(f"convolution backward in {dt}")
    if x.meta["val"].device.type == "cuda":
        if not COMPILE_CUDA_CONV_BACKWARD:
            raise Unsupported("convolution backward on CUDA (COMPILE_CUDA_CONV_BACKWARD is off)")
        from braze import cuda as cuda_support
        dy = grad_out.meta["val"].shape
        positions = math.prod(dy[:1] + dy[2:])  # summed over for each weight element
        if output_mask[1] and cuda_support.cudnn_library() is None and not (
                isinstance(positions, int) and positions <= CUDA_WEIGHT_GRAD_MAX_POSITIONS):
            raise Unsupported(f"convolution weight gradient on CUDA without cuDNN summing over "
                              f"{positions} positions (over {CUDA_WEIGHT_GRAD_MAX_POSITIONS}: "
                              f"braze's kernels would run it on a few blocks)")
    return tuple(t.g.convolution_backward(t.arg(grad_out), t.arg(x), t.arg(w), list(stride),
                                          list(padding), list(dilation), bool(transposed),
                                          int(groups), [bool(m) for m in output_mask]))


def _conv_transpose(t, x, w, bias, stride, padding, dilation, output_padding, groups):
    """One conv_transpose op (lowering/decompose/ConvTranspose.cpp); half precision rounds as
    eager's kernel on the target does (CompileOptions::oneDnnHalf, cpu.one_dnn_half)."""
    dt = t.g.dtype(x)
    if dt not in FLOAT_DTYPES + ("i64",):
        raise Unsupported(f"transposed convolution in {dt} (eager has no such kernel)")
    spatial = len(t.g.shape(x)) - 2
    if spatial < 1 or spatial > 3:
        raise Unsupported(f"transposed convolution of rank {spatial + 2}")
    stride, padding = _as_list(stride, spatial), _as_list(padding, spatial)
    dilation, output_padding = _as_list(dilation, spatial), _as_list(output_padding, spatial)
    return t.g.conv_transpose(x, w, bias, stride, padding, dilation, output_padding, groups)


# ---- pooling: max_pool, avg_pool, adaptive pooling and max_pool_grad ops -------------------

def _window_args(n, kernel, stride, padding, dilation):
    """Per-dim window parameters as n-entry lists; an empty stride stays empty (the kernel)."""
    stride = [] if stride in (None, [], ()) else _as_list(stride, n)
    return _as_list(kernel, n), stride, _as_list(padding, n), _as_list(dilation, n)


@rule(aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default)
def _max_pool(t, node, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    n = 3 if node.target is aten.max_pool3d_with_indices.default else 2
    return t.g.max_pool(t.arg(x), n, *_window_args(n, kernel_size, stride, padding, dilation),
                        bool(ceil_mode))


@rule(aten.avg_pool2d.default, aten.avg_pool3d.default)
def _avg_pool(t, node, x, kernel_size, stride=(), padding=0, ceil_mode=False,
              count_include_pad=True, divisor_override=None):
    n = 3 if node.target is aten.avg_pool3d.default else 2
    kernel, stride, padding, _ = _window_args(n, kernel_size, stride, padding, 1)
    return t.g.avg_pool(t.arg(x), n, kernel, stride, padding, bool(ceil_mode),
                        bool(count_include_pad), int(divisor_override or 0))


@rule(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def _adaptive_max_pool(t, node, x, output_size):
    n = 3 if node.target is aten.adaptive_max_pool3d.default else 2
    return t.g.adaptive_max_pool(t.arg(x), _as_list(output_size, n))


@rule(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default)
def _adaptive_avg_pool(t, node, x, output_size):
    n = 3 if node.target is aten._adaptive_avg_pool3d.default else 2
    return t.g.adaptive_avg_pool(t.arg(x), _as_list(output_size, n))


@rule(aten._adaptive_avg_pool2d_backward.default, aten._adaptive_avg_pool3d_backward.default)
def _adaptive_avg_pool_backward(t, node, grad, x):
    n = 3 if node.target is aten._adaptive_avg_pool3d_backward.default else 2
    return t.g.adaptive_avg_pool_grad(t.arg(grad), t.arg(x), n)


@rule(aten.adaptive_max_pool2d_backward.default, aten.adaptive_max_pool3d_backward.default)
def _adaptive_max_pool_backward(t, node, grad, x, indices):
    n = 3 if node.target is aten.adaptive_max_pool3d_backward.default else 2
    return t.g.adaptive_max_pool_grad(t.arg(grad), t.arg(x), t.arg(indices), n)


@rule(aten.max_pool2d_with_indices_backward.default, aten.max_pool3d_with_indices_backward.default)
def _max_pool_backward(t, node, grad, x, kernel_size, stride, padding, dilation, ceil_mode,
                       indices):
    n = 3 if node.target is aten.max_pool3d_with_indices_backward.default else 2
    return t.g.max_pool_grad(t.arg(grad), t.arg(x), t.arg(indices),
                             *_window_args(n, kernel_size, stride, padding, dilation),
                             bool(ceil_mode))


# ---- losses ---------------------------------------------------------------------------------

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}  # PyTorch's enum of loss reductions


@rule(aten.soft_margin_loss.default)
def _soft_margin_loss(t, node, x, y, reduction=1):
    """One soft_margin_loss op (op by op as eager's kernel; lowering/decompose/Arithmetic.cpp).
    The backend keeps this op whole only for half precision: PyTorch's decomposition computes
    in f32 there."""
    if reduction not in _REDUCTIONS:
        raise Unsupported(f"soft_margin_loss with reduction {reduction!r}")
    return t.g.soft_margin_loss(t.arg(x), t.arg(y), _REDUCTIONS[reduction])


# ---- grid sampling: one grid_sample op (lowering/decompose/GridSample.cpp) ------------------

_GRID_MODES = ("bilinear", "nearest", "bicubic")
_GRID_PADDINGS = ("zeros", "border", "reflection")


@rule(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)
def _grid_sampler(t, node, x, grid, mode, padding_mode, align_corners):
    if mode not in (0, 1, 2) or padding_mode not in (0, 1, 2):
        raise Unsupported(f"grid_sampler mode {mode} padding {padding_mode}")
    return t.g.grid_sample(t.arg(x), t.arg(grid), _GRID_MODES[mode], _GRID_PADDINGS[padding_mode],
                           bool(align_corners))


# ---- distances ------------------------------------------------------------------------------

@rule(aten._cdist_forward.default)
def _cdist_forward(t, node, x1, x2, p, compute_mode=None):
    """One cdist op, in the form eager picks: the matrix-product form for p = 2 with
    compute_mode 1, or compute_mode 0/None and more than 25 rows on a side; else the direct
    sum over the feature dim."""
    a, b = t.arg(x1), t.arg(x2)
    ra, rb = len(t.g.shape(a)), len(t.g.shape(b))
    if ra < 2 or rb < 2:
        raise Unsupported("cdist of rank < 2")
    r1, m = _static_sizes(t, a, [ra - 2, ra - 1])
    r2, _ = _static_sizes(t, b, [rb - 2, rb - 1])
    if min(r1, r2, m) == 0:
        raise Unsupported("cdist of empty inputs")
    mode = 0 if compute_mode is None else compute_mode
    matmul_form = p == 2 and (mode == 1 or (mode == 0 and (r1 > 25 or r2 > 25)))
    return t.g.cdist(a, b, float(p), matmul_form)


@rule(aten._pdist_forward.default)
def _pdist_forward(t, node, x, p=2.0):
    """One pdist op: the upper triangle (row-major) of the pairwise distance matrix."""
    return t.g.pdist(t.arg(x), float(p))


# ---- embedding bags -------------------------------------------------------------------------

@rule(aten._embedding_bag_forward_only.default, aten._embedding_bag.default)
def _embedding_bag(t, node, weight, indices, offsets, scale_grad_by_freq=False, mode=0,
                   sparse=False, per_sample_weights=None, include_last_offset=False,
                   padding_idx=-1):
    """One embedding_bag op (GraphBuilder::embeddingBag). Only the output is computed: reading
    offset2bag, bag_size or max_indices falls back."""
    for user in node.users:
        if not (user.target is operator.getitem and user.args[1] == 0):
            raise Unsupported("embedding_bag's auxiliary outputs")
    if mode not in (0, 1, 2):
        raise Unsupported(f"embedding_bag mode {mode}")
    rows = weight.meta["val"].shape[0]
    if padding_idx is None or padding_idx == -1:
        padding_idx = -1
    elif padding_idx < -1:  # counts from the end
        padding_idx += rows
    dt = weight.meta["val"].dtype
    if include_last_offset and (mode != 0 or padding_idx >= 0
                                or dt not in (torch.float32, torch.float16)):
        # Where the last offset is not len(indices), eager's kernels disagree on the last bag:
        # the f32 and f16 plain sums stop at the last offset (as braze does); the others (f64,
        # bf16, mean, max, a sum with padding_idx) run to the end of `indices`, or do either.
        raise Unsupported("embedding_bag with include_last_offset, except an f32 or f16 plain sum")
    two_d = len(indices.meta["val"].shape) == 2
    out = t.g.embedding_bag(t.arg(weight), t.arg(indices), None if two_d else t.arg(offsets),
                            None if per_sample_weights is None else t.arg(per_sample_weights),
                            ("sum", "mean", "max")[mode], padding_idx, bool(include_last_offset))
    # The auxiliary outputs are never read (checked above); empty i64 stand-ins fill the tuple.
    unused = t.g.full(0.0, "i64", [t.g.sym_const(0)])
    return (out, unused, unused, unused)
