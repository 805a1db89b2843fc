"""Discrete Fourier transforms (torch.fft) and real<->complex conversions compile, with complex
values held as (re, im) pairs; results match eager within the dtype's tolerance."""
import pytest
import torch

import braze

torch.manual_seed(0)
NORMS = (None, "ortho", "forward")

TRANSFORMS = {
    "fft": lambda x, norm: torch.fft.fft(x, norm=norm),
    "ifft": lambda x, norm: torch.fft.ifft(x, norm=norm),
    "rfft": lambda x, norm: torch.fft.rfft(x, norm=norm),
    "rfft_padded": lambda x, norm: torch.fft.rfft(x, n=13, norm=norm),
    "irfft": lambda x, norm: torch.fft.irfft(x, norm=norm),
    "irfft_n": lambda x, norm: torch.fft.irfft(x, n=7, norm=norm),
    "hfft": lambda x, norm: torch.fft.hfft(x, norm=norm),
    "ihfft": lambda x, norm: torch.fft.ihfft(x, norm=norm),
    "fft2": lambda x, norm: torch.fft.fft2(x, norm=norm),
    "ifftn_trimmed": lambda x, norm: torch.fft.ifftn(x, s=(3, 6), norm=norm),
    "rfftn": lambda x, norm: torch.fft.rfftn(x, s=(3, 12), norm=norm),
    "irfft2": lambda x, norm: torch.fft.irfft2(x, norm=norm),
    "hfftn": lambda x, norm: torch.fft.hfftn(x, norm=norm),
    "ihfft2": lambda x, norm: torch.fft.ihfft2(x, norm=norm),
    "spectrum_math": lambda x, norm: torch.fft.irfft(torch.fft.rfft(x, norm=norm), n=x.shape[-1],
                                                     norm=norm) * 2,
}


def check(fn, *args, fallbacks=False):
    torch._dynamo.reset()
    before = braze.counters()["fallback_ops"]
    got = torch.compile(fn, backend="braze", dynamic=False)(*args)
    want = fn(*args)
    moved = braze.counters()["fallback_ops"] - before
    assert (moved > 0) if fallbacks else (moved == 0)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
@pytest.mark.parametrize("norm", NORMS)
def test_transform(name, norm):
    check(lambda x: TRANSFORMS[name](x, norm), torch.randn(4, 10))


@pytest.mark.parametrize("dtype", (torch.float64, torch.int64, torch.uint8, torch.bool))
def test_input_dtypes(dtype):
    x = torch.randint(0, 5, (3, 8)).to(dtype)
    check(lambda x: torch.fft.fft(x), x)
    check(lambda x: torch.fft.rfft2(x), x)


def test_complex_boundary():
    """Complex graph inputs and outputs cross as views; conjugate views are resolved."""
    z = torch.randn(5, 6, dtype=torch.complex64)
    check(lambda z: torch.fft.fft(z), z)
    check(lambda z: torch.fft.ifft2(z.conj()), z)
    check(lambda x: x.cfloat(), torch.randn(3, 4))
    check(lambda x: x.cdouble(), torch.randint(-5, 5, (3, 4)))


def test_complex_arithmetic_falls_back():
    """Only the pair-aware rules take complex operands; the rest stays in eager PyTorch."""
    z = torch.randn(5, 6, dtype=torch.complex64)
    check(lambda z: torch.fft.fft(z) * z, z, fallbacks=True)


def test_long_transform_falls_back():
    check(lambda x: torch.fft.rfft(x), torch.randn(5000), fallbacks=True)


def test_pair_views_and_construction():
    check(lambda x: torch.view_as_complex(x * 2), torch.randn(3, 2))
    check(lambda x: torch.view_as_real(torch.fft.fft(x)) + 1, torch.randn(3, 4))
    check(lambda a, b: torch.complex(a, b), torch.randn(3, 4), torch.randn(4))
