"""FX rules for neural-network layers built from braze graph ops: transposed and 3-d
convolution, N-d max and average pooling (integer averages included), adaptive pooling, the
max-pooling backward formula, grid sampling, distances (cdist, pdist), embedding bags and the
half-precision soft-margin loss.

Windows are index remaps: a pooled dim is padded and unfolded (regular windows) or taken through
an index tensor of shape [out, window] (adaptive windows, whose length varies with the output
position). Max-pooling indices are found by taking the same windows of a tensor that holds each
input position's flat index, and picking the entry the argmax chose.

The file is longer than braze's usual 800 lines because it holds the whole family's FX rules
(one module per op family); its sections are independent."""
import math
import operator

import torch

from braze.fx_import import FLOAT_DTYPES, ew, rule, Unsupported, dtype_name, aten, prims  # noqa: F401

_INT_MAX = 2**63 - 1
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


def _pad(t, h, dim, lo, hi, value):
    """h padded along dim with `value` (lo before, hi after); a negative amount trims."""
    return t.g.pad(h, dim, lo, hi, float(value))


def _i64(t, v):
    return t.g.full(float(v), "i64", [])


def _lowest(dt):
    if dt in FLOAT_DTYPES:
        return -math.inf
    return {"bool": 0, "u8": 0, "i8": -2**7, "i16": -2**15, "i32": -2**31, "i64": -2**63}[dt]


# ---- convolution ----------------------------------------------------------------------------

@rule(aten.convolution.default)
def _convolution(t, node, x, w, bias, stride, padding, dilation, transposed, output_padding,
                 groups):
    xh, wh = t.arg(x), t.arg(w)
    b = t.arg(bias) if bias is not None else None
    if not transposed:
        return t.g.convolution(xh, wh, b, list(stride), list(padding), list(dilation), groups)
    return _conv_transpose(t, xh, wh, b, stride, padding, dilation, output_padding, groups)


def _eager_uses_mkldnn(dt, stride, output_padding):
    """Whether eager runs a half-precision transposed convolution through oneDNN (which
    accumulates in f32 and rounds once) rather than its gemm + col2im kernel (which rounds
    after the gemm and after each kernel tap's addition)."""
    if any(o >= s for o, s in zip(output_padding, stride)):
        return False
    if dt == "bf16":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())


def _conv_transpose(t, x, w, bias, stride, padding, dilation, output_padding, groups):
    """One conv_transpose op (lowering/decompose/ConvTranspose.cpp). Half precision rounds as
    eager's kernel on this machine does: once where eager uses oneDNN, else after each kernel
    tap (round_per_tap)."""
    dt = t.g.dtype(x)
    if dt not in FLOAT_DTYPES + ("i64",):
        raise Unsupported(f"transposed convolution in {dt} (eager has no such kernel)")
    spatial = len(t.g.shape(x)) - 2
    if spatial < 1 or spatial > 3:
        raise Unsupported(f"transposed convolution of rank {spatial + 2}")
    stride, padding = _as_list(stride, spatial), _as_list(padding, spatial)
    dilation, output_padding = _as_list(dilation, spatial), _as_list(output_padding, spatial)
    per_tap = dt in _HALF and not _eager_uses_mkldnn(dt, stride, output_padding)
    return t.g.conv_transpose(x, w, bias, stride, padding, dilation, output_padding, groups,
                              per_tap)


# ---- regular pooling windows ----------------------------------------------------------------

def _pool_out(n, k, s, p, d, ceil_mode):
    """PyTorch's pooled size of a dim of n elements."""
    span = d * (k - 1) + 1
    out = (n + 2 * p - span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    return out


class _Pool:
    """Window geometry of a pooling over the last `spatial` dims of an input."""

    def __init__(self, t, h, spatial, kernel, stride, padding, dilation, ceil_mode, op):
        rank = len(t.g.shape(h))
        if rank not in (spatial + 1, spatial + 2):
            raise Unsupported(f"{op} of a rank-{rank} input")
        self.spatial, self.rank = spatial, rank
        self.kernel = _as_list(kernel, spatial)
        self.stride = _as_list(stride if stride not in (None, [], ()) else self.kernel, spatial)
        self.padding = _as_list(padding, spatial)
        self.dilation = _as_list(dilation, spatial)
        self.sizes = _static_sizes(t, h, range(rank - spatial, rank))
        self.out = []
        for n, k, s, p, d in zip(self.sizes, self.kernel, self.stride, self.padding, self.dilation):
            if k <= 0 or s <= 0 or d <= 0 or p < 0 or 2 * p > k:
                raise Unsupported(f"{op} with kernel {k}, stride {s}, padding {p}, dilation {d}")
            o = _pool_out(n, k, s, p, d, ceil_mode)
            if o <= 0:
                raise Unsupported(f"{op} with an empty output")
            self.out.append(o)

    def windows(self, t, h, pad_value, extra_value):
        """h's windows as [.., O1.., k1 * k2 * ..]: the declared padding is `pad_value`, the
        extra right padding ceil mode needs `extra_value`."""
        lead = len(t.g.shape(h)) - self.spatial
        for i in range(self.spatial):
            d = lead + i
            n, k, s, p, dl, o = (self.sizes[i], self.kernel[i], self.stride[i], self.padding[i],
                                 self.dilation[i], self.out[i])
            right = max(0, (o - 1) * s + dl * (k - 1) + 1 - (n + p))
            h = _pad(t, h, d, p, p, pad_value)
            h = _pad(t, h, d, 0, right - min(right, p), extra_value)
            if right < p:  # the declared right padding is more than the windows reach
                h = t.g.slice(h, d, 0, n + p + right, 1)
            h = t.g.unfold(h, d, k, s) if dl == 1 else _dilated_unfold(t, h, d, k, s, dl)
        # [.., O1, .., On, k1, .., kn] -> [.., O1, .., On, k1 * .. * kn]
        shape = list(t.g.shape(h))[:lead + self.spatial]
        shape.append(t.g.sym_const(math.prod(self.kernel)))
        return t.g.reshape(h, shape)

    def counts(self, t, dtype, count_include_pad):
        """How many positions each window covers inside the input (and inside the declared
        padding with count_include_pad), as a tensor [O1, .., On]: the product of the per-dim
        counts, since a window is the product of its per-dim ranges."""
        total = None
        for i in range(self.spatial):
            one = _Pool.__new__(_Pool)
            one.spatial, one.sizes, one.out = 1, [self.sizes[i]], [self.out[i]]
            one.kernel, one.stride = [self.kernel[i]], [self.stride[i]]
            one.padding, one.dilation = [self.padding[i]], [self.dilation[i]]
            ones = t.g.full(1.0, dtype, [t.g.sym_const(self.sizes[i])])
            c = t.g.reduce("sum", one.windows(t, ones, 1 if count_include_pad else 0, 0), [1],
                           False, dtype)
            shape = [t.g.sym_const(1)] * self.spatial
            shape[i] = t.g.sym_const(self.out[i])
            c = t.g.reshape(c, shape)
            total = c if total is None else ew(t, "mul", total, c)
        return total

    def plane_index(self, t):
        """An i64 tensor [n1, .., nn] holding each position's flat index in the pooled plane."""
        total = math.prod(self.sizes)
        flat = t.g.iota("i64", [t.g.sym_const(total)], 0)
        return t.g.reshape(flat, [t.g.sym_const(n) for n in self.sizes])


def _dilated_unfold(t, h, d, k, s, dl):
    """unfold with dilation: the k taps of each window are `dl` apart. Unfolding windows of the
    full span and keeping every dl-th tap is the same index remap."""
    span = dl * (k - 1) + 1
    h = t.g.unfold(h, d, span, s)
    return t.g.slice(h, len(t.g.shape(h)) - 1, 0, _INT_MAX, dl)


def _pick_index(t, windowed_index, choice):
    """The flat input index the window position `choice` (argmax over the last dim) stands for."""
    shape = t.g.shape(choice)
    idx = t.g.expand(windowed_index, list(shape) + [t.g.shape(windowed_index)[-1]])
    picked = t.g.gather(idx, len(shape), t.g.unsqueeze(choice, len(shape)))
    return t.g.squeeze(picked, [len(shape)])


def _max_pool(t, node, x, spatial, kernel, stride, padding, dilation, ceil_mode, op):
    h = t.arg(x)
    dt = t.g.dtype(h)
    if dt == "bool":
        raise Unsupported(f"{op} of bool")
    pool = _Pool(t, h, spatial, kernel, stride, padding, dilation, ceil_mode, op)
    lowest = _lowest(dt)
    win = pool.windows(t, h, lowest, lowest)
    last = len(t.g.shape(win)) - 1
    values = t.g.reduce("amax", win, [last], False, None)
    choice = t.g.reduce("argmax", win, [last], False, None)
    index = pool.windows(t, pool.plane_index(t), -1, -1)
    return values, _pick_index(t, index, choice)


@rule(aten.max_pool3d_with_indices.default)
def _max_pool3d(t, node, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(t, node, x, 3, kernel_size, stride, padding, dilation, ceil_mode,
                     "max_pool3d")


def _trunc_div(t, a, b):
    """Integer division rounding toward zero (C's `/`, what eager's integer kernels do)."""
    q = ew(t, "floordiv", a, b)
    r = ew(t, "remainder", a, b)
    zero = _i64(t, 0)
    inexact = ew(t, "ne", r, zero)
    negative = ew(t, "ne", ew(t, "lt", a, zero), ew(t, "lt", b, zero))
    return ew(t, "where", ew(t, "logical_and", inexact, negative), ew(t, "add", q, _i64(t, 1)), q)


def _avg_pool(t, node, x, spatial, kernel, stride, padding, ceil_mode, count_include_pad,
              divisor_override, op):
    """sum(window) / divisor: divisor_override, or the number of window positions inside the
    input (and inside the declared padding with count_include_pad). Half precision sums and
    divides in f32 and rounds once, as eager's kernel; i64 divides rounding toward zero."""
    h = t.arg(x)
    dt = t.g.dtype(h)
    if dt not in FLOAT_DTYPES + ("i64",):
        raise Unsupported(f"{op} of {dt} (eager has no such kernel)")
    pool = _Pool(t, h, spatial, kernel, stride, padding, 1, ceil_mode, op)
    work = "f32" if dt in _HALF else dt
    win = pool.windows(t, t.g.convert(h, work), 0, 0)
    last = len(t.g.shape(win)) - 1
    total = t.g.reduce("sum", win, [last], False, work)
    if divisor_override:
        count = t.g.full(float(divisor_override), work, [])
    else:
        count = pool.counts(t, work, count_include_pad)
    out = _trunc_div(t, total, count) if dt == "i64" else ew(t, "div", total, count)
    return t.g.convert(out, dt)


@rule(aten.avg_pool2d.default)
def _avg_pool2d(t, node, x, kernel_size, stride=(), padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None):
    return _avg_pool(t, node, x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override, "avg_pool2d")


@rule(aten.avg_pool3d.default)
def _avg_pool3d(t, node, x, kernel_size, stride=(), padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None):
    return _avg_pool(t, node, x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override, "avg_pool3d")


# ---- adaptive pooling -----------------------------------------------------------------------

def _adaptive_bounds(n, o):
    """Window j of an adaptive pooling of n elements into o covers [start(j), end(j))."""
    return [(j * n // o, -(-(j + 1) * n // o)) for j in range(o)]


def _window_index(t, n, o, k):
    """i64 tensors [o, k] for an adaptive pooling of n elements into o windows of at most k
    taps: tap i of window j is at start(j) + i, clamped to the window's last position, and
    whether that tap lies inside the window."""
    rows = t.g.iota("i64", [t.g.sym_const(o), t.g.sym_const(k)], 0)
    taps = t.g.iota("i64", [t.g.sym_const(o), t.g.sym_const(k)], 1)
    start = ew(t, "floordiv", ew(t, "mul", rows, _i64(t, n)), _i64(t, o))
    end = ew(t, "floordiv", ew(t, "add", ew(t, "mul", rows, _i64(t, n)), _i64(t, n + o - 1)),
              _i64(t, o))
    pos = ew(t, "add", start, taps)
    inside = ew(t, "lt", pos, end)
    return ew(t, "minimum", pos, ew(t, "sub", end, _i64(t, 1))), inside


class _Adaptive:
    """Adaptive pooling of the last `spatial` dims of an input to `out` sizes."""

    def __init__(self, t, h, spatial, output_size, op):
        rank = len(t.g.shape(h))
        if rank not in (spatial + 1, spatial + 2):
            raise Unsupported(f"{op} of a rank-{rank} input")
        self.spatial, self.lead = spatial, rank - spatial
        self.out = _as_list(output_size, spatial)
        self.sizes = _static_sizes(t, h, range(self.lead, rank))
        if min(self.sizes) <= 0 or min(self.out) <= 0:
            raise Unsupported(f"{op} with an empty input or output")
        self.taps = [max(e - s for s, e in _adaptive_bounds(n, o))
                     for n, o in zip(self.sizes, self.out)]

    def windows(self, t, h, fill=None):
        """h's windows as [.., O1, .., On, K1 * .. * Kn] (Ki the longest window of dim i). Taps
        past a shorter window repeat its last element, or are `fill` when given."""
        lead = len(t.g.shape(h)) - self.spatial
        for i in range(self.spatial):
            d = lead + 2 * i
            idx, inside = _window_index(t, self.sizes[i], self.out[i], self.taps[i])
            h = t.g.take(h, d, idx)
            if fill is not None:
                rank = len(t.g.shape(h))
                mask = t.g.reshape(inside, [t.g.sym_const(self.out[i]), t.g.sym_const(self.taps[i])]
                                   + [t.g.sym_const(1)] * (rank - d - 2))
                h = ew(t, "where", mask, h, t.g.full(float(fill), t.g.dtype(h), []))
        perm = list(range(lead)) + [lead + 2 * i for i in range(self.spatial)] + \
            [lead + 2 * i + 1 for i in range(self.spatial)]
        h = t.g.permute(h, perm)
        shape = list(t.g.shape(h))[:lead + self.spatial]
        return t.g.reshape(h, shape + [t.g.sym_const(math.prod(self.taps))])

    def counts(self, t, dtype):
        """Each window's element count, [O1, .., On]."""
        total = None
        for i, (n, o) in enumerate(zip(self.sizes, self.out)):
            rows = t.g.iota("i64", [t.g.sym_const(o)], 0)
            start = ew(t, "floordiv", ew(t, "mul", rows, _i64(t, n)), _i64(t, o))
            end = ew(t, "floordiv", ew(t, "add", ew(t, "mul", rows, _i64(t, n)),
                                           _i64(t, n + o - 1)), _i64(t, o))
            shape = [t.g.sym_const(1)] * self.spatial
            shape[i] = t.g.sym_const(o)
            c = t.g.reshape(t.g.convert(ew(t, "sub", end, start), dtype), shape)
            total = c if total is None else ew(t, "mul", total, c)
        return total

    def plane_index(self, t):
        flat = t.g.iota("i64", [t.g.sym_const(math.prod(self.sizes))], 0)
        return t.g.reshape(flat, [t.g.sym_const(n) for n in self.sizes])


def _adaptive_max(t, node, x, output_size, spatial, op):
    h = t.arg(x)
    if t.g.dtype(h) not in FLOAT_DTYPES:
        raise Unsupported(f"{op} of {t.g.dtype(h)} (eager has no such kernel)")
    pool = _Adaptive(t, h, spatial, output_size, op)
    win = pool.windows(t, h)
    last = len(t.g.shape(win)) - 1
    values = t.g.reduce("amax", win, [last], False, None)
    choice = t.g.reduce("argmax", win, [last], False, None)
    return values, _pick_index(t, pool.windows(t, pool.plane_index(t)), choice)


@rule(aten.adaptive_max_pool2d.default)
def _adaptive_max_pool2d(t, node, x, output_size):
    return _adaptive_max(t, node, x, output_size, 2, "adaptive_max_pool2d")


@rule(aten.adaptive_max_pool3d.default)
def _adaptive_max_pool3d(t, node, x, output_size):
    return _adaptive_max(t, node, x, output_size, 3, "adaptive_max_pool3d")


def _adaptive_avg(t, node, x, output_size, spatial, op):
    """Window sums over window counts; half precision sums and divides in f32."""
    h = t.arg(x)
    dt = t.g.dtype(h)
    if dt not in FLOAT_DTYPES:
        raise Unsupported(f"{op} of {dt}")
    pool = _Adaptive(t, h, spatial, output_size, op)
    if spatial == 3 and dt in _HALF:
        return _adaptive_avg3d_half(t, h, pool)
    work = "f32" if dt in _HALF else dt
    win = pool.windows(t, t.g.convert(h, work), fill=0)
    total = t.g.reduce("sum", win, [len(t.g.shape(win)) - 1], False, work)
    return t.g.convert(ew(t, "div", total, pool.counts(t, work)), dt)


def _adaptive_avg3d_half(t, h, pool):
    """Eager's 3-d kernel in half precision sums a window's elements one by one in the dtype
    (rounding each addition, taps in row-major order) and divides by the window's depth,
    height and width in turn, rounding each division."""
    win = pool.windows(t, h, fill=0)
    last = len(t.g.shape(win)) - 1
    total = t.g.select(win, last, 0)
    for k in range(1, math.prod(pool.taps)):
        total = ew(t, "add", total, t.g.select(win, last, k))
    for i, (n, o) in enumerate(zip(pool.sizes, pool.out)):
        rows = t.g.iota("i64", [t.g.sym_const(o)], 0)
        start = ew(t, "floordiv", ew(t, "mul", rows, _i64(t, n)), _i64(t, o))
        end = ew(t, "floordiv", ew(t, "add", ew(t, "mul", rows, _i64(t, n)),
                                       _i64(t, n + o - 1)), _i64(t, o))
        shape = [t.g.sym_const(1)] * pool.spatial
        shape[i] = t.g.sym_const(o)
        count = t.g.reshape(t.g.convert(ew(t, "sub", end, start), t.g.dtype(h)), shape)
        total = ew(t, "div", total, count)
    return total


@rule(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(t, node, x, output_size):
    return _adaptive_avg(t, node, x, output_size, 2, "adaptive_avg_pool2d")


@rule(aten._adaptive_avg_pool3d.default)
def _adaptive_avg_pool3d(t, node, x, output_size):
    return _adaptive_avg(t, node, x, output_size, 3, "adaptive_avg_pool3d")


# ---- max pooling backward -------------------------------------------------------------------

@rule(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_backward(t, node, grad, x, kernel_size, stride, padding, dilation, ceil_mode,
                         indices):
    """grad_input[h, w] = sum of grad[oh, ow] over the windows containing (h, w) whose max was
    at (h, w). Input position h lies in windows oh = (h + p) // s - j, j < ceil(span / s), that
    exist (0 <= oh < OH); the candidates are taken as a [H, J] index, like adaptive windows."""
    gh, xh, ih = t.arg(grad), t.arg(x), t.arg(indices)
    dt = t.g.dtype(gh)
    if dt not in FLOAT_DTYPES:
        raise Unsupported(f"max_pool2d backward of {dt}")
    pool = _Pool(t, xh, 2, kernel_size, stride, padding, dilation, ceil_mode, "max_pool2d_backward")
    lead = len(t.g.shape(xh)) - 2
    if [t.g.sym_str(d) for d in t.g.shape(gh)[lead:]] != [str(o) for o in pool.out]:
        raise Unsupported("max_pool2d backward with a gradient of another shape")
    work = "f32" if dt in _HALF else dt
    g, ind = t.g.convert(gh, work), ih
    valid = None
    for i in range(2):
        d = lead + 2 * i
        n, s, p, o = pool.sizes[i], pool.stride[i], pool.padding[i], pool.out[i]
        span = pool.dilation[i] * (pool.kernel[i] - 1) + 1
        taps = -(-span // s)
        shape = [t.g.sym_const(n), t.g.sym_const(taps)]
        rows, js = t.g.iota("i64", shape, 0), t.g.iota("i64", shape, 1)
        cand = ew(t, "sub", ew(t, "floordiv", ew(t, "add", rows, _i64(t, p)), _i64(t, s)), js)
        ok = ew(t, "logical_and", ew(t, "ge", cand, _i64(t, 0)), ew(t, "lt", cand, _i64(t, o)))
        cand = ew(t, "minimum", ew(t, "maximum", cand, _i64(t, 0)), _i64(t, o - 1))
        g, ind = t.g.take(g, d, cand), t.g.take(ind, d, cand)
        # ok as [H, J, 1, 1] for the first dim, [W, J] for the second: broadcast into the
        # [.., H, J1, W, J2] layout.
        okb = t.g.reshape(ok, shape + [t.g.sym_const(1)] * (2 - 2 * i))
        valid = okb if valid is None else ew(t, "logical_and", valid, okb)
    h_, w_ = pool.sizes
    flat = ew(t, "add", ew(t, "mul", t.g.iota("i64", [t.g.sym_const(h_), t.g.sym_const(1),
                                                         t.g.sym_const(w_), t.g.sym_const(1)], 0),
                              _i64(t, w_)),
               t.g.iota("i64", [t.g.sym_const(h_), t.g.sym_const(1), t.g.sym_const(w_),
                                t.g.sym_const(1)], 2))
    hit = ew(t, "logical_and", valid, ew(t, "eq", ind, flat))
    picked = ew(t, "where", hit, g, t.g.full(0.0, work, []))
    total = t.g.reduce("sum", picked, [lead + 1, lead + 3], False, work)
    return t.g.convert(total, dt)


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


# ---- grid sampling --------------------------------------------------------------------------

def _f(t, v, dt):
    return t.g.full(float(v), dt, [])


def _unnormalize(t, g, size, align_corners, dt):
    """Grid coordinate in [-1, 1] -> input position (PyTorch's convention)."""
    one = _f(t, 1, dt)
    if align_corners:
        return ew(t, "mul", ew(t, "div", ew(t, "add", g, one), _f(t, 2, dt)), _f(t, size - 1, dt))
    return ew(t, "div", ew(t, "sub", ew(t, "mul", ew(t, "add", g, one), _f(t, size, dt)), one),
               _f(t, 2, dt))


def _clip(t, c, size, dt):
    return ew(t, "minimum", ew(t, "maximum", c, _f(t, 0, dt)), _f(t, size - 1, dt))


def _reflect(t, c, twice_low, twice_high, dt):
    """c reflected into [twice_low / 2, twice_high / 2] by the interval's edges."""
    if twice_low == twice_high:
        return ew(t, "mul", c, _f(t, 0, dt))
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    c = ew(t, "abs", ew(t, "sub", c, _f(t, low, dt)))
    extra = ew(t, "fmod", c, _f(t, span, dt))
    flips = ew(t, "floor", ew(t, "div", c, _f(t, span, dt)))
    even = ew(t, "eq", ew(t, "fmod", flips, _f(t, 2, dt)), _f(t, 0, dt))
    return ew(t, "where", even, ew(t, "add", extra, _f(t, low, dt)),
               ew(t, "add", ew(t, "sub", _f(t, span, dt), extra), _f(t, low, dt)))


def _apply_padding(t, c, size, padding_mode, align_corners, dt):
    if padding_mode == 1:  # border
        return _clip(t, c, size, dt)
    if padding_mode == 2:  # reflection
        if align_corners:
            c = _reflect(t, c, 0, 2 * (size - 1), dt)
        else:
            c = _reflect(t, c, -1, 2 * size - 1, dt)
        return _clip(t, c, size, dt)
    return c


class _Sampler:
    """Reads input values at integer positions: x [N, C, *sizes] flattened to [N, C, P], the
    positions (one i64 tensor [N, *out] per spatial dim, x's dims in order) turned into flat
    indices; positions outside the input read 0."""

    def __init__(self, t, x, sizes, out_shape):
        self.t, self.sizes, self.out_shape = t, sizes, out_shape
        shape = t.g.shape(x)
        self.nc = list(shape[:2])
        self.flat = t.g.reshape(x, self.nc + [t.g.sym_const(math.prod(sizes))])
        out = [t.g.sym_str(d) for d in out_shape[1:]]
        if not all(d.isdigit() for d in out):
            raise Unsupported("grid_sampler with a dynamic grid size")
        self.points = math.prod(int(d) for d in out)

    def read(self, positions):
        t = self.t
        valid, flat = None, None
        for p, n in zip(positions, self.sizes):
            ok = ew(t, "logical_and", ew(t, "ge", p, _i64(t, 0)), ew(t, "lt", p, _i64(t, n)))
            valid = ok if valid is None else ew(t, "logical_and", valid, ok)
            p = ew(t, "minimum", ew(t, "maximum", p, _i64(t, 0)), _i64(t, n - 1))
            flat = p if flat is None else ew(t, "add", ew(t, "mul", flat, _i64(t, n)), p)
        n = self.out_shape[0]
        idx = t.g.reshape(flat, [n, t.g.sym_const(1), t.g.sym_const(self.points)])
        idx = t.g.expand(idx, self.nc + [t.g.sym_const(self.points)])
        v = t.g.gather(self.flat, 2, idx)
        v = t.g.reshape(v, self.nc + list(self.out_shape[1:]))
        valid = t.g.unsqueeze(valid, 1)
        return ew(t, "where", valid, v, t.g.full(0.0, t.g.dtype(v), []))


def _cubic_coefficients(t, frac, dt):
    """The four taps' weights of cubic convolution (A = -0.75) at fractional offset frac."""
    a = -0.75

    def near(x):  # |x| <= 1
        return ew(t, "add", ew(t, "mul", ew(t, "mul", ew(t, "sub", ew(t, "mul", _f(t, a + 2, dt), x),
                                                                   _f(t, a + 3, dt)), x), x), _f(t, 1, dt))

    def far(x):  # 1 < |x| < 2
        r = ew(t, "sub", ew(t, "mul", _f(t, a, dt), x), _f(t, 5 * a, dt))
        r = ew(t, "add", ew(t, "mul", r, x), _f(t, 8 * a, dt))
        return ew(t, "sub", ew(t, "mul", r, x), _f(t, 4 * a, dt))

    rest = ew(t, "sub", _f(t, 1, dt), frac)
    return [far(ew(t, "add", frac, _f(t, 1, dt))), near(frac), near(rest),
            far(ew(t, "add", rest, _f(t, 1, dt)))]


def _grid_sample(t, node, x, grid, mode, padding_mode, align_corners, spatial):
    """grid_sampler: bilinear (trilinear), nearest and (2-d) bicubic interpolation with zeros,
    border and reflection padding."""
    xh, gh = t.arg(x), t.arg(grid)
    dt = t.g.dtype(xh)
    if dt not in FLOAT_DTYPES or t.g.dtype(gh) != dt:
        raise Unsupported(f"grid_sampler of {dt}")
    if mode not in (0, 1, 2) or padding_mode not in (0, 1, 2) or (mode == 2 and spatial != 2):
        raise Unsupported(f"grid_sampler mode {mode} padding {padding_mode}")
    if len(t.g.shape(xh)) != spatial + 2 or len(t.g.shape(gh)) != spatial + 2:
        raise Unsupported("grid_sampler of unexpected ranks")
    sizes = _static_sizes(t, xh, range(2, spatial + 2))
    if min(sizes) <= 0:
        raise Unsupported("grid_sampler of an empty input")
    # Eager's CPU kernels compute in the input dtype, rounding half precision after every
    # operation; its CUDA kernels compute in f32 and round once. braze does the same as the
    # kernels of its device, in the same order of operations.
    work = "f32" if t.device is not None and t.device.type == "cuda" and dt in ("f16", "bf16") else dt
    xw, gw = (xh, gh) if work == dt else (t.g.convert(xh, work), t.g.convert(gh, work))
    out_shape = list(t.g.shape(gh))[:-1]  # [N, *out]
    sampler = _Sampler(t, xw, sizes, out_shape)
    # Grid component i addresses input dim spatial - 1 - i (x is the last dim).
    coords = []
    for i in range(spatial):
        size = sizes[spatial - 1 - i]
        c = _unnormalize(t, t.g.select(gw, -1, i), size, align_corners, work)
        if mode != 2:
            c = _apply_padding(t, c, size, padding_mode, align_corners, work)
        coords.append(c)  # coords[i]: grid order (x, y, z)

    def read(grid_order_positions):
        return sampler.read(list(reversed(grid_order_positions)))

    if mode == 1:
        return t.g.convert(read([t.g.convert(ew(t, "round", c), "i64") for c in coords]), dt)
    floors = [ew(t, "floor", c) for c in coords]
    if mode == 0:
        # Corners in eager's order (the last grid component outermost), weights multiplied
        # x first.
        out = None
        for corner in range(2 ** spatial):
            bits = [(corner >> (spatial - 1 - i)) & 1 for i in range(spatial)]
            bits = list(reversed(bits))  # bits[i] for grid component i; x varies fastest
            pos, w = [], None
            for i, b in enumerate(bits):
                # Eager's weights: (floor + 1) - c for the lower corner, c - floor for the upper.
                if b:
                    wi = ew(t, "sub", coords[i], floors[i])
                else:
                    wi = ew(t, "sub", ew(t, "add", floors[i], _f(t, 1, work)), coords[i])
                w = wi if w is None else ew(t, "mul", w, wi)
                p = t.g.convert(floors[i], "i64")
                pos.append(ew(t, "add", p, _i64(t, 1)) if b else p)
            term = ew(t, "mul", read(pos), t.g.unsqueeze(w, 1))
            out = term if out is None else ew(t, "add", out, term)
        return t.g.convert(out, dt)
    # Bicubic: 4 x 4 taps around the floor, each tap's position padded on its own.
    fx, fy = (ew(t, "sub", coords[i], floors[i]) for i in range(2))
    cx, cy = _cubic_coefficients(t, fx, work), _cubic_coefficients(t, fy, work)
    rows = []
    for r in range(4):
        row = None
        for c in range(4):
            pos = []
            for i, off in ((0, c - 1), (1, r - 1)):
                size = sizes[spatial - 1 - i]
                p = ew(t, "add", floors[i], _f(t, off, work))
                p = _apply_padding(t, p, size, padding_mode, align_corners, work)
                pos.append(t.g.convert(p, "i64"))
            term = ew(t, "mul", read(pos), t.g.unsqueeze(cx[c], 1))
            row = term if row is None else ew(t, "add", row, term)
        rows.append(row)
    out = None
    for r in range(4):
        term = ew(t, "mul", rows[r], t.g.unsqueeze(cy[r], 1))
        out = term if out is None else ew(t, "add", out, term)
    return t.g.convert(out, dt)


@rule(aten.grid_sampler_2d.default)
def _grid_sampler_2d(t, node, x, grid, mode, padding_mode, align_corners):
    return _grid_sample(t, node, x, grid, mode, padding_mode, align_corners, 2)


@rule(aten.grid_sampler_3d.default)
def _grid_sampler_3d(t, node, x, grid, mode, padding_mode, align_corners):
    return _grid_sample(t, node, x, grid, mode, padding_mode, align_corners, 3)


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
