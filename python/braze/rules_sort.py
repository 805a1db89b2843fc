"""Order statistics (sort, argsort, median, nanmedian, mode): each one braze graph op
(GraphBuilder::argsort, medianIndex, mode; lowered in lowering/decompose/Sort.cpp as
rank-counting reductions, stable, NaN the largest value). What stays here is PyTorch's side:
which of its results braze's stable order reproduces.

- sort: PyTorch's CPU sort is stable with `stable=True`, and without it for dims of up to 16
  elements; a longer unstable sort whose indices are read orders equal values as its algorithm
  does, which braze does not reproduce: those fall back.
- median: always reproducible; nanmedian with indices only for integer inputs (a row of NaNs
  gets an index that depends on PyTorch's selection algorithm).
- mode: integers and bools, dims of up to 16 elements (the index PyTorch picks among equal
  values follows its unstable sort). topk and kthvalue select among ties differently and are
  left to eager."""
import operator

from braze.registry import Unsupported, aten, rule

# PyTorch's CPU sort is stable for dims up to this length even when not asked to be.
_STABLE_SORT_DIM = 16


def _extent(x, dim):
    """(dim normalized, its length) of x's meta value."""
    shape = x.meta["val"].shape
    if not shape:
        return 0, 1
    dim %= len(shape)
    return dim, shape[dim]


def _indices_used(node):
    """Whether anything reads the second result (the indices) of a (values, indices) node."""
    return any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users)


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
    dim, n = _extent(x, dim)
    if not stable and n > _STABLE_SORT_DIM and _indices_used(node):
        raise Unsupported(f"unstable sort of a dim of {n} elements with its indices used (the "
                          f"order of equal elements is PyTorch's; braze sorts stably)")
    if not t.g.shape(h) or n <= 1 or x.meta["val"].numel() == 0:
        return (h, t.g.full(0.0, "i64", t.shape(node.meta["val"][1].shape)))
    idx = t.g.argsort(h, dim, descending)
    return (t.g.gather(h, dim, idx), idx)


def _keep(t, values, idx, dim, keepdim):
    return (values, idx) if keepdim else (t.g.squeeze(values, [dim]), t.g.squeeze(idx, [dim]))


@rule(aten.median.dim, aten.nanmedian.dim)
def _median(t, node, x, dim, keepdim=False):
    ignore_nan = node.target == aten.nanmedian.dim
    if ignore_nan and x.meta["val"].dtype.is_floating_point:
        raise Unsupported("nanmedian with indices of a floating-point tensor")
    h = t.arg(x)
    if x.meta["val"].dim() == 0:
        return (h, t.g.full(0.0, "i64", []))
    dim, _ = _extent(x, dim)
    idx = t.g.median_index(h, dim, ignore_nan)
    return _keep(t, t.g.gather(h, dim, idx), idx, dim, keepdim)


@rule(aten.median.default, aten.nanmedian.default)
def _median_all(t, node, x):
    h = t.g.reshape(t.arg(x), [t.g.sym_const(x.meta["val"].numel())])
    idx = t.g.median_index(h, 0, node.target == aten.nanmedian.default)
    return t.g.reshape(t.g.gather(h, 0, idx), [])


@rule(aten.mode.default)
def _mode(t, node, x, dim=-1, keepdim=False):
    h = t.arg(x)
    if x.meta["val"].dim() == 0:
        return (h, t.g.full(0.0, "i64", []))
    dim, n = _extent(x, dim)
    if n > _STABLE_SORT_DIM:
        raise Unsupported(f"mode along a dim of {n} elements (the index PyTorch picks among equal "
                          f"values follows its unstable sort)")
    values, idx = t.g.mode(h, dim)
    return _keep(t, values, idx, dim, keepdim)
