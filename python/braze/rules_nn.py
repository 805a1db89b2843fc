"""FX rules for neural-network layers: convolution (transposed too), pooling (max, average,
adaptive and max pooling's backward, each one braze graph op that lowering/decompose/Pooling.cpp
lowers), grid sampling, distances (cdist, pdist), embedding bags and the half-precision
soft-margin loss."""
import math
import operator

import torch

from braze.fx_import import FLOAT_DTYPES, ew, rule, Unsupported, dtype_name, aten, prims  # noqa: F401

_HALF = ("f16", "bf16")


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


def _i64(t, v):
    return t.g.full(float(v), "i64", [])


# ---- convolution ----------------------------------------------------------------------------

@rule(aten.convolution.default)
def _convolution(t, node, x, w, bias, stride, padding, dilation, transposed, output_padding,
                 groups):
    xh, wh = t.arg(x), t.arg(w)
    b = t.arg(bias) if bias is not None else None
    if not transposed:
        return t.g.convolution(xh, wh, b, list(stride), list(padding), list(dilation), groups)
    return _conv_transpose(t, xh, wh, b, stride, padding, dilation, output_padding, groups)


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


@rule(aten.max_pool2d_with_indices_backward.default, aten.max_pool3d_with_indices_backward.default)
def _max_pool_backward(t, node, grad, x, kernel_size, stride, padding, dilation, ceil_mode,
                       indices):
    n = 3 if node.target is aten.max_pool3d_with_indices_backward.default else 2
    return t.g.max_pool_grad(t.arg(grad), t.arg(x), t.arg(indices),
                             *_window_args(n, kernel_size, stride, padding, dilation),
                             bool(ceil_mode))


# ---- losses ---------------------------------------------------------------------------------

@rule(aten.soft_margin_loss.default)
def _soft_margin_loss(t, node, x, y, reduction=1):
    """log1p(exp(-x * y)), op by op as eager's kernel (each half-precision step rounds); the
    backend keeps this op whole only for half precision (PyTorch's decomposition computes in
    f32 there)."""
    xh, yh = t.arg(x), t.arg(y)
    if t.g.dtype(xh) != t.g.dtype(yh) or reduction not in (0, 1, 2):
        raise Unsupported("soft_margin_loss of mixed dtypes or an unknown reduction")
    loss = ew(t, "log1p", ew(t, "exp", ew(t, "mul", ew(t, "neg", xh), yh)))
    if reduction == 0:
        return loss
    dims = list(range(len(t.g.shape(loss))))
    return t.g.mean(loss, dims, False) if reduction == 1 else t.g.reduce("sum", loss, dims, False, None)


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
    """Bag b of a 1-d `indices` holds the positions i with offsets[b] <= i < offsets[b + 1];
    its rows are weight[indices[i]] (times per_sample_weights), less those equal to
    padding_idx, reduced by sum, mean or max (an empty bag gives zeros). Only the output is
    computed: reading offset2bag, bag_size or max_indices falls back."""
    for user in node.users:
        if not (user.target is operator.getitem and user.args[1] == 0):
            raise Unsupported("embedding_bag's auxiliary outputs")
    w, idx, off = t.arg(weight), t.arg(indices), t.arg(offsets)
    dt = t.g.dtype(w)
    if dt not in FLOAT_DTYPES or mode not in (0, 1, 2):
        raise Unsupported(f"embedding_bag of {dt} mode {mode}")
    if len(t.g.shape(w)) != 2 or len(t.g.shape(idx)) not in (1, 2):
        raise Unsupported("embedding_bag of unexpected ranks")
    if include_last_offset and (mode != 0 or (padding_idx is not None and padding_idx >= 0)):
        # Eager's mean and max (and its sum with padding_idx) then let the last bag run to the
        # end of `indices`, while its plain sum stops at the last offset.
        raise Unsupported("embedding_bag with include_last_offset, except a plain sum")
    work = "f32" if dt in _HALF else dt
    rows_w = _static_sizes(t, w, [0])[0]
    if len(t.g.shape(idx)) == 2:
        nb, per = _static_sizes(t, idx, [0, 1])
        idx = t.g.reshape(idx, [t.g.sym_const(nb * per)])
        length = nb * per
        pos = t.g.iota("i64", [t.g.sym_const(length)], 0)
        bag = ew(t, "floordiv", pos, _i64(t, max(per, 1)))
        end_ok = None
    else:
        length = _static_sizes(t, idx, [0])[0]
        noff = _static_sizes(t, off, [0])[0]
        nb = noff - 1 if include_last_offset else noff
        if nb <= 0:
            raise Unsupported("embedding_bag without bags")
        pos = t.g.iota("i64", [t.g.sym_const(length)], 0)
        offs = t.g.convert(off, "i64")
        starts = t.g.slice(offs, 0, 0, nb, 1)
        # bag(i) = #{b : offsets[b] <= i} - 1
        le = ew(t, "le", t.g.reshape(starts, [t.g.sym_const(1), t.g.sym_const(nb)]),
                 t.g.reshape(pos, [t.g.sym_const(length), t.g.sym_const(1)]))
        bag = ew(t, "sub", t.g.reduce("sum", t.g.convert(le, "i64"), [1], False, None), _i64(t, 1))
        end_ok = None
        if include_last_offset:
            end_ok = ew(t, "lt", pos, t.g.select(offs, 0, nb))
    idx = t.g.convert(idx, "i64")
    bags = t.g.iota("i64", [t.g.sym_const(nb), t.g.sym_const(1)], 0)
    member = ew(t, "eq", t.g.reshape(bag, [t.g.sym_const(1), t.g.sym_const(length)]), bags)
    if end_ok is not None:
        member = ew(t, "logical_and", member, end_ok)
    if padding_idx is not None and padding_idx >= 0:
        member = ew(t, "logical_and", member, ew(t, "ne", idx, _i64(t, padding_idx)))
    elif padding_idx is not None and padding_idx < -1:
        member = ew(t, "logical_and", member, ew(t, "ne", idx, _i64(t, padding_idx + rows_w)))
    rows = t.g.convert(t.g.take(w, 0, idx), work)  # [L, D]
    if per_sample_weights is not None:
        if mode != 0:
            raise Unsupported("per_sample_weights with a mode other than sum")
        psw = t.g.convert(t.g.reshape(t.arg(per_sample_weights), [t.g.sym_const(length)]), work)
        rows = ew(t, "mul", rows, t.g.unsqueeze(psw, 1))
    m3 = t.g.unsqueeze(member, 2)  # [B, L, 1]
    rows3 = t.g.unsqueeze(rows, 0)  # [1, L, D]
    zero = t.g.full(0.0, work, [])
    if mode == 2:
        picked = ew(t, "where", m3, rows3, t.g.full(-math.inf, work, []))
        out = t.g.reduce("amax", picked, [1], False, None)
        nonempty = t.g.reduce("any", member, [1], True, None)
        out = ew(t, "where", nonempty, out, zero)
    else:
        out = t.g.reduce("sum", ew(t, "where", m3, rows3, zero), [1], False, None)
        if mode == 1:
            count = t.g.reduce("sum", t.g.convert(member, work), [1], True, None)
            out = ew(t, "div", out, ew(t, "maximum", count, t.g.full(1.0, work, [])))
    # The auxiliary outputs are never read (checked above); empty i64 stand-ins fill the tuple.
    unused = t.g.full(0.0, "i64", [t.g.sym_const(0)])
    return (t.g.convert(out, dt), unused, unused, unused)
