"""Advanced indexing and scatter-like ops.

Several index tensors become one `take` over adjacent dims. Scatter-like ops compute the flat
position in `self` of every source element with indexing ops over a position tensor
(P = iota(numel(self)) shaped like self: gathering from P with the op's own index arguments
yields the targets, with the same bounds checks and negative-index rules as the matching
gather), then hand (self, targets, source) to the graph op `scatter`.
"""
import torch

from braze import _C
from braze.registry import rule, Unsupported, dtype_name, aten  # noqa: F401

# scatter's decomposition is quadratic: numel(self) x numel(source) element pairs.
_MAX_SCATTER_PAIRS = 1 << 26
# masked_scatter and nonzero_static use a scan over the flattened mask (GraphBuilder::kMaxScan).
_MAX_SCAN = _C.MAX_SCAN


def _static_shape(shape, what):
    if not all(isinstance(d, int) for d in shape):
        raise Unsupported(f"{what} with dynamic shapes")
    return list(shape)


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _sym_shape(t, shape):
    return [t.g.sym_const(d) for d in shape]


def _positions(t, shape):
    """i64 tensor of `shape` holding each element's flat (C-order) position."""
    n = _numel(shape)
    flat = t.g.iota("i64", [t.g.sym_const(n)], 0)
    return t.g.reshape(flat, _sym_shape(t, shape))


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
    """h[indices] with PyTorch's placement rule: index dims broadcast together and replace the
    indexed dims in place when those are adjacent, else they go first."""
    given = _index_handles(t, indices)
    if not given:
        return h
    dims = [d for d, _ in given]
    handles = [x for _, x in given]
    if dims == list(range(dims[0], dims[0] + len(dims))):
        return t.g.take_many(h, dims[0], handles)
    rank = len(t.g.shape(h))
    rest = [d for d in range(rank) if d not in dims]
    return t.g.take_many(t.g.permute(h, dims + rest), 0, handles)


@rule(aten.index.Tensor)
def _index(t, node, x, indices):
    return _advanced_index(t, t.arg(x), indices)


def _shape(a, what):
    """An FX tensor argument's static shape (Unsupported for symbolic dims)."""
    val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor):
        raise Unsupported(f"{what}: operand without a known shape")
    return _static_shape(val.shape, what)


# Eager accumulates half-precision scatters one element at a time in source order, rounding
# after each. braze follows that order exactly (one reduction per step) for up to this many
# values per element and leaves larger fan-ins to eager.
_MAX_ORDERED_HITS = _C.MAX_SCATTER_HITS  # the graph op's bound


def _scatter(t, node, self_h, target, src, src_numel, mode, include_self=True, fan_in=None,
             ordered=True):
    """The graph op `scatter` after checking its size cap; src is cast to self's dtype.
    fan_in bounds how many source elements can reach one element of self (src_numel if None);
    ordered: eager rounds a half-precision sum/prod/mean after each element in source order
    (else it accumulates in f32 with self included and rounds once)."""
    n = _numel(_static_shape(node.meta["val"].shape, str(node.target)))
    if src_numel and n > _MAX_SCATTER_PAIRS // src_numel:
        raise Unsupported(f"scatter of {src_numel} into {n} elements (quadratic work; braze "
                          f"scatters up to {_MAX_SCATTER_PAIRS} element pairs)")
    dt = t.g.dtype(self_h)
    if dt == "bool" and mode == "mean":
        raise Unsupported("scatter mean of a bool tensor")
    fan_in = src_numel if fan_in is None else fan_in
    max_hits = 0
    if dt in ("f16", "bf16") and mode in ("sum", "prod", "mean") and ordered:
        if fan_in > _MAX_ORDERED_HITS:
            raise Unsupported(f"half-precision scatter {mode} of up to {fan_in} values per "
                              f"element (braze follows eager's rounding order up to "
                              f"{_MAX_ORDERED_HITS})")
        max_hits = max(fan_in, 1)
    src = t.g.convert(src, t.g.dtype(self_h))
    return t.g.scatter(self_h, target, src, mode, include_self, max_hits)


def _no_wrap(t, idx, size):
    """idx with negative entries moved out of range (for ops whose eager kernel rejects them)."""
    zero = t.g.full(0.0, t.g.dtype(idx), [])
    return t.g.elementwise("where", [t.g.elementwise("lt", [idx, zero]),
                                     t.g.full(float(size), t.g.dtype(idx), []), idx])


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

def _mask_put(t, node, x, mask, values, accumulate):
    """self[mask] = values (or +=) for a mask over self's leading dims. Values that broadcast
    over the masked dims fill every masked element; values with a leading dim of the number of
    trues (checked at run time) are taken in order through the mask's cumulative count."""
    name = str(node.target)
    xs, ms, vs = _shape(x, name), _shape(mask, name), _shape(values, name)
    r = len(ms)
    if r == 0 or r > len(xs) or ms != xs[:r]:
        raise Unsupported(f"{name} with a mask not covering self's leading dims")
    rest = xs[r:]
    n = _numel(ms)
    self_h = t.arg(x)
    m = t.arg(mask)
    if t.g.dtype(m) != "bool":
        m = t.g.elementwise("ne", [m, t.g.full(0.0, t.g.dtype(m), [])])
    m_full = t.g.expand(t.g.reshape(m, _sym_shape(t, ms + [1] * len(rest))), _sym_shape(t, xs))
    v = t.g.convert(t.arg(values), t.g.dtype(self_h))
    if len(vs) <= len(rest) or vs[0] == 1:
        if len(vs) > len(rest):
            v = t.g.reshape(v, _sym_shape(t, vs[1:]))
        v = t.g.expand(v, _sym_shape(t, xs))  # broadcast onto the dims after the mask
    else:
        if len(vs) != len(rest) + 1 or n > _MAX_SCAN:
            raise Unsupported(f"{name}: values do not fit the mask")
        k = vs[0]
        v = t.g.expand(v, _sym_shape(t, [k] + rest))
        flat = t.g.convert(t.g.reshape(m, [t.g.sym_const(n)]), "i64")
        count = t.g.scan("cumsum", flat, 0, "i64")
        # The number of trues must equal k: take from a one-element tensor at (total - k),
        # with negatives moved out of range, is 0 exactly then and a run-time error otherwise.
        total = t.g.reduce("sum", flat, [], False, "i64")
        diff = _no_wrap(t, t.g.elementwise("sub", [total, t.g.full(float(k), "i64", [])]), 1)
        zero = t.g.take(t.g.full(0.0, "i64", [t.g.sym_const(1)]), 0, diff)
        pos = t.g.elementwise("sub", [count, t.g.full(1.0, "i64", [])])
        pos = t.g.elementwise("add", [t.g.elementwise("maximum", [pos, t.g.full(0.0, "i64", [])]),
                                      zero])
        v = t.g.take(v, 0, t.g.reshape(pos, _sym_shape(t, ms)))
    if accumulate:
        if t.g.dtype(self_h) == "bool":
            raise Unsupported(f"{name}: accumulating into a bool tensor through a mask")
        v = t.g.elementwise("add", [self_h, v])
        return t.g.convert(t.g.elementwise("where", [m_full, v, self_h]), t.g.dtype(self_h))
    return t.g.elementwise("where", [m_full, v, self_h])


@rule(aten.index_put.default, aten._unsafe_index_put.default)
def _index_put(t, node, x, indices, values, accumulate=False):
    """self[indices] = values (or +=): targets are the position tensor indexed like self
    (negative indices wrap, each index is checked against its own dim); values broadcast to
    the indexed shape."""
    name = str(node.target)
    xs = _shape(x, name)
    if not xs:
        raise Unsupported(f"{name} of a 0-d tensor")
    masks = [a for a in indices if a is not None and a.meta["val"].dtype in (torch.bool, torch.uint8)]
    if masks:
        if len(indices) != 1:
            raise Unsupported(f"{name} with a mask among other indices")
        return _mask_put(t, node, x, indices[0], values, accumulate)
    self_h = t.arg(x)
    target = _advanced_index(t, _positions(t, xs), indices)
    tshape = t.g.shape(target)
    h = t.g.expand(t.arg(values), tshape)
    src_numel = _numel(_shape_of_handle(t, target))
    if src_numel == 0:
        return self_h
    # Elements collide only where they share the coordinates of the dims taken whole.
    fan_in = _numel(torch.broadcast_shapes(*(_shape(a, name) for a in indices if a is not None)))
    return _scatter(t, node, self_h, target, h, src_numel, "sum" if accumulate else "overwrite",
                    fan_in=fan_in)


def _shape_of_handle(t, h):
    """A handle's shape as ints, read back from the printed symbolic dims."""
    out = []
    for s in t.g.shape(h):
        text = t.g.sym_str(s)
        if not text.lstrip("-").isdigit():
            raise Unsupported("scatter with dynamic shapes")
        out.append(int(text))
    return out


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
    """out[k] = mask[k] ? source.flatten()[number of trues before k] : self[k] (a gather through
    the cumulative count of the mask; too few source elements is a run-time error)."""
    name = str(node.target)
    out_shape = _static_shape(node.meta["val"].shape, name)
    n = _numel(out_shape)
    s = _numel(_shape(source, name))
    if n > _MAX_SCAN:
        raise Unsupported(f"{name} over {n} elements (braze scans up to {_MAX_SCAN})")
    self_h = t.g.expand(t.arg(x), _sym_shape(t, out_shape))
    if n == 0:
        return self_h
    if s == 0:
        raise Unsupported(f"{name} with an empty source")
    m = t.g.expand(t.arg(mask), _sym_shape(t, out_shape))
    flat = t.g.reshape(t.g.convert(m, "i64"), [t.g.sym_const(n)])
    pos = t.g.elementwise("sub", [t.g.scan("cumsum", flat, 0, "i64"), t.g.full(1.0, "i64", [])])
    pos = t.g.elementwise("maximum", [pos, t.g.full(0.0, "i64", [])])
    src = t.g.reshape(t.g.convert(t.arg(source), t.g.dtype(self_h)), [t.g.sym_const(s)])
    val = t.g.reshape(t.g.take(src, 0, pos), _sym_shape(t, out_shape))
    return t.g.elementwise("where", [m, val, self_h])


@rule(aten.diagonal_scatter.default)
def _diagonal_scatter(t, node, x, src, offset=0, dim1=0, dim2=1):
    return t.g.diagonal_scatter(t.arg(x), t.arg(src), offset, dim1, dim2)


@rule(aten.as_strided_scatter.default)
def _as_strided_scatter(t, node, x, src, size, stride, storage_offset=None):
    """Only for a contiguous input and a view whose elements do not overlap: the view's
    positions are then flat positions of the input."""
    name = str(node.target)
    val = x.meta.get("val")
    if not isinstance(val, torch.Tensor) or not val.is_contiguous() or val.storage_offset() != 0:
        raise Unsupported(f"{name} of a non-contiguous input")
    size = _static_shape(size, name)
    stride = _static_shape(stride, name)
    if len(size) != len(stride):
        raise Unsupported(f"{name}: size and stride lengths differ")
    offset = storage_offset or 0
    if not isinstance(offset, int):
        raise Unsupported(f"{name} with a symbolic offset")
    n = _numel(_shape(x, name))
    k = _numel(size)
    if k == 0:
        return t.arg(x)
    if k > _MAX_SCAN or min(stride, default=0) < 0:
        raise Unsupported(f"{name} of {k} elements or with negative strides")
    positions = {offset}
    for s, st in zip(size, stride):
        positions = {p + i * st for p in positions for i in range(s)}
    if len(positions) != k or max(positions) >= n:
        raise Unsupported(f"{name}: the view overlaps itself or leaves the input")
    shape = _sym_shape(t, size)
    target = t.g.full(float(offset), "i64", shape)
    for d, st in enumerate(stride):
        term = t.g.elementwise("mul", [t.g.iota("i64", shape, d), t.g.full(float(st), "i64", [])])
        target = t.g.elementwise("add", [target, term])
    return _scatter(t, node, t.arg(x), target, t.arg(src), k, "overwrite")


@rule(aten.nonzero_static.default)
def _nonzero_static(t, node, x, *, size, fill_value=-1):
    """Row j holds the coordinates of the j-th nonzero element (C order), or fill_value:
    position[j] = max_k (x[k] != 0 and count of nonzeros before k == j ? k : -1)."""
    name = str(node.target)
    xs = _shape(x, name)
    if not isinstance(size, int):
        raise Unsupported(f"{name} with a symbolic size")
    n = _numel(xs)
    if n > _MAX_SCAN or size * n > _MAX_SCATTER_PAIRS:
        raise Unsupported(f"{name} over {n} elements")
    out_shape = [t.g.sym_const(size), t.g.sym_const(len(xs))]
    if n == 0 or size == 0 or not xs:  # a 0-d input has no coordinates: [size, 0]
        return t.g.full(float(fill_value), "i64", out_shape)
    h = t.arg(x)
    zero = t.g.full(0.0, t.g.dtype(h), [])
    nz = t.g.reshape(t.g.elementwise("ne", [h, zero]), [t.g.sym_const(n)])
    before = t.g.elementwise("sub", [t.g.scan("cumsum", t.g.convert(nz, "i64"), 0, "i64"),
                                     t.g.convert(nz, "i64")])
    pairs = [t.g.sym_const(size), t.g.sym_const(n)]
    row = t.g.iota("i64", pairs, 0)
    hit = t.g.elementwise("logical_and", [
        t.g.expand(t.g.reshape(nz, [t.g.sym_const(1), t.g.sym_const(n)]), pairs),
        t.g.elementwise("eq", [t.g.expand(t.g.reshape(before, [t.g.sym_const(1), t.g.sym_const(n)]),
                                          pairs), row])])
    pos = t.g.elementwise("where", [hit, t.g.iota("i64", pairs, 1), t.g.full(-1.0, "i64", [])])
    pos = t.g.reduce("amax", pos, [1], True, None)  # [size, 1]
    found = t.g.elementwise("ge", [pos, t.g.full(0.0, "i64", [])])
    cols = []
    stride = n
    for d in xs:
        stride //= d
        c = t.g.elementwise("remainder", [
            t.g.elementwise("floordiv", [pos, t.g.full(float(stride), "i64", [])]),
            t.g.full(float(d), "i64", [])])
        cols.append(t.g.elementwise("where", [found, c, t.g.full(float(fill_value), "i64", [])]))
    return t.g.concat(cols, 1) if len(cols) > 1 else cols[0]
