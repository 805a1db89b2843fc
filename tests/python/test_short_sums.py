"""unroll-short-sums (passes/UnrollShortSums.cpp): a sum over a few elements that lie apart in
memory (a mixture of experts' combine of each token's top-k expert outputs) is computed as adds
of its slices, from a zero accumulator in the reduction's order, and gives what eager's sum
gives: within f32's and f64's default tolerances (the CPU compiler may fuse a product into the
add that follows it, as it may in the reduction's loop), and within a rounding of the dtype for
half precision (one rounding at the end, as a half sum does)."""
import pytest
import torch

import braze

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _compiled(fn, *args):
    before = braze.counters()["fallback_ops"]
    torch._dynamo.reset()
    out = torch.compile(fn, backend="braze", dynamic=False)(*args)
    assert braze.counters()["fallback_ops"] == before
    return out


def _close(got, want, dtype):
    tol = {torch.float16: 1e-3, torch.bfloat16: 8e-3}.get(dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", (2, 4, 8))
def test_a_top_k_combine_adds_each_tokens_expert_rows(dtype, k):
    # out[t] = sum over j of y[order[t, j]] * w[t, j]: rows gathered by a permutation, weighted,
    # summed over the k slots (the reduced dim lies between the tokens and the hidden dim).
    g = torch.Generator(torch.get_default_device()).manual_seed(k)
    tokens, hidden = 96, 160
    y = torch.randn(tokens * k, hidden, generator=g).to(dtype)
    order = torch.randperm(tokens * k, generator=g)
    w = torch.rand(tokens, k, generator=g).to(dtype)

    def combine(y, order, w):
        rows = y[order].view(tokens, k, hidden)
        return (rows * w.unsqueeze(-1)).sum(1)
    _close(_compiled(combine, y, order, w), combine(y, order, w), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_short_sums_keep_dims_and_sum_several_dims(dtype):
    g = torch.Generator(torch.get_default_device()).manual_seed(3)
    x = torch.randn(3, 2, 2, 48, generator=g).to(dtype)

    def sums(x):
        return x.sum(1, keepdim=True), x.sum((0, 1)), (x * 2).sum(-3)
    for got, want in zip(_compiled(sums, x), sums(x)):
        _close(got, want, dtype)


def test_short_integer_and_bool_sums_are_exact():
    g = torch.Generator(torch.get_default_device()).manual_seed(5)
    i = torch.randint(-1000, 1000, (5, 3, 40), generator=g, dtype=torch.int32)
    b = torch.rand(5, 3, 40, generator=g) > 0.5

    def sums(i, b):
        return i.sum(1), b.sum(1), i.sum(1, dtype=torch.int64)
    for got, want in zip(_compiled(sums, i, b), sums(i, b)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_signed_zeros_and_nans_sum_as_a_reduction_does():
    # From a zero accumulator: two negative zeros sum to +0, as the reduction's loop gives; a NaN
    # or an infinity among the terms carries through.
    x = torch.zeros(4, 2, 64)
    x[0] = -0.0
    x[1, 0, :3] = float("nan")
    x[2, 1, :3] = float("inf")
    x[3, 0, :3], x[3, 1, :3] = float("inf"), float("-inf")
    got = _compiled(lambda x: x.sum(1), x)
    want = x.sum(1)
    torch.testing.assert_close(got, want, atol=0, rtol=0, equal_nan=True)
    assert torch.equal(torch.signbit(got), torch.signbit(want))


def test_a_sum_over_an_empty_dim_is_zeros():
    x = torch.randn(8, 0, 64)
    got = _compiled(lambda x: x.sum(1) + 1, x)
    torch.testing.assert_close(got, x.sum(1) + 1, atol=0, rtol=0)


def _decomposed(fn, x, capfd, **options):
    torch._dynamo.reset()
    capfd.readouterr()
    out = torch.compile(fn, backend="braze", dynamic=False,
                        options={"log": "decomposed", **options})(x)
    return out, capfd.readouterr().err


def test_a_disabled_pass_leaves_the_sum_a_reduction(capfd):
    # Options(disabled_passes=...) skips the pass: the sum stays a reduction, the result is the
    # same, and the two compiles do not share a cache entry (the other one's code is not reused).
    x = torch.randn(64, 4, 48, generator=torch.Generator().manual_seed(9)).to(
        torch.get_default_device())

    def fn(x):
        return x.sum(1) * 3
    on, said_on = _decomposed(fn, x, capfd)
    off, said_off = _decomposed(fn, x, capfd, disabled_passes=("unroll-short-sums",))
    torch.testing.assert_close(on, fn(x))
    torch.testing.assert_close(off, fn(x))
    assert "sum(" not in said_on and "sum(" in said_off, (said_on, said_off)


def test_disabled_passes_name_what_is_wrong(monkeypatch):
    fn = torch.compile(lambda x: x + 1, backend="braze", options={"strict": True,
                                                                  "disabled_passes": ("realize",)})
    torch._dynamo.reset()
    with pytest.raises(Exception,
                       match="names 'realize', which is not a graph pass.*unroll-short-sums"):
        fn(torch.ones(3))
    with pytest.raises(ValueError, match="disabled_passes"):
        braze.Options(disabled_passes="cse")  # a string, not a tuple of names
    monkeypatch.setenv("BRAZE_DISABLE_PASSES", "cse,no-such-pass")
    torch._dynamo.reset()
    with pytest.raises(Exception, match="BRAZE_DISABLE_PASSES: names 'no-such-pass'"):
        torch.compile(lambda x: x * 2, backend="braze", options={"strict": True})(torch.ones(3))
