"""Complex values as pairs of reals, and the discrete Fourier transforms on them.

A complex FX value of shape S is held in the braze graph as a real tensor of shape S + [2]
(real part, imaginary part) of the matching real dtype: torch.view_as_real's layout, so complex
graph inputs and outputs cross the boundary as zero-copy views. Only the rules registered here
accept complex operands; any other op on a complex value stays in eager PyTorch (see
Translator.translate).

The transforms (_fft_r2c, _fft_c2c, _fft_c2r) run one dim at a time as a matrix product with a
twiddle matrix built in the graph (f64, with the angle reduced as (j*k mod n) / n so it stays
exact for large j*k). That is an O(n^2) DFT per dim, computed in double and rounded once:
accurate, fast through BLAS for the sizes of typical signals, and capped (longer dims fall back).
"""
import math

import torch

from braze import fx_import
from braze.fx_import import Unsupported, aten, dtype_name, ew, rule

# Longest transformed dim braze takes (the DFT is quadratic in it).
_MAX_DFT = 4096

_REAL_OF = {torch.complex32: torch.float16, torch.complex64: torch.float32,
            torch.complex128: torch.float64}

_previous = dict(fx_import._RULES)  # the real-valued rules this module wraps


def _is_complex(node):
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.is_complex()


def _real_dtype(val):
    if val.dtype not in _REAL_OF:
        raise Unsupported(f"dtype {val.dtype}")
    return dtype_name(_REAL_OF[val.dtype])


def _unpack(t, h):
    """(re, im) of a pair tensor."""
    last = len(t.g.shape(h)) - 1
    return tuple(t.g.squeeze(t.g.slice(h, last, i, i + 1, 1), [last]) for i in (0, 1))


def _pack(t, re, im):
    return t.g.concat([t.g.unsqueeze(re, len(t.g.shape(re))), t.g.unsqueeze(im, len(t.g.shape(im)))],
                      len(t.g.shape(re)))


def _complex_rule(*targets):
    """Registers a rule that accepts complex operands (Translator.translate checks the mark)."""
    def wrap(fn):
        fn.accepts_complex = True
        return rule(*targets)(fn)
    return wrap


def _delegate(node, t, *args, **kwargs):
    return _previous[node.target](t, node, *args, **kwargs)


@_complex_rule(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default)
def _clone(t, node, x, **kwargs):
    return t.arg(x)


@_complex_rule(aten._to_copy.default, torch.ops.prims.convert_element_type.default)
def _to_copy(t, node, x, dtype=None, **kwargs):
    out = node.meta["val"]
    if not out.is_complex():
        if _is_complex(x):
            raise Unsupported("complex to real conversion (drops the imaginary part)")
        return _delegate(node, t, x, dtype, **kwargs)
    device = kwargs.get("device")
    if device is not None:
        t.on_device(device, "copy")
    want = _real_dtype(out)
    h = t.g.convert(t.arg(x), want)
    if _is_complex(x):
        return h
    return _pack(t, h, t.g.full(0.0, want, t.g.shape(h)))


@_complex_rule(aten._conj.default, aten._conj_physical.default, aten.conj_physical.default)
def _conj(t, node, x):
    h = t.arg(x)
    if not _is_complex(x):
        return h
    re, im = _unpack(t, h)
    return _pack(t, re, ew(t, "neg", im))


@_complex_rule(aten.slice.Tensor)
def _slice(t, node, x, dim=0, start=None, end=None, step=1):
    if _is_complex(x):
        dim %= max(x.meta["val"].dim(), 1)
    return _delegate(node, t, x, dim, start, end, step)


@_complex_rule(aten.constant_pad_nd.default)
def _pad(t, node, x, pad, value=0):
    if not _is_complex(x):
        return _delegate(node, t, x, pad, value)
    if value != 0:
        raise Unsupported("padding a complex tensor with a non-zero value")
    return _delegate(node, t, x, [0, 0] + list(pad), 0)


@_complex_rule(aten.view_as_complex.default, aten.view_as_real.default)
def _view_as(t, node, x):
    """Both are the identity on the pair representation."""
    return t.arg(x)


@_complex_rule(aten.complex.default)
def _complex(t, node, re, im):
    want = _real_dtype(node.meta["val"])
    h_re, h_im = t.g.convert(t.arg(re), want), t.g.convert(t.arg(im), want)
    shape = [t.sym(d) for d in node.meta["val"].shape]
    return _pack(t, t.g.expand(h_re, shape), t.g.expand(h_im, shape))


# ---- discrete Fourier transforms ---------------------------------------------------------

def _angles(t, rows, cols, n, row_mod, col_mod):
    """2*pi*((j mod row_mod) * (k mod col_mod) mod n) / n over a [rows, cols] grid (f64)."""
    shape = [t.g.sym_const(rows), t.g.sym_const(cols)]
    j = ew(t, "remainder", t.g.iota("i64", shape, 0), t.g.full(float(row_mod), "i64", []))
    k = ew(t, "remainder", t.g.iota("i64", shape, 1), t.g.full(float(col_mod), "i64", []))
    jk = ew(t, "remainder", ew(t, "mul", j, k), t.g.full(float(n), "i64", []))
    return ew(t, "mul", t.g.convert(jk, "f64"), t.g.full(2 * math.pi / n, "f64", [])), j, k


def _static(t, h):
    """h's shape as ints (the transforms need static sizes)."""
    out = []
    for s in t.g.shape(h):
        text = t.g.sym_str(s)
        if not text.lstrip("-").isdigit():
            raise Unsupported(f"Fourier transform of a tensor with symbolic size {text}")
        out.append(int(text))
    return out


def _apply_along(t, x, dim, w, m):
    """x (f64) with its dim `dim` (length = w's rows) replaced by x @ w along it (length m)."""
    shape = _static(t, x)
    rank = len(shape)
    perm = [d for d in range(rank) if d != dim] + [dim]
    moved = t.g.permute(x, perm) if perm != list(range(rank)) else x
    rows = 1
    for d in perm[:-1]:
        rows *= shape[d]
    flat = t.g.reshape(moved, [t.g.sym_const(rows), t.g.sym_const(shape[dim])])
    out = t.g.matmul(flat, w)
    out = t.g.reshape(out, [t.g.sym_const(shape[d]) for d in perm[:-1]] + [t.g.sym_const(m)])
    inverse = [perm.index(d) for d in range(rank)]
    return t.g.permute(out, inverse) if inverse != list(range(rank)) else out


def _check_length(n):
    if n > _MAX_DFT:
        raise Unsupported(f"Fourier transform over a dim of {n} (braze transforms dims up to {_MAX_DFT})")
    if n == 0:
        raise Unsupported("Fourier transform over an empty dim")


def _c2c_dim(t, re, im, dim, forward):
    """One complex DFT along dim of (re, im) (f64; im may be None for a real signal)."""
    n = int(_static(t, re)[dim])
    _check_length(n)
    theta, _, _ = _angles(t, 2 * n, 2 * n, n, n, n)
    c, s = ew(t, "cos", theta), ew(t, "sin", theta)
    if not forward:
        s = ew(t, "neg", s)
    # [re | im] @ [[C, -S], [S, C]]: rows j < n take re, cols k < n give the real part.
    top_j = ew(t, "lt", t.g.iota("i64", t.g.shape(theta), 0), t.g.full(float(n), "i64", []))
    left_k = ew(t, "lt", t.g.iota("i64", t.g.shape(theta), 1), t.g.full(float(n), "i64", []))
    same = ew(t, "eq", top_j, left_k)
    w = ew(t, "where", same, c, ew(t, "where", top_j, ew(t, "neg", s), s))
    if im is None:
        im = t.g.full(0.0, "f64", t.g.shape(re))
    both = t.g.concat([re, im], dim)
    out = _apply_along(t, both, dim, w, 2 * n)
    return (t.g.slice(out, dim, 0, n, 1), t.g.slice(out, dim, n, 2 * n, 1))


def _r2c_dim(t, re, dim, onesided):
    n = int(_static(t, re)[dim])
    _check_length(n)
    m = n // 2 + 1 if onesided else n
    theta, _, _ = _angles(t, n, 2 * m, n, n, m)
    left_k = ew(t, "lt", t.g.iota("i64", t.g.shape(theta), 1), t.g.full(float(m), "i64", []))
    w = ew(t, "where", left_k, ew(t, "cos", theta), ew(t, "neg", ew(t, "sin", theta)))
    out = _apply_along(t, re, dim, w, 2 * m)
    return (t.g.slice(out, dim, 0, m, 1), t.g.slice(out, dim, m, 2 * m, 1))


def _c2r_dim(t, re, im, dim, n):
    """The real signal of length n whose one-sided (Hermitian) spectrum is (re, im) along dim."""
    _check_length(n)
    length = int(_static(t, re)[dim])
    half = n // 2 + 1
    theta, kk, _ = _angles(t, 2 * length, n, n, length, n)
    weight = ew(t, "where",
                 ew(t, "logical_or", ew(t, "eq", kk, t.g.full(0.0, "i64", [])),
                     ew(t, "eq", ew(t, "mul", kk, t.g.full(2.0, "i64", [])), t.g.full(float(n), "i64", []))),
                 t.g.full(1.0, "f64", []), t.g.full(2.0, "f64", []))
    used = ew(t, "lt", kk, t.g.full(float(half), "i64", []))
    weight = ew(t, "where", used, weight, t.g.full(0.0, "f64", []))
    top = ew(t, "lt", t.g.iota("i64", t.g.shape(theta), 0), t.g.full(float(length), "i64", []))
    w = ew(t, "mul", weight, ew(t, "where", top, ew(t, "cos", theta), ew(t, "neg", ew(t, "sin", theta))))
    return _apply_along(t, t.g.concat([re, im], dim), dim, w, n)


def _scale(t, hs, normalization, n):
    if normalization == 0:
        return hs
    factor = 1 / math.sqrt(n) if normalization == 1 else 1 / n
    f = t.g.full(factor, "f64", [])
    return tuple(ew(t, "mul", h, f) for h in hs)


def _dims(x, dims):
    rank = x.meta["val"].dim()
    return [d % rank for d in dims]


def _finish(t, node, re, im):
    want = _real_dtype(node.meta["val"])
    return _pack(t, t.g.convert(re, want), t.g.convert(im, want))


def _signal(t, x, dim, complex_input, what):
    """(dims normalized, sizes along them, re, im) of an FFT operand, in f64 (im None if real)."""
    if _is_complex(x) != complex_input:
        raise Unsupported(f"{what} of a {'real' if complex_input else 'complex'} tensor")
    dims = _dims(x, dim)
    if not dims:
        raise Unsupported("Fourier transform over no dims")
    shape = x.meta["val"].shape
    sizes = [int(shape[d]) for d in dims]
    h = t.arg(x)
    if complex_input:
        re, im = (t.g.convert(part, "f64") for part in _unpack(t, h))
    else:
        re, im = t.g.convert(h, "f64"), None
    return dims, sizes, re, im


@_complex_rule(aten._fft_r2c.default)
def _fft_r2c(t, node, x, dim, normalization, onesided):
    dims, sizes, re, _ = _signal(t, x, dim, False, "r2c")
    re, im = _r2c_dim(t, re, dims[-1], onesided)
    for d in reversed(dims[:-1]):
        re, im = _c2c_dim(t, re, im, d, True)
    re, im = _scale(t, (re, im), normalization, math.prod(sizes))
    return _finish(t, node, re, im)


@_complex_rule(aten._fft_c2c.default)
def _fft_c2c(t, node, x, dim, normalization, forward):
    dims, sizes, re, im = _signal(t, x, dim, True, "c2c")
    for d in reversed(dims):
        re, im = _c2c_dim(t, re, im, d, forward)
    re, im = _scale(t, (re, im), normalization, math.prod(sizes))
    return _finish(t, node, re, im)


@_complex_rule(aten._fft_c2r.default)
def _fft_c2r(t, node, x, dim, normalization, last_dim_size):
    if not isinstance(last_dim_size, int):
        raise Unsupported("c2r with a symbolic output size")
    dims, sizes, re, im = _signal(t, x, dim, True, "c2r")
    for d in reversed(dims[:-1]):
        re, im = _c2c_dim(t, re, im, d, False)
    out = _c2r_dim(t, re, im, dims[-1], last_dim_size)
    (out,) = _scale(t, (out,), normalization, math.prod(sizes[:-1]) * last_dim_size)
    return t.g.convert(out, dtype_name(node.meta["val"].dtype))
