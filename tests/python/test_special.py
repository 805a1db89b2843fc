"""Special functions (gamma family, incomplete gamma, erfcx and the inverses of erf and the normal
CDF, Bessel and Airy functions, orthogonal polynomials) compile and match eager."""
import pytest
import torch

import braze
from _device import eager

S = torch.special
FLOATS = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


def tolerances(dtype):
    if dtype == torch.float64:
        return dict(rtol=1e-7, atol=1e-7)
    if dtype in (torch.float16, torch.bfloat16):
        return dict(rtol=1e-2, atol=1e-2)
    return dict(rtol=1.3e-6, atol=1e-5)


def check(fn, *args, dtype=torch.float32, fallback=False):
    """fn compiled by braze equals fn in eager; with fallback=False nothing falls back."""
    before = braze.counters()
    out = torch.compile(fn, backend="braze", dynamic=False)(*args)
    after = braze.counters()
    expected = eager(fn, *args)  # the CPU's where CUDA has no kernel for the dtype
    torch.testing.assert_close(out, expected, equal_nan=True, **tolerances(dtype))
    fell_back = after["fallback_ops"] > before["fallback_ops"]
    assert fell_back == fallback, "fell back" if fell_back else "compiled"
    return out


def uniform(shape, lo, hi, dtype, seed=0):
    g = torch.Generator(torch.get_default_device()).manual_seed(seed)
    return (torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(dtype)


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64])
def test_gamma_family(dtype):
    x = uniform((40,), -9, 9, dtype)
    pos = uniform((40,), 0.1, 9, dtype, seed=1)
    check(lambda x, p: (torch.digamma(x), torch.polygamma(1, x), torch.polygamma(2, p),
                        torch.polygamma(3, p)), x, pos, dtype=dtype)
    if dtype not in (torch.float16, torch.bfloat16):  # eager has no half zeta
        check(lambda p: S.zeta(p + 1, p), pos, dtype=dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_incomplete_gamma(dtype):
    a, x = uniform((8, 5), 0.01, 20, dtype), uniform((8, 5), 0, 25, dtype, seed=1)
    fn = lambda a, x: (torch.igamma(a, x), torch.igammac(a, x))
    if a.is_cuda and dtype in (torch.float16, torch.bfloat16):
        # Eager CUDA has no half-precision igamma kernel; the compiled call raises its error.
        with pytest.raises(NotImplementedError, match="igamma_cuda"):
            fn(a, x)
        with pytest.raises(NotImplementedError, match="igamma_cuda"):
            torch.compile(fn, backend="braze", dynamic=False)(a, x)
        return
    check(fn, a, x, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.int32, torch.bool])
def test_error_function_inverses(dtype):
    x = uniform((6, 7), -9, 9, dtype)
    u = uniform((6, 7), -1, 1, torch.float64, seed=1).to(dtype if dtype.is_floating_point else torch.float64)
    p = (u + 1) / 2
    check(lambda x, u, p: (S.erfcx(x), torch.erfinv(u), S.ndtri(p), S.log_ndtr(x)), x, u, p,
          dtype=dtype if dtype.is_floating_point else torch.float32)


@pytest.mark.parametrize("dtype", FLOATS + [torch.uint8])
def test_modified_bessel(dtype):
    x = uniform((50,), -30, 30, dtype) if dtype != torch.uint8 else torch.arange(50, dtype=dtype)
    check(lambda x: (torch.i0(x), S.i0e(x), S.i1(x), S.i1e(x)), x, dtype=dtype)
    if dtype in (torch.float64, torch.float32, torch.uint8):  # eager has no half versions
        check(lambda x: (S.modified_bessel_i0(x), S.modified_bessel_i1(x),
                         S.modified_bessel_k0(x), S.modified_bessel_k1(x),
                         S.scaled_modified_bessel_k0(x), S.scaled_modified_bessel_k1(x),
                         S.spherical_bessel_j0(x)), x, dtype=dtype)


def test_bessel_and_airy():
    x = uniform((10, 10), -25, 25, torch.float32)
    check(lambda x: (S.bessel_j0(x), S.bessel_j1(x), S.bessel_y0(x), S.bessel_y1(x),
                     S.airy_ai(x)), x)
    # Eager's float64 kernels are inexact on parts of the line; float64 stays with eager.
    check(S.bessel_j0, x.double(), dtype=torch.float64, fallback=True)


POLYNOMIALS = [
    S.chebyshev_polynomial_t, S.chebyshev_polynomial_u, S.chebyshev_polynomial_v,
    S.chebyshev_polynomial_w, S.shifted_chebyshev_polynomial_t, S.shifted_chebyshev_polynomial_u,
    S.shifted_chebyshev_polynomial_v, S.shifted_chebyshev_polynomial_w, S.hermite_polynomial_h,
    S.hermite_polynomial_he, S.laguerre_polynomial_l, S.legendre_polynomial_p,
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.int64])
def test_polynomials(dtype):
    x = torch.cat([uniform((30,), -1.5, 1.5, torch.float64), torch.tensor([-1.0, 0.0, 0.5, 1.0])])
    n = torch.tensor(([-2, 0, 1, 2, 3, 5, 7, 9, 12, 20] * 4)[:34], dtype=torch.float64)
    if dtype == torch.int64:
        x = uniform((34,), -3, 3, torch.float64).round()
    x, n = x.to(dtype), n.to(dtype)
    check(lambda x, n: tuple(f(x, n) for f in POLYNOMIALS), x, n, dtype=dtype)
    # A scalar degree and a scalar x.
    check(lambda x: tuple(f(x, 4) for f in POLYNOMIALS), x, dtype=dtype)
    check(lambda n: tuple(f(0.25, n) for f in POLYNOMIALS), n, dtype=dtype)


def test_edge_values():
    v = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, -1.0, -2.0, -2.5, 1.0,
                      1e-300, 1e-20, 2.0, 0.5, 30.0, 700.0, -700.0], dtype=torch.float64)
    check(lambda v: (torch.digamma(v), torch.polygamma(1, v), torch.polygamma(2, v), S.erfcx(v),
                     torch.erfinv(v), S.ndtri(v), torch.i0(v), S.i0e(v), S.i1(v), S.i1e(v),
                     S.modified_bessel_k0(v), S.modified_bessel_k1(v),
                     S.scaled_modified_bessel_k0(v), S.scaled_modified_bessel_k1(v),
                     S.spherical_bessel_j0(v)), v, dtype=torch.float64)
    q = torch.tensor([1.0, 2.0, -1.5, -2.0, 0.0, float("nan"), float("inf"), 0.5], dtype=torch.float64)
    for s in [2.0, 1.0, 0.5, 3.0, float("inf"), 2.5]:
        check(lambda q: S.zeta(torch.full_like(q, s), q), q, dtype=torch.float64)
    a = v.abs().reshape(-1, 1)
    check(lambda a, x: (torch.igamma(a, x), torch.igammac(a, x)), a, v, dtype=torch.float64)


def test_shapes_and_layouts():
    x = uniform((4, 6), 0.1, 5, torch.float32)
    check(lambda x: torch.digamma(x.t()) + S.i0e(x.t()), x)            # non-contiguous
    check(lambda x: S.erfcx(x), torch.tensor(1.5))                       # 0-d
    check(lambda x: S.zeta(x, 2.0), torch.empty(0, 3))                    # empty
    # Broadcast. The device is named: Dynamo traces a factory call without the default device.
    check(lambda x: S.chebyshev_polynomial_t(x[:, :1], torch.arange(6.0, device=x.device)), x)


def test_polygamma_negative_order_is_eagers_error():
    x = torch.rand(4)
    with pytest.raises(RuntimeError, match="does not support negative n"):
        torch.compile(lambda x: torch.polygamma(-1, x), backend="braze")(x)
