"""FX rules for a long tail of simpler ops: uninitialized creation, as_strided, whole-tensor
max/min, single-kernel pointwise ops, random distributions, bucketize / searchsorted,
cummax / cummin and _trilinear. Each rule either matches eager PyTorch or raises Unsupported."""
import math

import torch

from braze.fx_import import rule, Unsupported, dtype_name, aten, prims  # noqa: F401

_FLOATS = ("f16", "bf16", "f32", "f64")
_HALVES = ("f16", "bf16")


def _meta(node):
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise Unsupported("result is not a tensor")
    if val.device.type != "cpu":
        raise Unsupported(f"result on {val.device}")
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
    """A view of x's storage as an index remap: valid when x is contiguous, so that its storage
    order is its row-major order, and every element the view reads lies inside x."""
    if not isinstance(x, torch.fx.Node):
        raise Unsupported("as_strided of a non-tensor")
    src = x.meta.get("val")
    if not isinstance(src, torch.Tensor):
        raise Unsupported("as_strided of an input without a known layout")
    size, stride = _static(size, "as_strided"), _static(stride, "as_strided")
    src_shape = _static(src.shape, "as_strided")
    try:
        contiguous = bool(src.is_contiguous())
        base = int(src.storage_offset())
        offset = base if storage_offset is None else int(storage_offset)
    except Exception:
        raise Unsupported("as_strided of a tensor with a symbolic layout")
    if not contiguous:
        raise Unsupported("as_strided of a non-contiguous tensor (its storage order is unknown)")
    h = t.arg(x)
    dt = t.g.dtype(h)
    shape = [t.sym(s) for s in size]
    if any(s == 0 for s in size):
        return t.g.full(0.0, dt, shape)
    off = offset - base
    lo = off + sum(min(0, (s - 1) * st) for s, st in zip(size, stride))
    hi = off + sum(max(0, (s - 1) * st) for s, st in zip(size, stride))
    n = math.prod(src_shape)
    if lo < 0 or hi >= n:
        raise Unsupported("as_strided reads storage outside its input's elements")
    flat = t.g.reshape(h, [t.sym(n)])
    idx = _scalar(t, off, "i64")
    for d, (s, st) in enumerate(zip(size, stride)):
        if s != 1 and st != 0:
            term = t.g.iota("i64", shape, d)
            if st != 1:
                term = t.g.elementwise("mul", [term, _scalar(t, st, "i64")])
            idx = t.g.elementwise("add", [idx, term])
    idx = t.g.expand(idx, shape)
    if not shape:
        return t.g.reshape(t.g.take(flat, 0, t.g.reshape(idx, [t.sym(1)])), [])
    return t.g.take(flat, 0, idx)


# ---- reductions ----------------------------------------------------------------------------

@rule(aten.max.default, aten.min.default)
def _max_all(t, node, x):
    h = t.arg(x)
    if any(d == 0 for d in node.args[0].meta["val"].shape):
        raise Unsupported("max/min of an empty tensor (eager raises)")
    return t.g.reduce("amax" if node.target == aten.max.default else "amin", h, [], False, None)


# ---- pointwise -----------------------------------------------------------------------------

@rule(aten.fmax.default, aten.fmin.default)
def _fmax(t, node, a, b):
    """maximum / minimum that take the other operand where one is NaN."""
    dt = dtype_name(_meta(node).dtype)
    x, y = t.g.convert(t.arg(a), dt), t.g.convert(t.arg(b), dt)
    m = t.g.elementwise("maximum" if node.target == aten.fmax.default else "minimum", [x, y])
    if dt not in _FLOATS:
        return m
    m = t.g.elementwise("where", [t.g.elementwise("isnan", [y]), x, m])
    return t.g.elementwise("where", [t.g.elementwise("isnan", [x]), y, m])


@rule(aten.signbit.default)
def _signbit(t, node, x):
    h = t.arg(x)
    dt = t.g.dtype(h)
    if dt in _FLOATS:
        # copysign carries the sign bit of -0.0 and of a negative NaN.
        h = t.g.elementwise("copysign", [_scalar(t, 1.0, dt), h])
    elif dt == "bool":
        h = t.g.convert(h, "u8")
    return t.g.elementwise("lt", [h, _scalar(t, 0, t.g.dtype(h))])


@rule(aten.ldexp.Tensor)
def _ldexp(t, node, x, other):
    """x * 2 ** other, as eager composes it (pow of the scalar 2, then mul)."""
    e = t.arg(other)
    pdt = t.g.dtype(e) if t.g.dtype(e) in _FLOATS else "f32"
    p = t.g.elementwise("pow", [_scalar(t, 2.0, pdt), t.g.convert(e, pdt)])
    return t.g.elementwise("mul", [t.arg(x), p])


@rule(aten.round.decimals)
def _round_decimals(t, node, x, decimals=0):
    """nearbyint(x * 10^d) / 10^d (or x / 10^-d ... * 10^-d), in f32 for half precision and
    rounded once at the end, as eager's kernel does."""
    h = t.arg(x)
    dt = t.g.dtype(h)
    if dt not in _FLOATS:
        raise Unsupported(f"round with decimals on {dt}")
    if decimals == 0:
        return t.g.elementwise("round", [h])
    ct = "f32" if dt in _HALVES else dt
    h = t.g.convert(h, ct)
    ten = _scalar(t, float(10.0 ** abs(decimals)), ct)
    if decimals > 0:
        r = t.g.elementwise("div", [t.g.elementwise("round", [t.g.elementwise("mul", [h, ten])]), ten])
    else:
        r = t.g.elementwise("mul", [t.g.elementwise("round", [t.g.elementwise("div", [h, ten])]), ten])
    return t.g.convert(r, dt)


@rule(aten.hypot.default)
def _hypot(t, node, a, b):
    return t.g.elementwise("hypot", [t.arg(a), t.arg(b)])


@rule(aten.nextafter.default)
def _nextafter(t, node, a, b):
    dt = dtype_name(_meta(node).dtype)
    if dt not in ("f32", "f64"):
        raise Unsupported(f"nextafter on {dt} (braze steps in f32 or f64 only)")
    return t.g.elementwise("nextafter", [t.g.convert(t.arg(a), dt), t.g.convert(t.arg(b), dt)])


@rule(aten.frexp.Tensor)
def _frexp(t, node, x):
    h = t.arg(x)
    if t.g.dtype(h) not in _FLOATS:
        raise Unsupported("frexp of an integer tensor")
    # A half-precision value's mantissa is exact in its own type, so computing in f32 is exact.
    mantissa = t.g.elementwise("frexp_mantissa", [h])
    exponent = t.g.convert(t.g.elementwise("frexp_exponent", [h]), "i32")
    return (mantissa, exponent)


def _integer_binary(op):
    def fn(t, node, a, b):
        like = t.first_tensor(a, b)
        x, y = t.arg(a, like), t.arg(b, like)
        dt = dtype_name(_meta(node).dtype)
        if dt in _FLOATS or dt == "bool":
            raise Unsupported(f"{op} on {dt}")
        return t.g.elementwise(op, [t.g.convert(x, dt), t.g.convert(y, dt)])
    return fn


rule(aten.gcd.default)(_integer_binary("gcd"))
rule(aten.lcm.default)(_integer_binary("lcm"))
rule(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
     aten.__lshift__.Tensor, aten.__lshift__.Scalar)(_integer_binary("shift_left"))
rule(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
     aten.__rshift__.Tensor, aten.__rshift__.Scalar)(_integer_binary("shift_right"))


@rule(aten.angle.default)
def _angle(t, node, x):
    """Of a real number: pi for negatives, 0 otherwise, NaN stays NaN."""
    dt = dtype_name(_meta(node).dtype)
    if dt not in _FLOATS:
        raise Unsupported(f"angle giving {dt}")
    h = t.g.convert(t.arg(x), dt)
    zero = _scalar(t, 0.0, dt)
    r = t.g.elementwise("where", [t.g.elementwise("lt", [h, zero]), _scalar(t, math.pi, dt), zero])
    return t.g.elementwise("where", [t.g.elementwise("isnan", [h]), h, r])
