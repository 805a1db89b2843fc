"""FX rules for special mathematical functions: the gamma family, erfcx and the inverses of erf
and the normal CDF, Bessel and Airy functions, and the orthogonal polynomials. Each is one
elementwise braze op on operands converted to the result's float dtype (integer and bool
inputs promote to the default float dtype, as in eager)."""
import torch

from braze.registry import FLOAT_DTYPES, OpKind, rule, Unsupported, dtype_name, aten, op_kind



def _result_dtype(node):
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise Unsupported(f"{node.target} without a tensor result")
    out = dtype_name(val.dtype)
    if out not in FLOAT_DTYPES:
        raise Unsupported(f"{node.target} with a {out} result")
    return out


def _apply(t, node, op, args):
    out = _result_dtype(node)
    like = t.first_tensor(*args)
    hs = []
    for a in args:
        h = t.arg(a, like)
        if t.g.dtype(h) != out:
            h = t.g.convert(h, out)
        hs.append(h)
    return t.g.elementwise(op, hs)


def _special(op, inexact_eager_f64=False):
    def fn(t, node, *args):
        if (op in (OpKind.Igamma, OpKind.Igammac) and t.device is not None and t.device.type == "cuda"
                and _result_dtype(node) in ("f16", "bf16")):
            # Eager CUDA has no half-precision kernel: the call runs in eager and raises its error.
            raise Unsupported(f"{node.target} in {_result_dtype(node)} on CUDA (eager has no kernel)")
        if inexact_eager_f64 and _result_dtype(node) == "f64":
            # Eager's float64 kernels for these differ from the exact values by up to 5e-7
            # on parts of [-9, 9] (e.g. bessel_j0 on 5 < |x| < 5.72), past float64's
            # comparison tolerance; braze's values are the exact ones, so leave f64 to eager.
            raise Unsupported(f"{node.target} in float64 (eager's kernel is inexact)")
        return _apply(t, node, op, args)
    return fn


for _op, _targets, _inexact in [
    ("digamma", [aten.digamma.default, aten.special_digamma.default], False),
    ("zeta", [aten.special_zeta.default, aten.special_zeta.self_scalar,
              aten.special_zeta.other_scalar], False),
    ("erfcx", [aten.special_erfcx.default], False),
    ("erfinv", [aten.erfinv.default], False),
    ("ndtri", [aten.special_ndtri.default], False),
    ("bessel_i0", [aten.i0.default, aten.special_i0.default,
                   aten.special_modified_bessel_i0.default], False),
    ("bessel_i0e", [aten.special_i0e.default], False),
    ("bessel_i1", [aten.special_i1.default, aten.special_modified_bessel_i1.default], False),
    ("bessel_i1e", [aten.special_i1e.default], False),
    ("bessel_k0", [aten.special_modified_bessel_k0.default], False),
    ("bessel_k0e", [aten.special_scaled_modified_bessel_k0.default], False),
    ("bessel_k1", [aten.special_modified_bessel_k1.default], False),
    ("bessel_k1e", [aten.special_scaled_modified_bessel_k1.default], False),
    ("bessel_j0", [aten.special_bessel_j0.default], True),
    ("bessel_j1", [aten.special_bessel_j1.default], True),
    ("bessel_y0", [aten.special_bessel_y0.default], True),
    ("bessel_y1", [aten.special_bessel_y1.default], True),
    ("spherical_bessel_j0", [aten.special_spherical_bessel_j0.default], False),
    ("airy_ai", [aten.special_airy_ai.default], True),
    ("igamma", [aten.igamma.default, aten.special_gammainc.default], False),
    ("igammac", [aten.igammac.default, aten.special_gammaincc.default], False),
]:
    rule(*_targets)(_special(op_kind(_op), _inexact))


@rule(aten.polygamma.default, aten.special_polygamma.default)
def _polygamma(t, node, n, x):
    if not isinstance(n, int) or isinstance(n, bool):
        raise Unsupported(f"polygamma with order {n!r}")
    if n < 0:
        raise Unsupported("polygamma with a negative order (eager raises)")
    if n == 0:
        return _apply(t, node, OpKind.Digamma, [x])
    return _apply(t, node, OpKind.Polygamma, [n, x])


_POLYNOMIALS = {
    "chebyshev_t": "special_chebyshev_polynomial_t",
    "chebyshev_u": "special_chebyshev_polynomial_u",
    "chebyshev_v": "special_chebyshev_polynomial_v",
    "chebyshev_w": "special_chebyshev_polynomial_w",
    "shifted_chebyshev_t": "special_shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_u": "special_shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_v": "special_shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_w": "special_shifted_chebyshev_polynomial_w",
    "hermite_h": "special_hermite_polynomial_h",
    "hermite_he": "special_hermite_polynomial_he",
    "laguerre_l": "special_laguerre_polynomial_l",
    "legendre_p": "special_legendre_polynomial_p",
}


def _polynomial(op):
    def fn(t, node, x, n):
        # n is truncated to an integer inside the op; x and n share the result dtype as in eager.
        return _apply(t, node, op, [x, n])
    return fn


for _op, _name in _POLYNOMIALS.items():
    _packet = getattr(aten, _name)
    rule(*[getattr(_packet, o) for o in ("default", "x_scalar", "n_scalar")])(
        _polynomial(op_kind(_op)))
