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
