"""FX rules for a long tail of simpler ops: uninitialized creation, as_strided, whole-tensor
max/min, pointwise ops, addbmm and _trilinear, random distributions, bucketize / searchsorted,
cummax / cummin and histc. Each rule translates its node into graph ops (the composites are
lowered in lowering/decompose) or raises Unsupported."""
import torch

from braze.registry import (FLOAT_DTYPES, OpKind, rule, Unsupported, dtype_name, aten,  # noqa: F401
                            op_name, prims)

def _meta(node):
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise Unsupported("result is not a tensor")
    if val.device.type not in ("cpu", "cuda"):
        raise Unsupported(f"result on {val.device}")
    if val.layout != torch.strided:
        raise Unsupported(f"result with layout {val.layout}")
    return val


def _static(values, what):
    """The values as Python ints; Unsupported when one is symbolic."""
    out = []
    for v in values:
        if not isinstance(v, int):
            raise Unsupported(f"{what} with symbolic sizes")
        out.append(int(v))
    return out


def _scalar(t, value, dt):
    return t.g.full(float(value), dt, [])


# ---- uninitialized creation ----------------------------------------------------------------
# Any content is valid for an uninitialized tensor; braze fills zeros. The output layout comes
# from the node's meta value when it is a graph output (backend._dense_layout).

@rule(aten.empty.memory_format, aten.empty_permuted.default, aten.empty_strided.default,
      aten.new_empty_strided.default, aten.new_empty.default)
def _empty(t, node, *args, **kwargs):
    val = _meta(node)
    return t.g.full(0.0, dtype_name(val.dtype), t.shape(val.shape))


# ---- views as copies ---------------------------------------------------------------------

@rule(aten.as_strided.default)
def _as_strided(t, node, x, size, stride, storage_offset=None):
    """A view of x's storage read as a copy (the as_strided graph op): valid when x is
    contiguous, so that its storage order is its row-major order."""
    if not isinstance(x, torch.fx.Node):
        raise Unsupported("as_strided of a non-tensor")
    src = x.meta.get("val")
    if not isinstance(src, torch.Tensor):
        raise Unsupported("as_strided of an input without a known layout")
    size, stride = _static(size, "as_strided"), _static(stride, "as_strided")
    _static(src.shape, "as_strided")
    try:
        contiguous = bool(src.is_contiguous())
        base = int(src.storage_offset())
        offset = base if storage_offset is None else int(storage_offset)
    except Exception:
        raise Unsupported("as_strided of a tensor with a symbolic layout")
    if not contiguous:
        raise Unsupported("as_strided of a non-contiguous tensor (its storage order is unknown)")
    return t.g.as_strided(t.arg(x), size, stride, offset - base)


# ---- reductions ----------------------------------------------------------------------------

@rule(aten.max.default, aten.min.default)
def _max_all(t, node, x):
    h = t.arg(x)
    if any(d == 0 for d in node.args[0].meta["val"].shape):
        raise Unsupported("max/min of an empty tensor (eager raises)")
    return t.g.reduce(OpKind.Amax if node.target == aten.max.default else OpKind.Amin, h, [],
                      False, None)


# ---- pointwise -----------------------------------------------------------------------------

@rule(aten.fmax.default, aten.fmin.default)
def _fmax(t, node, a, b):
    return t.g.fmax(t.arg(a), t.arg(b), node.target == aten.fmax.default)


@rule(aten.signbit.default)
def _signbit(t, node, x):
    return t.g.signbit(t.arg(x))


@rule(aten.ldexp.Tensor)
def _ldexp(t, node, x, other):
    return t.g.ldexp(t.arg(x), t.arg(other))


@rule(aten.round.decimals)
def _round_decimals(t, node, x, decimals=0):
    return t.g.round_decimals(t.arg(x), int(decimals))


@rule(aten.hypot.default)
def _hypot(t, node, a, b):
    return t.g.elementwise(OpKind.Hypot, [t.arg(a), t.arg(b)])


@rule(aten.nextafter.default)
def _nextafter(t, node, a, b):
    dt = dtype_name(_meta(node).dtype)
    ops = {"f32": OpKind.NextAfter, "f64": OpKind.NextAfter, "f16": OpKind.NextAfterF16,
           "bf16": OpKind.NextAfterBF16}
    if dt not in ops:
        raise Unsupported(f"nextafter on {dt}")
    return t.g.elementwise(ops[dt], [t.g.convert(t.arg(a), dt), t.g.convert(t.arg(b), dt)])


@rule(aten.frexp.Tensor)
def _frexp(t, node, x):
    return t.g.frexp(t.arg(x))


def _integer_binary(op):
    def fn(t, node, a, b):
        like = t.first_tensor(a, b)
        x, y = t.arg(a, like), t.arg(b, like)
        dt = dtype_name(_meta(node).dtype)
        if dt in FLOAT_DTYPES or dt == "bool":
            raise Unsupported(f"{op_name(op)} on {dt}")
        return t.g.elementwise(op, [t.g.convert(x, dt), t.g.convert(y, dt)])
    return fn


rule(aten.gcd.default)(_integer_binary(OpKind.Gcd))
rule(aten.lcm.default)(_integer_binary(OpKind.Lcm))
rule(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
     aten.__lshift__.Tensor, aten.__lshift__.Scalar)(_integer_binary(OpKind.ShiftLeft))
rule(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
     aten.__rshift__.Tensor, aten.__rshift__.Scalar)(_integer_binary(OpKind.ShiftRight))


@rule(aten.angle.default)
def _angle(t, node, x):
    """Of a real number; an integer input gives the default float dtype, as eager."""
    dt = dtype_name(_meta(node).dtype)
    if dt not in FLOAT_DTYPES:
        raise Unsupported(f"angle giving {dt}")
    return t.g.angle(t.g.convert(t.arg(x), dt))


# ---- small composites ----------------------------------------------------------------------

@rule(aten.addbmm.default)
def _addbmm(t, node, bias, b1, b2, beta=1, alpha=1):
    if any(d == 0 for d in node.args[1].meta["val"].shape[:1]):
        raise Unsupported("addbmm over an empty batch")
    return t.g.add_matmul(t.arg(bias), t.arg(b1), t.arg(b2), float(beta), float(alpha), True)


@rule(aten._trilinear.default)
def _trilinear(t, node, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    return t.g.trilinear(t.arg(i1), t.arg(i2), t.arg(i3), list(expand1), list(expand2),
                         list(expand3), list(sumdim))


# ---- random distributions ------------------------------------------------------------------
# Built on braze's Philox streams: uniform u in [0, 1) and standard normal z.

def _seed(t, node):
    """The graph's seed input (made once), after refusing an explicit generator."""
    if node.kwargs.get("generator") is not None:
        raise Unsupported("random numbers from an explicit generator")
    return t.seed_input(_meta(node).device)


@rule(aten.randint.default, aten.randint.low, aten.randint_like.default,
      aten.randint_like.low_dtype)
def _randint(t, node, *args, **kwargs):
    """An integer in [low, high)."""
    if node.target in (aten.randint.default, aten.randint_like.default):
        low, high = 0, args[1] if node.target == aten.randint_like.default else args[0]
    else:
        low, high = (args[1], args[2]) if node.target == aten.randint_like.low_dtype else args[:2]
    if not isinstance(low, int) or not isinstance(high, int):
        raise Unsupported("randint with symbolic bounds")
    val = _meta(node)
    return t.g.random_integer(dtype_name(val.dtype), t.shape(val.shape), _seed(t, node), low, high)


@rule(aten.uniform.default)
def _uniform(t, node, x, low=0.0, high=1.0, generator=None):
    val = _meta(node)
    return t.g.random_uniform(dtype_name(val.dtype), t.shape(val.shape), _seed(t, node),
                              float(low), float(high))


@rule(aten.bernoulli.p)
def _bernoulli(t, node, x, p=0.5, generator=None):
    if generator is not None:
        raise Unsupported("bernoulli with an explicit generator")
    if not isinstance(p, (int, float)):
        raise Unsupported("bernoulli with a symbolic p")
    val = _meta(node)
    return t.g.random_bernoulli(dtype_name(val.dtype), t.shape(val.shape), _seed(t, node),
                                float(p))


@rule(aten.geometric.default)
def _geometric(t, node, x, p, generator=None):
    val = _meta(node)
    return t.g.random_geometric(dtype_name(val.dtype), t.shape(val.shape), _seed(t, node), p)


@rule(aten.normal.Tensor_Tensor, aten.normal.Tensor_float, aten.normal.float_Tensor,
      aten.normal.float_float, aten.normal_functional.default)
def _normal(t, node, *args, **kwargs):
    """mean + std * z; mean and std are tensors or numbers."""
    if node.target == aten.normal_functional.default:
        mean, std = (list(args[1:3]) + [0.0, 1.0][len(args) - 1:])[:2]
        mean, std = kwargs.get("mean", mean), kwargs.get("std", std)
    elif node.target == aten.normal.Tensor_float:
        mean, std = args[0], args[1] if len(args) > 1 else kwargs.get("std", 1.0)
    else:
        mean, std = args[0], args[1]
    val = _meta(node)
    dt = dtype_name(val.dtype)

    def operand(v):
        return t.arg(v) if isinstance(v, torch.fx.Node) else _scalar(t, v, "f64")
    return t.g.random_normal(dt, t.shape(val.shape), _seed(t, node), operand(mean), operand(std))


# ---- searching, scans and histograms: search_sorted, cum_extreme and histogram ops ---------

@rule(aten.searchsorted.Tensor)
def _searchsorted(t, node, seq, values, out_int32=False, right=False, side=None, sorter=None):
    if side is not None:
        right = side == "right"
    return t.g.search_sorted(t.arg(seq), t.arg(values), None if sorter is None else t.arg(sorter),
                             bool(right), "i32" if out_int32 else "i64")


@rule(aten.bucketize.Tensor)
def _bucketize(t, node, values, boundaries, out_int32=False, right=False):
    if len(boundaries.meta["val"].shape) != 1:
        raise Unsupported("bucketize with boundaries that are not 1-D")
    return t.g.search_sorted(t.arg(boundaries), t.arg(values), None, bool(right),
                             "i32" if out_int32 else "i64")


@rule(aten.cummax.default, aten.cummin.default)
def _cummax(t, node, x, dim):
    return t.g.cum_extreme(t.arg(x), dim, node.target == aten.cummax.default)


# Largest exact count of a histogram bin that eager accumulates in half precision.
_HALF_EXACT_COUNT = {"f16": 2048, "bf16": 256}


@rule(aten.histc.default)
def _histc(t, node, x, bins=100, min=0, max=0):
    """A range taken from the data (min == max) is left to eager, which checks it is finite;
    so are half-precision counts past what eager's half-precision accumulation keeps exact.
    Integer input (a mixture of experts counts its tokens per expert so on CUDA) bins in
    integers with the range truncated, as eager's CUDA kernel does; eager's CPU kernel takes
    floating point only, and raises for integers as it always does."""
    dt = t.g.dtype(t.arg(x))
    val = x.meta["val"]
    if not val.dtype.is_floating_point:
        if val.device.type != "cuda":
            raise Unsupported(f"histc of {dt} on the CPU (eager's kernel takes floating point)")
        min, max = int(min), int(max)  # eager truncates the range to the input's integers
    if float(min) == float(max):
        raise Unsupported("histc with a range from the data")
    if x.meta["val"].numel() > _HALF_EXACT_COUNT.get(dt, x.meta["val"].numel()):
        raise Unsupported(f"histc of {x.meta['val'].numel()} {dt} elements (eager's count rounds)")
    return t.g.histogram(t.arg(x), int(bins), float(min), float(max))


@rule(aten.linalg_cross.default)
def _linalg_cross(t, node, a, b, dim=-1):
    """One cross op, each product and difference rounded in the result dtype as eager's kernel
    does (PyTorch's decomposition, used for the other dtypes, computes half precision in f32)."""
    return t.g.cross(t.arg(a), t.arg(b), dim)
