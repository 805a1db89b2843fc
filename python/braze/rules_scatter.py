"""Advanced indexing and scatter-like ops.

Several index tensors become one `take` over adjacent dims. Each scatter-like op is one graph op
(scatter_dim, index_reduce, put, index_put, mask_put, masked_scatter, diagonal_scatter,
as_strided_scatter, nonzero_static), which lowering/decompose/Scatter.cpp lowers and
GraphBuilder::scatterLikeError checks; the rules only normalize arguments.
"""
import torch

from braze.registry import rule, Unsupported, aten


def _static_shape(shape, what):
    if not all(isinstance(d, int) for d in shape):
        raise Unsupported(f"{what} with dynamic shapes")
    return list(shape)


def _sym_shape(t, shape):
    return [t.g.sym_const(d) for d in shape]


def _index_handles(t, indices):
    """(dim, handle) of the given index tensors; masks (data-dependent shapes) are Unsupported."""
    given = []
    for d, a in enumerate(indices):
        if a is None:
            continue
        h = t.arg(a)
        if t.g.dtype(h) in ("bool", "u8"):
            raise Unsupported("boolean mask indexing (data-dependent shape)")
        given.append((d, h))
    return given


def _advanced_index(t, h, indices):
    """h[indices] (GraphBuilder::advancedIndex places the index dims as PyTorch does)."""
    given = _index_handles(t, indices)
    if not given:
        return h
    return t.g.advanced_index(h, [d for d, _ in given], [x for _, x in given])


@rule(aten.index.Tensor)
def _index(t, node, x, indices):
    return _advanced_index(t, t.arg(x), indices)


def _shape(a, what):
    """An FX tensor argument's static shape (Unsupported for symbolic dims)."""
    val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor):
        raise Unsupported(f"{what}: operand without a known shape")
    return _static_shape(val.shape, what)


# ---- scatter along a dim, index_reduce, put, diagonal_scatter: graph ops --------------------
# (lowering/decompose/Scatter.cpp; GraphBuilder::scatterLikeError says what each takes)

def _scatter_dim(t, node, x, dim, index, src, mode, include_self=True):
    """self.scatter(dim, index, src) with src an FX tensor or a Python scalar."""
    self_h = t.arg(x)
    if not isinstance(src, torch.fx.Node):
        src = t.g.full(float(src), t.g.dtype(self_h), _sym_shape(t, _shape(index, str(node.target))))
    else:
        src = t.arg(src)
    return t.g.scatter_dim(self_h, dim, t.arg(index), src, mode, include_self)


_SCATTER_REDUCE = {"add": "sum", "multiply": "prod", "sum": "sum", "prod": "prod",
                   "mean": "mean", "amax": "amax", "amin": "amin"}


@rule(aten.scatter.src, aten.scatter.value)
def _scatter_src(t, node, x, dim, index, src):
    return _scatter_dim(t, node, x, dim, index, src, "overwrite")


@rule(aten.scatter.reduce, aten.scatter.value_reduce)
def _scatter_reduce_legacy(t, node, x, dim, index, src, reduce):
    return _scatter_dim(t, node, x, dim, index, src, _SCATTER_REDUCE[reduce])


@rule(aten.scatter_add.default)
def _scatter_add(t, node, x, dim, index, src):
    return _scatter_dim(t, node, x, dim, index, src, "sum")


@rule(aten.scatter_reduce.two)
def _scatter_reduce(t, node, x, dim, index, src, reduce, include_self=True):
    return _scatter_dim(t, node, x, dim, index, src, _SCATTER_REDUCE[reduce], include_self)


# ---- index_put, put, index_reduce ----------------------------------------------------------

@rule(aten.index_put.default, aten._unsafe_index_put.default)
def _index_put(t, node, x, indices, values, accumulate=False):
    """self[indices] = values (or +=): a mask (bool or u8, the only index) is mask_put."""
    masks = [a for a in indices if a is not None and a.meta["val"].dtype in (torch.bool, torch.uint8)]
    if masks:
        if len(indices) != 1:
            raise Unsupported(f"{node.target} with a mask among other indices")
        return t.g.mask_put(t.arg(x), t.arg(indices[0]), t.arg(values), accumulate)
    given = [(d, t.arg(a)) for d, a in enumerate(indices) if a is not None]
    return t.g.index_put(t.arg(x), [d for d, _ in given], [h for _, h in given], t.arg(values),
                         accumulate)


@rule(aten.put.default)
def _put(t, node, x, index, source, accumulate=False):
    return t.g.put(t.arg(x), t.arg(index), t.arg(source), accumulate)


@rule(aten.index_reduce.default)
def _index_reduce(t, node, x, dim, index, source, reduce, include_self=True):
    return t.g.index_reduce(t.arg(x), dim, t.arg(index), t.arg(source), _SCATTER_REDUCE[reduce],
                            include_self)


# ---- masked_scatter, as_strided_scatter, nonzero_static -------------------------------

@rule(aten.masked_scatter.default)
def _masked_scatter(t, node, x, mask, source):
    return t.g.masked_scatter(t.arg(x), t.arg(mask), t.arg(source))


@rule(aten.diagonal_scatter.default)
def _diagonal_scatter(t, node, x, src, offset=0, dim1=0, dim2=1):
    return t.g.diagonal_scatter(t.arg(x), t.arg(src), offset, dim1, dim2)


def _storage_order(val):
    """The dims of val from its largest stride to its smallest when its elements fill its
    memory once each from offset 0 (contiguous, channels-last, any permutation of a contiguous
    layout), else None."""
    from torch._prims_common import is_non_overlapping_and_dense_or_false
    if val.storage_offset() != 0 or not all(isinstance(d, int) for d in
                                            (*val.shape, *val.stride())) \
            or not is_non_overlapping_and_dense_or_false(val):
        return None
    return sorted(range(val.dim()), key=lambda d: (-val.stride(d), -d))


@rule(aten.as_strided_scatter.default)
def _as_strided_scatter(t, node, x, src, size, stride, storage_offset=None):
    """The view's positions are flat positions of x's memory: x is scattered into in its storage
    order (a permutation of its dims, such as channels-last's), and permuted back."""
    name = str(node.target)
    val = x.meta.get("val")
    order = _storage_order(val) if isinstance(val, torch.Tensor) else None
    if order is None:
        raise Unsupported(f"{name} of an input that does not fill its memory from offset 0")
    offset = storage_offset or 0
    if not isinstance(offset, int):
        raise Unsupported(f"{name} with a symbolic offset")
    h = t.arg(x)
    ordered = order != sorted(order)
    if ordered:
        h = t.g.permute(h, order)
    out = t.g.as_strided_scatter(h, t.arg(src), _static_shape(size, name),
                                 _static_shape(stride, name), offset)
    if not ordered:
        return out
    inverse = [order.index(d) for d in range(len(order))]
    return t.g.permute(out, inverse)


@rule(aten.nonzero_static.default)
def _nonzero_static(t, node, x, *, size, fill_value=-1):
    if not isinstance(size, int):
        raise Unsupported(f"{node.target} with a symbolic size")
    return t.g.nonzero_static(t.arg(x), size, fill_value)
