"""Complex values as pairs of reals, and the discrete Fourier transforms on them.

A complex FX value of shape S is held in the braze graph as a real tensor of shape S + [2]
(real part, imaginary part) of the matching real dtype: torch.view_as_real's layout, so complex
graph inputs and outputs cross the boundary as zero-copy views. Only the rules registered here
accept complex operands; any other op on a complex value stays in eager PyTorch (see
Translator.translate).

The transforms (_fft_r2c, _fft_c2c, _fft_c2r) are one fft op each (GraphBuilder::fft, lowered
in lowering/decompose/Fourier.cpp): one dim at a time as a matrix product with a twiddle matrix,
in f64, rounded once; dims longer than GraphBuilder::kMaxDft fall back.
"""
import torch

from braze.registry import Unsupported, aten, complex_rule, dtype_name, real_rule

_REAL_OF = {torch.complex32: torch.float16, torch.complex64: torch.float32,
            torch.complex128: torch.float64}


def _is_complex(node):
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.is_complex()


def _real_dtype(val):
    if val.dtype not in _REAL_OF:
        raise Unsupported(f"dtype {val.dtype}")
    return dtype_name(_REAL_OF[val.dtype])


def _delegate(node, t, *args, **kwargs):
    """The real-valued rule of the node's target, for a node without complex values."""
    return real_rule(node.target)(t, node, *args, **kwargs)


@complex_rule(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default)
def _clone(t, node, x, **kwargs):
    return t.arg(x)


@complex_rule(aten._to_copy.default, torch.ops.prims.convert_element_type.default)
def _to_copy(t, node, x, dtype=None, **kwargs):
    out = node.meta["val"]
    if not out.is_complex():
        if _is_complex(x):
            raise Unsupported("complex to real conversion (drops the imaginary part)")
        return _delegate(node, t, x, dtype, **kwargs)
    device = kwargs.get("device")
    if device is not None:
        t.on_device(device, "copy")
    h = t.g.convert(t.arg(x), _real_dtype(out))
    return h if _is_complex(x) else t.g.complex(h, None)


@complex_rule(aten._conj.default, aten._conj_physical.default, aten.conj_physical.default)
def _conj(t, node, x):
    return t.g.conj(t.arg(x)) if _is_complex(x) else t.arg(x)


@complex_rule(aten.slice.Tensor)
def _slice(t, node, x, dim=0, start=None, end=None, step=1):
    if _is_complex(x):
        dim %= max(x.meta["val"].dim(), 1)
    return _delegate(node, t, x, dim, start, end, step)


@complex_rule(aten.constant_pad_nd.default)
def _pad(t, node, x, pad, value=0):
    if not _is_complex(x):
        return _delegate(node, t, x, pad, value)
    if value != 0:
        raise Unsupported("padding a complex tensor with a non-zero value")
    return _delegate(node, t, x, [0, 0] + list(pad), 0)


@complex_rule(aten.view_as_complex.default, aten.view_as_real.default)
def _view_as(t, node, x):
    """Both are the identity on the pair representation."""
    return t.arg(x)


@complex_rule(aten.complex.default)
def _complex(t, node, re, im):
    want = _real_dtype(node.meta["val"])
    return t.g.complex(t.g.convert(t.arg(re), want), t.g.convert(t.arg(im), want))


# ---- discrete Fourier transforms ---------------------------------------------------------

def _fft(t, node, x, dim, complex_input, mode, normalization, flag, last_size=0):
    """One fft op (lowering/decompose/Fourier.cpp) over the normalized dims of x's signal."""
    if _is_complex(x) != complex_input:
        raise Unsupported(f"{mode} of a {'real' if complex_input else 'complex'} tensor")
    if node.meta["val"].is_complex():
        _real_dtype(node.meta["val"])  # Unsupported for a complex dtype braze does not hold
    rank = x.meta["val"].dim()
    dims = sorted(d % rank for d in dim) if rank else []
    if not dims:
        raise Unsupported("Fourier transform over no dims")
    return t.g.fft(t.arg(x), mode, dims, int(normalization), bool(flag), int(last_size))


@complex_rule(aten._fft_r2c.default)
def _fft_r2c(t, node, x, dim, normalization, onesided):
    return _fft(t, node, x, dim, False, "r2c", normalization, onesided)


@complex_rule(aten._fft_c2c.default)
def _fft_c2c(t, node, x, dim, normalization, forward):
    return _fft(t, node, x, dim, True, "c2c", normalization, forward)


@complex_rule(aten._fft_c2r.default)
def _fft_c2r(t, node, x, dim, normalization, last_dim_size):
    if not isinstance(last_dim_size, int):
        raise Unsupported("c2r with a symbolic output size")
    return _fft(t, node, x, dim, True, "c2r", normalization, False, last_dim_size)
