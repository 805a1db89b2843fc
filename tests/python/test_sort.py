"""sort, argsort, msort, median, nanmedian and mode compile as rank-counting reductions and give
exactly eager's values and indices, ties and NaNs included; the cases whose tie order braze does
not reproduce fall back. Where PyTorch guarantees no order among ties (topk; sort and argsort of
long dims without stable=True), the values are eager's and the indices pick them."""
import pytest
import torch

import braze
from _device import eager_cpu

FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
INTS = (torch.int64, torch.int32, torch.int8, torch.uint8)
SOME = (torch.float32, torch.bfloat16, torch.int64, torch.uint8)
SHAPES = (((7,), 0), ((3, 9), 1), ((4, 6, 3), 0))


def sample(dtype, shape, nan=True):
    """Few distinct values (many ties), NaNs in float inputs."""
    g = torch.Generator(torch.get_default_device()).manual_seed(hash((str(dtype), shape)) % 2**31)
    x = torch.randint(-3, 4, shape, generator=g)
    if dtype == torch.bool:
        return x > 0
    if dtype == torch.uint8:
        x = x + 3
    x = x.to(dtype)
    if nan and dtype.is_floating_point and x.numel():
        x.view(-1)[::4] = float("nan")
    return x


def check(fn, x, fallbacks=False):
    before = braze.counters()["fallback_ops"]
    torch._dynamo.reset()
    got = torch.compile(fn, backend="braze", dynamic=False)(x)
    # An op left to eager runs eager's kernel of the device, whose order among ties is its own.
    want = fn(x) if fallbacks else eager_cpu(fn, x)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, atol=0, rtol=0, equal_nan=True)
    moved = braze.counters()["fallback_ops"] - before
    assert (moved > 0) if fallbacks else (moved == 0)


@pytest.mark.parametrize("dtype", FLOATS + INTS + (torch.bool,))
@pytest.mark.parametrize("shape,dim", SHAPES[1:])
@pytest.mark.parametrize("descending", (False, True))
def test_sort(dtype, shape, dim, descending):
    x = sample(dtype, shape)
    check(lambda x: torch.sort(x, dim=dim, descending=descending), x)
    check(lambda x: torch.sort(x, dim=dim, descending=descending, stable=True), x)


def test_sort_long_dims():
    x = sample(torch.float32, (3, 300))
    check(lambda x: torch.sort(x, dim=1, stable=True, descending=True), x)
    check(lambda x: torch.argsort(x, dim=1, stable=True), x)
    check(lambda x: torch.msort(x.t()), x)  # values only: the tie order does not show
    # PyTorch sorts a dim this long unstably and guarantees no order among ties: braze's stable
    # order is one it allows. The values are eager's; the indices pick them, lowest first.
    cases = ((lambda x: torch.sort(x, dim=1, descending=True), True),
             (lambda x: torch.sort(x, dim=1), False),
             (lambda x: (torch.argsort(x, dim=1),), False))
    for fn, descending in cases:
        before = braze.counters()["fallback_ops"]
        torch._dynamo.reset()
        indices = torch.compile(fn, backend="braze", dynamic=False)(x)[-1]
        assert braze.counters()["fallback_ops"] == before, braze.fallback_ops_by_op()
        want = torch.sort(x, dim=1, stable=True, descending=descending)
        torch.testing.assert_close(x.gather(1, indices), want.values, atol=0, rtol=0,
                                   equal_nan=True)
        torch.testing.assert_close(x.gather(1, fn(x)[-1]), want.values, atol=0, rtol=0,
                                   equal_nan=True)  # eager's own indices pick the same values
        assert torch.equal(indices, want.indices)


@pytest.mark.parametrize("dtype", (torch.int64, torch.float32, torch.bfloat16))
@pytest.mark.parametrize("shape,dim", (((4096,), 0), ((2, 700), 1), ((600, 3), 0)))
def test_long_sorts_place_each_index_at_its_rank(dtype, shape, dim):
    # Past 2^20 element pairs, the indices are scattered to their ranks' positions (each
    # reached once) instead of found by a second quadratic reduction; along dim 0 of a 2-d
    # input, the position moves by the dim's stride. A router sorts 4,096 expert ids.
    x = sample(dtype, shape)
    check(lambda x: torch.sort(x, dim=dim, stable=True), x)
    check(lambda x: torch.argsort(x, dim=dim, stable=True, descending=True), x)


def test_sort_edge_shapes():
    check(lambda x: torch.sort(x), torch.tensor(2.5))
    check(lambda x: torch.sort(x, dim=0), torch.zeros(0, 3))
    check(lambda x: torch.sort(x + 1, dim=-1)[0] * 2, torch.randn(4, 5))


@pytest.mark.parametrize("dtype", SOME)
@pytest.mark.parametrize("shape,dim", SHAPES)
def test_median(dtype, shape, dim):
    x = sample(dtype, shape)
    check(lambda x: torch.median(x, dim=dim), x)
    check(lambda x: torch.median(x, dim=dim, keepdim=True), x)
    check(lambda x: torch.median(x), x)
    check(lambda x: torch.nanmedian(x), x)
    if not dtype.is_floating_point:
        check(lambda x: torch.nanmedian(x, dim=dim), x)


def test_nanmedian_float_indices_fall_back():
    # The index of a row of NaNs depends on PyTorch's selection algorithm.
    x = torch.full((2, 6), float("nan"))
    check(lambda x: torch.nanmedian(x, dim=1), x, fallbacks=True)


@pytest.mark.parametrize("dtype", (torch.int64, torch.uint8, torch.bool))
@pytest.mark.parametrize("shape,dim", SHAPES[1:])
def test_mode(dtype, shape, dim):
    check(lambda x: torch.mode(x, dim), sample(dtype, shape))


def test_mode_falls_back_where_unreproducible():
    check(lambda x: torch.mode(x, 0), torch.randn(5), fallbacks=True)
    check(lambda x: torch.mode(x, 0), torch.randint(0, 3, (40,)), fallbacks=True)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16, torch.int64))
@pytest.mark.parametrize("shape,dim", SHAPES)
@pytest.mark.parametrize("largest", (True, False))
def test_topk_values_are_eager_and_indices_point_at_them(dtype, shape, dim, largest):
    """topk among many ties and NaNs: PyTorch documents the indices of tied elements as not
    guaranteed, so the values must be eager's and each index must pick its value from the
    input; braze returns the lowest indices first among equals, for k of 1 and 3, sorted or
    not."""
    x = sample(dtype, shape)
    for k, is_sorted in ((1, True), (3, True), (3, False)):
        fn = lambda x: torch.topk(x, k, dim=dim, largest=largest, sorted=is_sorted)
        before = braze.counters()["fallback_ops"]
        torch._dynamo.reset()
        values, indices = torch.compile(fn, backend="braze", dynamic=False)(x)
        want = eager_cpu(fn, x)[0].to(values.device)
        assert braze.counters()["fallback_ops"] == before, braze.fallback_ops_by_op()
        if not is_sorted:  # eager's order is unspecified: compare both sorted
            values, order = values.sort(dim=dim, descending=largest, stable=True)
            indices = indices.gather(dim, order)
            want = want.sort(dim=dim, descending=largest, stable=True)[0]
        torch.testing.assert_close(values, want, atol=0, rtol=0, equal_nan=True)
        torch.testing.assert_close(x.gather(dim, indices), values, atol=0, rtol=0,
                                   equal_nan=True)
        if is_sorted and k > 1:  # among equal values, the lowest index first (braze's rule)
            same = values.narrow(dim, 1, k - 1) == values.narrow(dim, 0, k - 1)
            rising = indices.narrow(dim, 1, k - 1) > indices.narrow(dim, 0, k - 1)
            assert bool((rising | ~same).all())


def test_a_router_gate_compiles_with_its_top_k():
    """A mixture-of-experts router: softmax over 8 experts, the top 2 and their renormalized
    weights, with no op left to eager. The top 2 are two argmax passes over each row, in the
    softmax's kernel; the values' gather and the renormalization are a second kernel (a full
    sort took four)."""
    torch.manual_seed(3)
    logits = torch.randn(64, 8)

    def route(logits):
        probs = logits.softmax(-1)
        w, e = probs.topk(2, dim=-1)
        return w / w.sum(-1, keepdim=True), e

    before = braze.counters()["fallback_ops"]
    kernels = braze.counters()["kernels_generated"]
    torch._dynamo.reset()
    w, e = torch.compile(route, backend="braze")(logits)
    assert braze.counters()["kernels_generated"] - kernels == 2
    we, ee = route(logits)
    torch.testing.assert_close(w, we)
    assert torch.equal(e, ee)  # random logits: no ties
    assert braze.counters()["fallback_ops"] == before, braze.fallback_ops_by_op()
