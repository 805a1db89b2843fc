"""Order statistics (sort, argsort, median, nanmedian, mode): each one braze graph op
(GraphBuilder::sort, median, mode; lowered in lowering/decompose/Sort.cpp as
rank-counting reductions, stable, NaN the largest value). What stays here is PyTorch's side:
which of its results braze's stable order reproduces.

- sort: PyTorch's CPU sort is stable with `stable=True`, and without it for dims of up to 16
  elements. Without `stable`, PyTorch guarantees no order among equal elements (its CPU and CUDA
  kernels differ, and vary with the length): braze's stable order is one it allows, so a long
  unstable sort whose indices are read compiles too (the values are eager's, the indices pick
  them; a mixture-of-experts layer sorts its tokens by expert this way).
- median: always reproducible; nanmedian with indices only for integer inputs (a row of NaNs
  gets an index that depends on PyTorch's selection algorithm).
- mode: integers and bools, dims of up to 16 elements (the index PyTorch picks among equal
  values follows its unstable sort).
- topk: the first k of braze's stable sort (descending for the largest). PyTorch documents the
  indices of tied elements as not guaranteed (they vary with k and the device), so among equal
  values braze returns the lowest indices first: the values are eager's, and each index points
  at its value. Unsorted results (sorted=False, whose order PyTorch leaves unspecified) come
  sorted. The largest k <= 8 of half, f32 or small-integer values are k passes of argmax
  instead (each takes the first of the largest remaining, NaN the largest; the same order as
  the sort's), a row reduction each, which fuse with the row's other reductions: a router's
  softmax and its top-2 selection are one kernel (the values' gather and what follows, a
  second). kthvalue selects among ties as its algorithm does and is left to eager."""
import torch

from braze.registry import OpKind, Unsupported, aten, rule

# topk of at most this k, largest first, selects by k argmax passes (_top_by_argmax).
_ARGMAX_TOPK = 8
# The dtypes those passes take, and the wider key each compares in: below every value of the
# input, the key has a value that marks an element taken.
_ARGMAX_KEYS = {torch.float16: "f64", torch.bfloat16: "f64", torch.float32: "f64",
                torch.int8: "i64", torch.uint8: "i64", torch.int16: "i64", torch.int32: "i64"}

# PyTorch's CPU sort is stable for dims up to this length even when not asked to be.
_STABLE_SORT_DIM = 16


def _extent(x, dim):
    """(dim normalized, its length) of x's meta value."""
    shape = x.meta["val"].shape
    if not shape:
        return 0, 1
    dim %= len(shape)
    return dim, shape[dim]


@rule(aten.sort.default, aten.sort.stable)
def _sort(t, node, x, *args, **kwargs):
    if node.target == aten.sort.stable:
        dim, descending = kwargs.get("dim", -1), kwargs.get("descending", False)
    else:
        dim = args[0] if len(args) > 0 else kwargs.get("dim", -1)
        descending = args[1] if len(args) > 1 else kwargs.get("descending", False)
    return t.g.sort(t.arg(x), dim, bool(descending))


@rule(aten.median.dim, aten.nanmedian.dim)
def _median(t, node, x, dim, keepdim=False):
    ignore_nan = node.target == aten.nanmedian.dim
    if ignore_nan and x.meta["val"].dtype.is_floating_point:
        raise Unsupported("nanmedian with indices of a floating-point tensor")
    return t.g.median(t.arg(x), dim, bool(keepdim), ignore_nan)


@rule(aten.median.default, aten.nanmedian.default)
def _median_all(t, node, x):
    return t.g.median(t.arg(x), None, False, node.target == aten.nanmedian.default)[0]


@rule(aten.mode.default)
def _mode(t, node, x, dim=-1, keepdim=False):
    _, n = _extent(x, dim)
    if n > _STABLE_SORT_DIM:
        raise Unsupported(f"mode along a dim of {n} elements (the index PyTorch picks among equal "
                          f"values follows its unstable sort)")
    return t.g.mode(t.arg(x), dim, bool(keepdim))


def _top_by_argmax(t, x, dim, k):
    """(values, indices) of x's k largest along dim, largest first and among equal values the
    lowest index first, NaN the largest: k argmax passes over a key that compares as x does
    (x widened; a float's -inf becomes the largest finite double), each replacing the element
    it took by a key below every other (-inf, or the least i64)."""
    val = x.meta["val"]
    key_dtype = _ARGMAX_KEYS[val.dtype]
    h = t.arg(x)
    shape = t.shape(list(val.shape))
    key = t.g.convert(h, key_dtype)
    if key_dtype == "f64":
        floor = t.g.full(float("-inf"), "f64", [])
        key = t.g.elementwise(OpKind.Where, [t.g.elementwise(OpKind.Eq, [key, floor]),
                                             t.g.full(-1.7976931348623157e308, "f64", []), key])
    else:
        floor = t.g.full(float(-2**63), "i64", [])
    position = t.g.iota("i64", shape, dim)
    values, indices = [], []
    for i in range(k):
        index = t.g.reduce(OpKind.ArgMax, key, [dim], True, None)
        indices.append(index)
        values.append(t.g.gather(h, dim, index))
        if i + 1 < k:
            taken = t.g.elementwise(OpKind.Eq, [position, index])
            key = t.g.elementwise(OpKind.Where, [taken, floor, key])
    return t.g.concat(values, dim), t.g.concat(indices, dim)


@rule(aten.topk.default)
def _topk(t, node, x, k, dim=-1, largest=True, sorted=True):
    if not isinstance(k, int):
        raise Unsupported("topk with a symbolic k")
    dim, n = _extent(x, dim)
    val = x.meta["val"]
    if (largest and 0 < k <= _ARGMAX_TOPK and val.shape and val.dtype in _ARGMAX_KEYS
            and all(isinstance(d, int) for d in val.shape)):
        return _top_by_argmax(t, x, dim, k)
    values, indices = t.g.sort(t.arg(x), dim, bool(largest))
    if not x.meta["val"].shape:  # a 0-d tensor: k is 0 or 1, its only element
        return values, indices
    return t.g.slice(values, dim, 0, k, 1), t.g.slice(indices, dim, 0, k, 1)
