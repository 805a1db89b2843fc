"""Order statistics (sort, argsort, median, nanmedian, mode) as rank-counting reductions. The
stable order is GraphBuilder::argsort (lowering/decompose/Sort.cpp):

The rank of element i along the sorted dim is the number of elements that come before it:
    rank(i) = #{ j : less(x[j], x[i])  or  (same(x[j], x[i]) and j < i) }
where NaN is the largest value (last ascending, first descending) and NaNs are the same value.
This is a stable order: what PyTorch's CPU sort gives with `stable=True`, and without it for dims
of up to 16 elements (longer ones go through an unstable sort, whose order among equal values
braze does not reproduce: those fall back).
The sorted position r then takes the index i whose rank is r (exactly one: ranks are a
permutation), and the values are gathered with it. Both steps are fused masked reductions, so
nothing of size n x n is stored, but the work is quadratic in the sorted length: longer dims fall
back to eager PyTorch.

median/nanmedian pick one rank of that order (and, for median, the first NaN of a row that has
one); mode counts equal elements. Their index choices among equal values follow PyTorch's CPU
kernels where those are reproducible: median always, mode for dims of up to 16 elements,
nanmedian with indices for integer inputs (a row of NaNs gets an index that depends on PyTorch's
selection algorithm). topk and kthvalue select among ties differently and are left to eager."""
import torch

from braze.fx_import import FLOAT_DTYPES, Unsupported, aten, dtype_name, ew, rule

# Sorted-dim length and total work (elements x sorted length) braze compiles.
_MAX_SORT_DIM = 16384
_MAX_SORT_WORK = 1 << 28
# PyTorch's CPU sort is stable for dims up to this length even when not asked to be.
_STABLE_SORT_DIM = 16


def _sorted_extent(node, x, dim):
    """(dim normalized, n) for sorting x's meta value along dim; Unsupported past the caps."""
    val = x.meta["val"]
    shape = list(val.shape)
    if not all(isinstance(s, int) for s in shape):
        raise Unsupported("sort over a tensor with symbolic sizes")
    if not shape:
        return 0, 1
    dim = dim % len(shape)
    n = shape[dim]
    numel = 1
    for s in shape:
        numel *= s
    if n > _MAX_SORT_DIM or numel * n > _MAX_SORT_WORK:
        raise Unsupported(f"sort of {numel} elements along a dim of {n} (braze sorts dims up to "
                          f"{_MAX_SORT_DIM} and {_MAX_SORT_WORK} element comparisons)")
    return dim, n


def _pair_views(t, h, dim):
    """x broadcast to [.., n (j), n (i), ..]: (x[j], x[i])."""
    shape = list(t.g.shape(h))
    wide = shape[:dim] + [shape[dim]] + shape[dim:]
    return t.g.expand(t.g.unsqueeze(h, dim + 1), wide), t.g.expand(t.g.unsqueeze(h, dim), wide)


def _order(t, h, dim, descending):
    """Indices (i64) that sort x along dim, stably (GraphBuilder::argsort)."""
    return t.g.argsort(h, dim, descending)


def _indices_used(node):
    """Whether anything reads the second result (the indices) of a (values, indices) node."""
    import operator
    return any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users)


def _zeros_i64(t, node):
    return t.g.full(0.0, "i64", t.shape(node.meta["val"][1].shape))


@rule(aten.sort.default, aten.sort.stable)
def _sort(t, node, x, *args, **kwargs):
    if node.target == aten.sort.stable:
        stable = bool(kwargs.get("stable"))
        dim, descending = kwargs.get("dim", -1), kwargs.get("descending", False)
    else:
        stable = False
        dim = args[0] if len(args) > 0 else kwargs.get("dim", -1)
        descending = args[1] if len(args) > 1 else kwargs.get("descending", False)
    h = t.arg(x)
    dim, n = _sorted_extent(node, x, dim)
    if not stable and n > _STABLE_SORT_DIM and _indices_used(node):
        raise Unsupported(f"unstable sort of a dim of {n} elements with its indices used (the "
                          f"order of equal elements is PyTorch's; braze sorts stably)")
    if not t.g.shape(h) or n <= 1 or x.meta["val"].numel() == 0:
        return (h, _zeros_i64(t, node))
    idx = _order(t, h, dim, descending)
    return (t.g.gather(h, dim, idx), idx)


def _flat(t, x):
    val = x.meta["val"]
    h = t.arg(x)
    return t.g.reshape(h, [t.g.sym_const(val.numel())]) if val.dim() != 1 else h


def _nan_rows(t, h, dim):
    """(any NaN in the row, index of the row's first NaN) with keepdim shapes."""
    n = t.g.shape(h)
    isnan = ew(t, "isnan", h)
    big = t.g.full(float(2**62), "i64", [])
    pos = ew(t, "where", isnan, t.g.iota("i64", n, dim), big)
    return (t.g.reduce("any", isnan, [dim], True, None), t.g.reduce("amin", pos, [dim], True, None))


def _median_index(t, h, dim, n, ignore_nan):
    """Index (keepdim shape) of the lower median along dim (see the module comment)."""
    order = _order(t, h, dim, False)
    is_float = t.g.dtype(h) in FLOAT_DTYPES
    if ignore_nan and is_float:
        count = t.g.reduce("sum", t.g.convert(ew(t, "logical_not", ew(t, "isnan", h)), "i64"),
                           [dim], True, "i64")
        count = ew(t, "maximum", ew(t, "sub", count, t.g.full(1.0, "i64", [])),
                    t.g.full(0.0, "i64", []))
        k = ew(t, "floordiv", count, t.g.full(2.0, "i64", []))
    else:
        shape = list(t.g.shape(h))
        k = t.g.full(float((n - 1) // 2), "i64", shape[:dim] + [t.g.sym_const(1)] + shape[dim + 1:])
    idx = t.g.gather(order, dim, k)
    if not ignore_nan and is_float:
        has_nan, first_nan = _nan_rows(t, h, dim)
        idx = ew(t, "where", has_nan, first_nan, idx)
    return idx


def _median_dim(t, node, x, dim, keepdim, ignore_nan):
    val = x.meta["val"]
    h = t.arg(x)
    if val.numel() == 0:
        raise Unsupported("median of an empty tensor")
    if val.dim() == 0:
        return (h, t.g.full(0.0, "i64", []))
    dim, n = _sorted_extent(node, x, dim)
    idx = _median_index(t, h, dim, n, ignore_nan)
    values = t.g.gather(h, dim, idx)
    if not keepdim:
        idx, values = t.g.squeeze(idx, [dim]), t.g.squeeze(values, [dim])
    return (values, idx)


@rule(aten.median.dim, aten.nanmedian.dim)
def _median(t, node, x, dim, keepdim=False):
    if node.target == aten.nanmedian.dim and x.meta["val"].dtype.is_floating_point:
        raise Unsupported("nanmedian with indices of a floating-point tensor")
    return _median_dim(t, node, x, dim, keepdim, node.target == aten.nanmedian.dim)


@rule(aten.median.default, aten.nanmedian.default)
def _median_all(t, node, x):
    val = x.meta["val"]
    if val.numel() == 0:
        raise Unsupported("median of an empty tensor")
    if val.numel() * val.numel() > _MAX_SORT_WORK or val.numel() > _MAX_SORT_DIM:
        raise Unsupported(f"median of {val.numel()} elements (braze sorts up to {_MAX_SORT_DIM})")
    h = _flat(t, x) if val.dim() else t.g.reshape(t.arg(x), [t.g.sym_const(1)])
    idx = _median_index(t, h, 0, val.numel(), node.target == aten.nanmedian.default)
    return t.g.reshape(t.g.gather(h, 0, idx), [])


@rule(aten.mode.default)
def _mode(t, node, x, dim=-1, keepdim=False):
    """The most frequent value (the smallest of equally frequent ones) and its last index.
    Integer and bool only: PyTorch's result for float rows with NaN follows its sort kernel."""
    val = x.meta["val"]
    if val.dtype.is_floating_point:
        raise Unsupported("mode of a floating-point tensor")
    if val.numel() == 0:
        raise Unsupported("mode of an empty tensor")
    h = t.arg(x)
    if val.dim() == 0:
        return (h, t.g.full(0.0, "i64", []))
    dim, n = _sorted_extent(node, x, dim)
    if n > _STABLE_SORT_DIM:
        raise Unsupported(f"mode along a dim of {n} elements (the index PyTorch picks among equal "
                          f"values follows its unstable sort)")
    xj, xi = _pair_views(t, h, dim)
    count = t.g.reduce("sum", t.g.convert(ew(t, "eq", xj, xi), "i64"), [dim], False, "i64")
    best = t.g.reduce("amax", count, [dim], True, None)
    wide = t.g.convert(h, "f64")
    cand = ew(t, "where", ew(t, "eq", count, best), wide, t.g.full(float("inf"), "f64", []))
    value = t.g.reduce("amin", cand, [dim], True, None)                    # keepdim, f64
    pos = ew(t, "where", ew(t, "eq", wide, value), t.g.iota("i64", t.g.shape(h), dim),
              t.g.full(-1.0, "i64", []))
    idx = t.g.reduce("amax", pos, [dim], True, None)
    values = t.g.convert(value, dtype_name(val.dtype))
    if not keepdim:
        idx, values = t.g.squeeze(idx, [dim]), t.g.squeeze(values, [dim])
    return (values, idx)
