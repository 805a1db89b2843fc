"""Random numbers from braze's in-kernel Philox generator: right distribution (checked
statistically), reproducible for a torch seed, fresh on every call, independent streams."""
import math

import torch
import torch.nn.functional as F

import braze

N = 1 << 20


def compiled(fn):
    return torch.compile(fn, backend="braze", dynamic=False)


def no_fallback(fn, *args):
    before = braze.counters()["fallback_ops"]
    out = fn(*args)
    assert braze.counters()["fallback_ops"] == before
    return out


def test_uniform_moments_and_range():
    u = no_fallback(compiled(lambda x: torch.rand_like(x)), torch.empty(N))
    assert u.min() >= 0 and u.max() < 1
    # mean 1/2 and variance 1/12, within 6 standard errors
    assert abs(u.mean().item() - 0.5) < 6 * math.sqrt(1 / 12 / N)
    assert abs(u.var().item() - 1 / 12) < 6 * math.sqrt(1 / 180 / N)
    # equal-width histogram: every bin within 6 sigma of N / 16
    counts = torch.histc(u, bins=16, min=0, max=1)
    expected = N / 16
    assert (counts - expected).abs().max() < 6 * math.sqrt(expected)


def test_normal_moments():
    z = no_fallback(compiled(lambda x: torch.randn_like(x, dtype=torch.float64)), torch.empty(N))
    assert z.dtype == torch.float64
    assert abs(z.mean().item()) < 6 / math.sqrt(N)
    assert abs(z.var().item() - 1) < 6 * math.sqrt(2 / N)
    # tails: P(|z| > 2) = 0.0455
    assert abs((z.abs() > 2).double().mean().item() - 0.0455) < 0.003


def test_reproducible_for_a_seed_and_fresh_per_call():
    fn = compiled(lambda x: torch.rand_like(x) + x)
    x = torch.zeros(1000)
    torch.manual_seed(123)
    a = fn(x)
    torch.manual_seed(123)
    b = fn(x)
    c = fn(x)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_two_random_ops_are_independent():
    u, v = no_fallback(compiled(lambda x: (torch.rand_like(x), torch.rand_like(x))), torch.empty(N))
    assert not torch.equal(u, v)
    corr = torch.corrcoef(torch.stack([u, v]))[0, 1].item()
    assert abs(corr) < 6 / math.sqrt(N)


def test_dropout_keeps_the_expected_fraction_and_scales():
    x = torch.ones(N)
    y = no_fallback(compiled(lambda t: F.dropout(t, 0.3, True)), x)
    kept = (y != 0).double().mean().item()
    assert abs(kept - 0.7) < 6 * math.sqrt(0.21 / N)
    torch.testing.assert_close(y[y != 0], torch.full_like(y[y != 0], 1 / 0.7))
