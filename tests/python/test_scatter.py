"""Advanced indexing (several index tensors) and scatter-like ops compile without fallback and
match eager over dtypes and shapes; bad indices raise at run time."""
import pytest
import torch

import braze
from _device import eager_cpu

DTYPES = [torch.float64, torch.float16, torch.int8, torch.uint8, torch.bool]


def _make(shape, dtype, g):
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    lo = 0 if dtype == torch.uint8 else -9
    return torch.randint(lo, 10, shape, generator=g).to(dtype)


def _compiled_matches(fn, *args):
    """fn compiled by braze with no fallback gives eager's result."""
    torch._dynamo.reset()
    before = braze.counters()
    out = torch.compile(fn, backend="braze", dynamic=False)(*args)
    after = braze.counters()
    expected = eager_cpu(fn, *args)
    # Eager rounds every step of a half-precision reduction; braze rounds once (as the
    # conformance sweep allows).
    dtype = (expected[0] if isinstance(expected, tuple) else expected).dtype
    tol = {"atol": 1e-2, "rtol": 1e-2} if dtype in (torch.float16, torch.bfloat16) else {}
    torch.testing.assert_close(out, expected, equal_nan=True, **tol)
    assert after["fallback_ops"] == before["fallback_ops"], "an op fell back to eager"
    assert after["fallback_graphs"] == before["fallback_graphs"]
    assert after["graphs_compiled"] > before["graphs_compiled"]


def _index_several(x, i, j):
    return (x[i, j], x[:, i, j], x[i, :, j], x[i, j, j], x[i[:, None, None], j])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool])
def test_index_several_tensors(dtype):
    """Adjacent index dims stay in place, separated ones go first; indices broadcast."""
    g = torch.Generator(torch.get_default_device()).manual_seed(0)
    x = _make((4, 5, 6), dtype, g)
    i = torch.tensor([[0, 3], [-1, 2]])
    j = torch.tensor([1, -2])
    _compiled_matches(_index_several, x, i, j)


def test_index_non_contiguous_and_int32():
    x = torch.randn(6, 5).t()
    i = torch.tensor([4, 0, -3], dtype=torch.int32)
    j = torch.tensor([1, 5, 2], dtype=torch.int32)
    _compiled_matches(lambda x, i, j: x[i, j] * 2, x, i, j)


def test_index_each_component_is_checked():
    """[0, 4] in a [3, 4] tensor is flat position 4, which exists; it must still raise."""
    fn = torch.compile(lambda x, i, j: x[i, j], backend="braze", dynamic=False)
    x = torch.randn(3, 4)
    fn(x, torch.tensor([0]), torch.tensor([3]))
    with pytest.raises(Exception, match="out of bounds"):
        fn(x, torch.tensor([0]), torch.tensor([4]))
    with pytest.raises(Exception, match="out of bounds"):
        fn(x, torch.tensor([-4]), torch.tensor([0]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_and_scatter_add(dtype):
    g = torch.Generator(torch.get_default_device()).manual_seed(1)
    x = _make((3, 5), dtype, g)
    src = _make((2, 6), dtype, g)
    index = torch.tensor([[0, 1, 2, 0], [1, 2, 0, 0]])
    _compiled_matches(lambda x, i, s: (x.scatter(0, i, s), x.scatter(1, i, s), x.scatter(1, i, 3),
                                       x.scatter_add(0, i, s)), x, index, src)


def test_scatter_duplicates_last_write_wins():
    x = torch.zeros(5)
    index = torch.tensor([1, 3, 1, 1, 3])
    src = torch.arange(1.0, 6.0)
    _compiled_matches(lambda x, i, s: x.scatter(0, i, s), x, index, src)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_scatter_of_one_index_per_line_is_one_pass(dtype):
    """A scatter with one index per line along its dim (a loss's one-hot gradient over a
    vocabulary) compiles whatever its size, as a comparison with each line's target: 64 lines
    of 50257 would be far past the quadratic cap. A value or a tensor, along either dim."""
    g = torch.Generator(torch.get_default_device()).manual_seed(3)
    x = _make((64, 50257), dtype, g)
    rows = torch.randint(0, 50257, (64, 1), generator=g)
    cols = torch.randint(0, 64, (1, 300), generator=g)
    src = _make((64, 300), dtype, g)
    _compiled_matches(lambda x, i, j, s: (torch.zeros_like(x).scatter(1, i, -1),
                                          x.scatter(1, i, 5), x[:, :300].scatter(0, j, s[:1])),
                      x, rows, cols, src)


def test_scatter_of_one_index_per_line_rejects_an_index_out_of_range():
    x = torch.zeros(8, 1000)
    i = torch.randint(0, 1000, (8, 1))
    i[5] = 1000
    torch._dynamo.reset()
    with pytest.raises(Exception, match="out of bounds"):
        torch.compile(lambda x, i: x.scatter(1, i, 1.0), backend="braze")(x, i)


def _one_hot_sums(i, v, w):
    hot = torch.zeros(i.shape[0], 300, dtype=v.dtype, device=v.device).scatter(1, i, v)
    scaled = hot * w
    return scaled.sum(1, keepdim=True), hot.sum(1), scaled


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sums_of_one_hot_rows_match_eager(dtype):
    """A one-hot row's sum (fold-one-hot-sums) is its value times the row's factor, with eager's
    NaN where the factor is infinite or NaN (0 * inf in the other terms)."""
    g = torch.Generator(torch.get_default_device()).manual_seed(4)
    i = torch.randint(0, 300, (16, 1), generator=g)
    v = _make((16, 1), dtype, g)
    w = _make((16, 1), dtype, g)
    w[3], w[7], w[9] = float("inf"), float("-inf"), float("nan")
    _compiled_matches(_one_hot_sums, i, v, w)


def test_one_hot_sums_keep_their_index_check():
    i = torch.randint(0, 300, (8, 1))
    i[2] = 300
    torch._dynamo.reset()
    with pytest.raises(Exception, match="out of bounds"):
        torch.compile(_one_hot_sums, backend="braze")(i, torch.randn(8, 1), torch.randn(8, 1))


def _expert_counts(i, w):
    # a router's tokens per expert, as Mixtral's expert mask: one-hot rows of 8 experts
    return (torch.nn.functional.one_hot(i, num_classes=8) * w).sum(0)


def test_one_hot_range_checks_compile_and_still_raise(device):
    """F.one_hot asserts (aten._assert_async) that its classes are in [0, num_classes). On the
    CPU the assertions compile: each condition is an extra output of the graph, checked on the
    host after the call, so nothing falls back and an out-of-range class raises a RuntimeError
    with the traced assertion's message (eager's, prefixed with the op's name). On CUDA the
    check would wait for the device at every call, so an assertion runs in eager there
    (counted); PyTorch 2.11 traces none for CUDA tensors (its CUDA kernel checks on the
    device)."""
    g = torch.Generator(torch.get_default_device()).manual_seed(6)
    i = torch.randint(0, 8, (64, 2), generator=g)
    w = torch.randn(64, 2, 1, generator=g)
    torch._dynamo.reset()
    before = braze.fallback_ops_by_op()
    compiled = torch.compile(_expert_counts, backend="braze", dynamic=False)
    torch.testing.assert_close(compiled(i, w), _expert_counts(i, w))
    after = braze.fallback_ops_by_op()
    fell = {op for op in after if after[op] != before.get(op, 0)}
    assert fell <= ({"aten._assert_async.msg"} if device == "cuda" else set()), fell
    if device == "cuda":
        return
    for bad in (8, -1):
        j = i.clone()
        j[5, 1] = bad
        with pytest.raises(RuntimeError) as want:
            _expert_counts(j, w)
        with pytest.raises(RuntimeError) as got:
            compiled(j, w)
        # the traced assertion's message names the op ("one_hot: Class values must ...")
        assert str(want.value) in str(got.value)


def test_cross_entropy_gradient_matches_eager():
    """The loss backward whose log-softmax gradient sums one-hot rows, with ignored targets."""
    g = torch.Generator(torch.get_default_device()).manual_seed(5)
    logits = torch.randn(64, 1000, generator=g, requires_grad=True)
    target = torch.randint(0, 1000, (64,), generator=g)
    target[::7] = -100

    def loss(x, t):
        return torch.nn.functional.cross_entropy(x, t)
    torch._dynamo.reset()
    got = torch.compile(loss, backend="braze")(logits, target)
    (got_grad,) = torch.autograd.grad(got, logits)
    want = loss(logits, target)
    (want_grad,) = torch.autograd.grad(want, logits)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.bool])
def test_scatter_reduce(reduce, dtype):
    if dtype == torch.bool and reduce == "mean":
        pytest.skip("eager has no mean of bools")
    g = torch.Generator(torch.get_default_device()).manual_seed(2)
    x = _make((4, 3), dtype, g)
    src = _make((4, 3), dtype, g)
    index = torch.tensor([[0, 1, 0], [2, 1, 0], [0, 0, 0], [2, 2, 1]])
    _compiled_matches(lambda x, i, s: (x.scatter_reduce(0, i, s, reduce),
                                       x.scatter_reduce(0, i, s, reduce, include_self=False)),
                      x, index, src)


def test_scatter_reduce_nan_propagates():
    x = torch.tensor([1.0, 2.0, float("nan")])
    src = torch.tensor([float("nan"), 5.0, 0.0])
    index = torch.tensor([0, 1, 2])
    _compiled_matches(lambda x, i, s: (x.scatter_reduce(0, i, s, "amax"),
                                       x.scatter_reduce(0, i, s, "amin")), x, index, src)


def test_scatter_legacy_reduce_and_scalar_self():
    x = torch.randn(3, 4)
    index = torch.tensor([[0, 2], [1, 0]])
    src = torch.randn(2, 2)
    _compiled_matches(lambda x, i, s: (x.scatter(0, i, s, reduce="add"),
                                       x.scatter(0, i, s, reduce="multiply")), x, index, src)
    _compiled_matches(lambda x, i, s: x.scatter(0, i, s), torch.tensor(1.5), torch.tensor(0),
                      torch.tensor(2.5))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.int16, torch.bool])
def test_index_put(dtype):
    g = torch.Generator(torch.get_default_device()).manual_seed(3)
    x = _make((3, 5, 2), dtype, g)
    i = torch.tensor([0, 2, -1])
    j = torch.tensor([4, 0, 1])
    v = _make((3, 2), dtype, g)
    index_put = torch.ops.aten.index_put
    dup = torch.tensor([0, 0, 2])
    _compiled_matches(lambda x, i, j, v: (
        x.index_put((i, j), v), index_put(x, [None, j], v[:1, :1]),
        index_put(x, [i, None, torch.tensor([1])], v[:, :1]),
        x.index_put((dup, j), v, accumulate=True)), x, i, j, v)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int32, torch.bool])
def test_index_put_overwrite_compares_rows_not_elements(dtype):
    """index_put without accumulate into consecutive dims compares each position of those dims
    with each index entry, not each element of self with each value: a KV cache's rows written
    at sizes far past the scatter's pair cap (2^26) compile, with negative, broadcast and
    repeated indices (the last write wins, as on eager's CPU kernel), in leading, middle and
    trailing dims, and a row past the end raises."""
    g = torch.Generator().manual_seed(11)
    with torch.device("cpu"):
        cache = _make((2, 8, 1024, 64), dtype, g)      # 2^20 elements
        rows = torch.randint(-1024, 1024, (96,), generator=g)
        new = _make((2, 8, 96, 64), dtype, g)           # 2^20 x 98304 pairs as a scatter
        x = _make((4, 6, 5, 3), dtype, g)
        i = torch.tensor([[0], [3], [-1]])              # broadcast with j: [3, 2] entries
        j = torch.tensor([4, 1])
        v = _make((3, 2, 3), dtype, g)
        dup = torch.tensor([2, 0, 2, 3])
        w = _make((4, 6, 4, 3), dtype, g)
    device = torch.get_default_device()
    cache, rows, new, x, i, j, v, dup, w = (t.to(device) for t in (cache, rows, new, x, i, j,
                                                                    v, dup, w))
    if device.type == "cuda":  # which repeated write wins is unspecified on CUDA
        dup = torch.tensor([2, 0, 1, 3], device=device)
    _compiled_matches(lambda c, r, n: torch.ops.aten.index_put(c, [None, None, r], n), cache,
                      rows, new)
    _compiled_matches(lambda c, r, n: c.index_copy(2, r.remainder(1024), n), cache, rows, new)
    _compiled_matches(lambda x, i, j, v, d, w: (
        torch.ops.aten.index_put(x, [None, i, j], v), x.index_put((i, j), v[:, :, None]),
        torch.ops.aten.index_put(x, [None, None, d], w), x.index_put((d,), w[0, 0, 0])),
        x, i, j, v, dup, w)
    put = torch.compile(lambda c, r, n: torch.ops.aten.index_put(c, [None, None, r], n),
                        backend="braze",
                        dynamic=False)
    for bad in (1024, -1025):
        r = rows.clone()
        r[7] = bad
        with pytest.raises(Exception, match="out of bounds|index"):
            put(cache, r, new)
            if cache.is_cuda:
                torch.cuda.synchronize()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
def test_index_add_copy_fill(dtype):
    g = torch.Generator(torch.get_default_device()).manual_seed(4)
    x = _make((4, 6), dtype, g)
    src = _make((4, 3), dtype, g)
    index = torch.tensor([5, 0, 2])
    _compiled_matches(lambda x, i, s: (x.index_add(1, i, s, alpha=2), x.index_copy(1, i, s),
                                       x.index_fill(1, i, 7)), x, index, src)


@pytest.mark.cpu_only("eager's CPU kernel rounds once; its CUDA one adds halves atomically")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_index_add_of_halves_sums_wide_as_eager(dtype):
    """Eager's index_add rounds a half-precision sum once (with alpha 1; with another alpha it
    rounds every add, as braze does then): 4096 ones into one element give 4096, where a sum
    rounded after every add stops at 2048 (f16) or 256 (bf16)."""
    ones = torch.ones(4096, 3, dtype=dtype)
    into = torch.zeros(2, 3, dtype=dtype)
    index = torch.zeros(4096, dtype=torch.int64)
    torch._dynamo.reset()
    got = torch.compile(lambda x, i, s: x.index_add(0, i, s), backend="braze")(into, index, ones)
    assert got[0].tolist() == [4096.0] * 3 and got[1].tolist() == [0.0] * 3
    g = torch.Generator(torch.get_default_device()).manual_seed(9)
    x = _make((50, 4, 6), dtype, g)
    src = _make((50, 4, 300), dtype, g)
    index = torch.randint(0, 6, (300,), generator=g)
    _compiled_matches(lambda x, i, s: (x.index_add(-1, i, s), x.index_add(2, i, s, alpha=0.5)),
                      x, index, src)


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int32])
def test_index_reduce(reduce, dtype):
    g = torch.Generator(torch.get_default_device()).manual_seed(5)
    x = _make((3, 4), dtype, g)
    src = _make((4, 4), dtype, g)
    index = torch.tensor([0, 2, 0, 2])
    _compiled_matches(lambda x, i, s: (x.index_reduce(0, i, s, reduce),
                                       x.index_reduce(0, i, s, reduce, include_self=False)),
                      x, index, src)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.bool])
def test_put(dtype):
    g = torch.Generator(torch.get_default_device()).manual_seed(6)
    x = _make((3, 4), dtype, g)
    src = _make((2, 2), dtype, g)
    index = torch.tensor([[0, -1], [11, 5]])
    _compiled_matches(lambda x, i, s: (x.put(i, s), x.put(i % 3, s, accumulate=True)),
                      x, index, src)


def test_scatter_errors_name_the_problem():
    fn = torch.compile(lambda x, i, s: x.scatter_add(0, i, s), backend="braze", dynamic=False)
    x, s = torch.zeros(4), torch.ones(2)
    fn(x, torch.tensor([0, 3]), s)
    with pytest.raises(Exception, match="out of bounds"):
        fn(x, torch.tensor([0, 4]), s)
    with pytest.raises(Exception, match="out of bounds"):
        fn(x, torch.tensor([-1, 0]), s)  # scatter rejects negative indices, as eager does
    put = torch.compile(lambda x, i, v: x.index_put((i,), v), backend="braze", dynamic=False)
    with pytest.raises(Exception, match="out of bounds"):
        put(x, torch.tensor([4]), torch.ones(1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8, torch.bool])
def test_masked_diagonal_as_strided_scatter(dtype):
    g = torch.Generator(torch.get_default_device()).manual_seed(7)
    x = _make((3, 4), dtype, g)
    mask = torch.rand(3, 4, generator=g) > 0.5
    src = _make((3, 4), dtype, g)
    _compiled_matches(lambda x, m, s: (
        x.masked_scatter(m, s), x.masked_scatter(m[1], s),
        torch.diagonal_scatter(x, s[0, :3], 1), torch.diagonal_scatter(x, s[0, :3], -1, 1, 0),
        torch.as_strided_scatter(x, s[:2, :2], (2, 2), (1, 4), 1)), x, mask, src)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_as_strided_scatter_into_a_permuted_layout(dtype):
    """as_strided_scatter's positions are positions in the input's memory: a channels-last
    input (a CNN's pooled features, in the backward of its flatten) and a transposed one are
    scattered into in their storage order, as eager does."""
    g = torch.Generator(torch.get_default_device()).manual_seed(8)
    x = _make((2, 3, 4, 5), dtype, g).contiguous(memory_format=torch.channels_last)
    pooled = _make((4, 6, 1, 1), dtype, g).contiguous(memory_format=torch.channels_last)
    t = _make((5, 6), dtype, g).t()
    src = _make((4, 6), dtype, g)
    _compiled_matches(lambda x, p, t, s: (
        torch.as_strided_scatter(x, s[:2, :3], (2, 3), (7, 2), 3),
        torch.as_strided_scatter(p, s, (4, 6), (6, 1), 0),
        torch.as_strided_scatter(t, s[:3, :2], (3, 2), (1, 5), 4)), x, pooled, t, src)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_dense_as_strided_scatter(dtype):
    """A dense view (one block of the input's flat positions, in some order of its dims) of
    any size is the input's values around the block and src permuted into it: ResNet-50's
    pooled features ([32, 2048, 1, 1] channels-last, in the backward of its flatten), a
    permuted block in the middle of a larger input, and one at its start. Views past braze's
    scatter limit (4096 elements) ran in eager."""
    g = torch.Generator(torch.get_default_device()).manual_seed(9)
    pooled = _make((32, 2048, 1, 1), dtype, g).contiguous(memory_format=torch.channels_last)
    x = _make((16, 32, 32), dtype, g)
    src = _make((32, 2048), dtype, g)
    before = braze.counters()["fallback_ops"]
    _compiled_matches(lambda p, x, s: (
        torch.as_strided_scatter(p, s, (32, 2048), (2048, 1), 0),
        torch.as_strided_scatter(x, s.reshape(16, 64, 64)[:, :, :8], (16, 64, 8), (1, 128, 16),
                                 0),
        torch.as_strided_scatter(x, s.reshape(16, 64, 64)[:, :, :4], (16, 64, 4), (1, 64, 16),
                                 1024)), pooled, x, src)
    assert braze.counters()["fallback_ops"] == before


def test_masked_scatter_too_few_source_elements_raises():
    fn = torch.compile(lambda x, m, s: x.masked_scatter(m, s), backend="braze", dynamic=False)
    x = torch.zeros(4)
    fn(x, torch.tensor([True, False, True, False]), torch.ones(2))
    with pytest.raises(Exception, match="out of bounds"):
        fn(x, torch.tensor([True, True, True, False]), torch.ones(2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_nonzero_static(dtype):
    g = torch.Generator(torch.get_default_device()).manual_seed(8)
    x = _make((3, 5), dtype, g) * (torch.rand(3, 5, generator=g) > 0.4).to(dtype)
    _compiled_matches(lambda x: (torch.nonzero_static(x, size=0), torch.nonzero_static(x, size=2),
                                 torch.nonzero_static(x, size=20),
                                 torch.nonzero_static(x[0], size=4, fill_value=9),
                                 torch.nonzero_static(x[0, 0], size=3)), x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_sums_round_as_eager(dtype):
    """scatter kernels accumulate a half-precision sum or product in f32 and round once (mean
    divides that rounded sum); index_put and index_reduce round after every element in source
    order: braze matches both exactly."""
    g = torch.Generator(torch.get_default_device()).manual_seed(10)
    x = (torch.randn(4, 3, generator=g) * 3).to(dtype)
    src = (torch.randn(10, 3, generator=g) * 7).to(dtype)
    index = torch.randint(0, 4, (10, 3), generator=g)
    rows = torch.arange(12) % 4
    fn = lambda x, i, s, r: (x.scatter_add(0, i, s),
                             x.scatter_reduce(0, i, s, "sum", include_self=False),
                             x.scatter_reduce(0, i, s, "mean"),
                             x.scatter_reduce(0, i, s / 5, "prod", include_self=False),
                             x.index_put((r,), torch.cat([s, s[:2] * 2]), accumulate=True),
                             x.index_reduce(0, r, torch.cat([s, s[:2] * 2]), "mean"))
    torch._dynamo.reset()
    before = braze.counters()["fallback_ops"]
    out = torch.compile(fn, backend="braze", dynamic=False)(x, index, src, rows)
    assert braze.counters()["fallback_ops"] == before
    for a, e in zip(out, fn(x, index, src, rows)):
        if x.is_cuda:
            # Eager's CUDA kernels add half-precision values with atomics, rounding after each
            # add in an order that varies from run to run: no order to match bit for bit.
            torch.testing.assert_close(a, e, atol=2e-2, rtol=2e-2)
        else:
            assert torch.equal(a, e)


@pytest.mark.cpu_only("eager's CUDA atomics round in an order of their own")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_sums_with_many_duplicates_round_as_eager(dtype):
    """Eager rounds a half-precision index_put or put sum after every value, in source order
    on the CPU. Beyond the 16 values per element that the ordered reductions follow, and
    beyond the pair cap, braze adds in place in that order: eager's bits. (Eager's index_add
    rounds per value for some shapes and once for others; braze rounds per value.)"""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 4, generator=g).to(dtype)
    src = torch.randn(40, 4, generator=g).to(dtype)
    index = torch.zeros(40, dtype=torch.int64)
    index[::3] = 1
    big = torch.randn(3000, 64, generator=g).to(dtype)
    ids = torch.randint(0, 3000, (2000,), generator=g)
    ids[:100] = 5
    rows = torch.randn(2000, 64, generator=g).to(dtype)
    cases = [(lambda x, i, s: x.index_put((i,), s, accumulate=True), (x, index, src)),
             (lambda x, i, s: x.put(i, s, accumulate=True), (x, index[:8] * 3, src[:8, 0])),
             (lambda x, i, s: x.index_put((i,), s, accumulate=True), (big, ids, rows))]
    for fn, args in cases:
        torch._dynamo.reset()
        before = braze.counters()
        out = torch.compile(fn, backend="braze", dynamic=False)(*args)
        assert braze.counters()["fallback_ops"] == before["fallback_ops"]
        assert torch.equal(out, fn(*args))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_sums_in_place_on_every_device(dtype):
    """The in-place half-precision adds on every device (atomic on CUDA), with values whose
    partial sums are small integers: exact in any order, so equal to eager."""
    g = torch.Generator().manual_seed(7)
    with torch.device("cpu"):
        x = torch.randint(-3, 4, (3000, 64), generator=g).to(dtype)
        ids = torch.randint(0, 3000, (2000,), generator=g)
        ids[:60] = 11
        rows = torch.randint(-1, 2, (2000, 64), generator=g).to(dtype)
    device = torch.get_default_device()
    x, ids, rows = x.to(device), ids.to(device), rows.to(device)
    _compiled_matches(lambda x, i, r: x.index_put((i,), r, accumulate=True) * 2, x, ids, rows)
    _compiled_matches(lambda x, i, r: x.index_add(0, i, r) - 1, x, ids, rows)


def test_half_precision_products_of_many_values_fall_back():
    """Eager rounds a half-precision index_reduce product after each value; braze follows
    that order for up to 16 values per element (one reduction each) and leaves more to
    eager."""
    x = torch.randn(4, 3).to(torch.bfloat16)
    index = torch.zeros(20, dtype=torch.int64)
    src = (1 + torch.randn(20, 3) / 10).to(torch.bfloat16)
    torch._dynamo.reset()
    before = braze.counters()["fallback_ops"]
    fn = lambda x, i, s: x.index_reduce(0, i, s, "prod")
    out = torch.compile(fn, backend="braze")(x, index, src)
    assert braze.counters()["fallback_ops"] == before + 1
    if x.is_cuda:  # eager's CUDA kernel multiplies the 20 values in whatever order its atomics
        # take, rounding after each: two eager runs differ by a unit in the last place
        torch.testing.assert_close(out, fn(x, index, src), rtol=2e-2, atol=2e-2)
    else:
        torch.testing.assert_close(out, fn(x, index, src))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_overwrites_beyond_the_pair_cap(dtype):
    """Overwriting scatters beyond the pair cap compile: scatter with repeated positions gives
    each the last source in order, as eager's CPU kernel does, on every device (an
    accumulating maximum of source indices); put, index_put over dims that are not adjacent
    and diagonal_scatter write each position once."""
    g = torch.Generator().manual_seed(8)
    with torch.device("cpu"):
        x = _make((3000, 64), dtype, g)
        i = torch.randint(0, 3000, (5000, 64), generator=g)
        s = _make((5000, 64), dtype, g)
        # put and index_put leave the winner among repeated positions unspecified (eager's
        # CPU kernels split them among threads): positions without repeats
        flat = torch.randperm(3000 * 64, generator=g)[:70000]
        vals = _make((70000,), dtype, g)
        cube = _make((300, 40, 50), dtype, g)
        pairs = torch.randperm(300 * 50, generator=g)[:9000]
        ci, cj = pairs // 50, pairs % 50
        cv = _make((9000, 40), dtype, g)
    device = torch.get_default_device()
    x, i, s, flat, vals, cube, ci, cj, cv = (
        t.to(device) for t in (x, i, s, flat, vals, cube, ci, cj, cv))
    _compiled_matches(lambda x, i, s: x.scatter(0, i, s), x, i, s)
    _compiled_matches(lambda x, i, v: x.put(i, v), x, flat, vals)
    _compiled_matches(lambda c, i, j, v: torch.ops.aten.index_put(c, [i, None, j], v),
                      cube, ci, cj, cv)
    with torch.device("cpu"):
        square, diag = _make((2000, 2000), dtype, g), _make((1999,), dtype, g)
    square, diag = square.to(device), diag.to(device)
    _compiled_matches(lambda x, d: torch.diagonal_scatter(x, d, 1), square, diag)


def _reduce_every_way(x, i, s):
    return tuple(x.scatter_reduce(0, i, s, mode, include_self=inc) * 1
                 for mode in ("sum", "prod", "mean", "amax", "amin") for inc in (True, False))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16,
                                   torch.int32, torch.int64])
def test_every_mode_beyond_the_pair_cap_combines_in_place(dtype):
    """scatter_reduce beyond the pair cap (2000x8 into 6000x8 sources: 9.2e9 pairs) in every
    mode, with self and without, compiles and matches eager (bit for bit on the CPU): sums,
    products, means (floor division for integers; half precision divides the rounded sum by the
    rounded count), maxima and minima (a NaN wins), positions no source reaches keep self, half
    precision accumulates in f32 and rounds once; i64 extremes survive a minimum without self."""
    g = torch.Generator().manual_seed(3)
    with torch.device("cpu"):
        i = torch.randint(0, 1500, (6000, 8), generator=g)  # rows 1500.. keep self
        if dtype.is_floating_point:
            x = torch.randn(2000, 8, generator=g).to(dtype)
            s = (1 + 0.01 * torch.randn(6000, 8, generator=g)).to(dtype)
            s[::997, 3] = float("nan")
        else:
            x = torch.randint(-50, 50, (2000, 8), generator=g).to(dtype)
            s = torch.randint(-1, 2, (6000, 8), generator=g).to(dtype)
            if dtype == torch.int64:
                x[:4, 0] = torch.tensor([2**63 - 1, -2**63, 2**63 - 1, -2**63])
                s[:4, 0] = torch.tensor([2**63 - 1, -2**63, 5, 2**63 - 1])
                i[:4, 0] = torch.arange(1600, 1604)  # alone at their rows
    device = torch.get_default_device()
    _compiled_matches(_reduce_every_way, x.to(device), i.to(device), s.to(device))
    if device.type == "cpu":  # each position's values in source order, rounded as eager: its bits
        torch._dynamo.reset()
        got = torch.compile(_reduce_every_way, backend="braze", dynamic=False)(x, i, s)
        for a, e in zip(got, _reduce_every_way(x, i, s)):
            assert torch.equal(a.isnan(), e.isnan()) and torch.equal(a.nan_to_num(), e.nan_to_num())


def test_index_reduce_and_put_beyond_the_pair_cap():
    """index_reduce (a mean without self, a half-precision maximum) and an accumulating put
    beyond the pair cap combine in place."""
    g = torch.Generator().manual_seed(4)
    with torch.device("cpu"):
        x = torch.randn(3000, 64, generator=g)
        ids = torch.randint(0, 2500, (900,), generator=g)
        rows = torch.randn(900, 64, generator=g)
        flat = torch.randint(0, 3000 * 64, (50000,), generator=g)
        vals = torch.randn(50000, generator=g)
    device = torch.get_default_device()
    x, ids, rows, flat, vals = (t.to(device) for t in (x, ids, rows, flat, vals))
    _compiled_matches(lambda x, i, r: x.index_reduce(0, i, r, "mean", include_self=False) + 1,
                      x, ids, rows)
    _compiled_matches(lambda x, i, r: x.index_reduce(0, i, r, "amax") - 1,
                      x.half(), ids, rows.half())
    _compiled_matches(lambda x, i, v: x.put(i, v, accumulate=True) * 2, x, flat, vals)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64])
def test_sums_beyond_the_pair_cap_add_in_place(dtype):
    """An accumulating index_put, put-free scatter_add and index_add beyond the pair cap
    (2^26 pairs) add their values in place, with repeated and negative indices, and match
    eager (atomic adds on CUDA: floats to a tolerance)."""
    g = torch.Generator().manual_seed(5)
    with torch.device("cpu"):  # the generator is a CPU one; the tensors move to the device
        x = _make((3000, 64), dtype, g)
        ids = torch.randint(-3000, 3000, (700,), generator=g)
        ids[:40] = 17
        rows = _make((700, 64), dtype, g)
        idx2 = torch.randint(0, 64, (3000, 40), generator=g)
        src2 = _make((3000, 40), dtype, g)
    device = torch.get_default_device()
    x, ids, rows, idx2, src2 = (t.to(device) for t in (x, ids, rows, idx2, src2))
    fns = [lambda x, i, r: x.index_put((i,), r, accumulate=True) * 2,
           lambda x, i, r: x.index_add(0, i.remainder(3000), r) + 1]
    for fn in fns:
        _compiled_matches(fn, x, ids, rows)
    _compiled_matches(lambda x, i, s: x.scatter_add(1, i, s) - 1, x, idx2, src2)


@pytest.mark.cpu_only("the CPU's scatter threads own ranges of positions; CUDA adds atomically")
def test_sums_beyond_the_pair_cap_are_the_same_at_any_thread_count():
    """The CPU's accumulating scatter splits the positions among threads, each adding the
    values aimed at its own in source order: the same sums bit for bit on one thread or
    several (no atomics, no order that depends on timing), close to eager's, with a value
    computed in the scatter and heavily repeated indices."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(3000, 64, generator=g)
    ids = torch.randint(0, 3000, (4000,), generator=g)
    ids[:500] = 7
    rows = torch.randn(4000, 64, generator=g)
    fn = lambda x, i, r: x.index_put((i,), r.sin() * 3, accumulate=True)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            torch._dynamo.reset()
            results.append(torch.compile(fn, backend="braze", dynamic=False)(x, ids, rows))
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(results[0], fn(x, ids, rows), rtol=1e-5, atol=1e-4)
    for n, got in zip((2, 3), results[1:]):
        assert torch.equal(got, results[0]), f"{n} threads differ from one"


@pytest.mark.cpu_only("the CPU's threads split the sources of an order-free combine")
def test_order_free_combines_split_their_sources_among_threads():
    """Maxima (with NaNs), integer sums and the counts of a mean beyond the pair cap combine
    atomically from threads that split the sources: eager's result at any thread count."""
    g = torch.Generator().manual_seed(12)
    x = torch.randn(3000, 16, generator=g)
    i = torch.randint(0, 3000, (20000, 16), generator=g)
    s = torch.randn(20000, 16, generator=g)
    s[::501, 2] = float("nan")
    xi, si = x.mul(100).to(torch.int64), s.nan_to_num().mul(100).to(torch.int64)
    fn = lambda x, i, s, xi, si: (x.scatter_reduce(0, i, s, "amax", include_self=False),
                                  x.scatter_reduce(0, i, s, "amin"),
                                  xi.scatter_add(0, i, si), x.scatter_reduce(0, i, s, "mean"))
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            torch._dynamo.reset()
            got = torch.compile(fn, backend="braze", dynamic=False)(x, i, s, xi, si)
            for a, e in zip(got, fn(x, i, s, xi, si)):
                torch.testing.assert_close(a, e, equal_nan=True)
    finally:
        torch.set_num_threads(threads)


def test_sums_beyond_the_pair_cap_check_their_indices():
    x, rows = torch.zeros(3000, 64), torch.ones(700, 64)
    for bad in (3000, -3001):
        ids = torch.randint(0, 3000, (700,))
        ids[5] = bad
        torch._dynamo.reset()
        f = torch.compile(lambda x, i, r: x.index_put((i,), r, accumulate=True),
                          backend="braze", options={"strict": True})
        with pytest.raises(Exception, match="out of bounds|index"):
            f(x, ids, rows)
            if x.is_cuda:
                torch.cuda.synchronize()


@pytest.mark.parametrize("tied", [False, True])
def test_training_a_large_embedding_compiles_its_backward(tied):
    """An embedding's backward (an accumulating index_put into a vocabulary x dim table far
    beyond the pair cap) compiles with nothing left to eager, and its gradients match. Tied to
    the output layer's weight, the lookups' scatter adds into that layer's weight gradient
    (fold-scatter-add)."""
    torch.manual_seed(2)
    emb = torch.nn.Embedding(8000, 64)
    head = torch.nn.Linear(64, 8000 if tied else 10)
    if tied:
        head.weight = emb.weight
    ids = torch.randint(0, 8000, (4, 96))
    ids[:, :8] = 3  # repeated tokens

    def step(model_fn):
        emb.zero_grad(set_to_none=True)
        head.zero_grad(set_to_none=True)
        loss = model_fn(ids)
        loss.backward()
        return [loss.detach(), emb.weight.grad.clone(), head.weight.grad.clone(),
                head.bias.grad.clone()]

    fn = lambda i: head(torch.tanh(emb(i))).square().mean()
    torch._dynamo.reset()
    before = braze.counters()["fallback_ops"]
    got = step(torch.compile(fn, backend="braze"))
    assert braze.counters()["fallback_ops"] == before
    want = step(fn)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_index_select_of_a_0d_tensor():
    """PyTorch's decomposition index_puts into an empty_permuted tensor."""
    _compiled_matches(lambda x, i: torch.index_select(x, 0, i) * 2, torch.tensor(2.5),
                      torch.tensor([0]))


def test_scatters_that_atomics_would_reorder_are_named_for_deterministic_mode():
    """Float sums, products and means beyond the pair cap add atomically on CUDA, in no fixed
    order: braze names them (support.nondeterministic_on_cuda), so that under
    torch.use_deterministic_algorithms(True) they run in eager. Maxima, integers and scatters
    within the cap are deterministic on every device."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from braze import support

    def fn(x, i, s, j, y, xi, si, small, k, v):
        return (x.index_put((i,), s, accumulate=True), x.index_add(0, i, s),
                x.scatter_add(0, j, y), x.scatter_reduce(0, j, y, "mean"),
                x.scatter_reduce(0, j, y, "amax"), xi.index_put((i,), si, accumulate=True),
                small.index_put((k,), v, accumulate=True))
    with torch.device("cpu"):
        x, i, s = torch.randn(3000, 64), torch.randint(0, 3000, (700,)), torch.randn(700, 64)
        j, y = torch.randint(0, 3000, (900, 64)), torch.randn(900, 64)
        xi, si = torch.ones(3000, 64, dtype=torch.int64), torch.ones(700, 64, dtype=torch.int64)
        small, k, v = torch.randn(10, 4), torch.tensor([1, 1]), torch.randn(2, 4)
        gm = make_fx(fn)(x, i, s, j, y, xi, si, small, k, v)
    named = [n.target.__name__ for n in gm.graph.nodes
             if n.op == "call_function" and support.nondeterministic_on_cuda(n)]
    assert sorted(named) == ["index_add.default", "index_put.default", "scatter_add.default",
                             "scatter_reduce.two"], named
    why = next(support.nondeterministic_on_cuda(n) for n in gm.graph.nodes
               if n.op == "call_function" and support.nondeterministic_on_cuda(n))
    assert "torch.use_deterministic_algorithms(True)" in why and "element pairs" in why


def test_deterministic_mode_runs_atomic_scatters_in_eager(device):
    if device != "cuda":
        pytest.skip("deterministic mode changes only braze's CUDA scatters")
    x, rows = torch.randn(3000, 64), torch.randn(700, 64)
    ids = torch.randint(0, 3000, (700,))
    fn = lambda x, i, r: x.index_put((i,), r, accumulate=True) * 2
    torch._dynamo.reset()
    torch.use_deterministic_algorithms(True)
    try:
        before = braze.counters()["fallback_ops"]
        got = [torch.compile(fn, backend="braze")(x, ids, rows) for _ in range(2)]
        assert braze.counters()["fallback_ops"] > before
        assert torch.equal(got[0], got[1])
        torch.testing.assert_close(got[0], fn(x, ids, rows))
    finally:
        torch.use_deterministic_algorithms(False)
        torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_index_put_of_many_entries_writes_in_place(device, dtype):
    """Beyond 2^20 position x entry pairs, an index_put's last write per position is found by
    an accumulating maximum of entry numbers (linear work) instead of comparing every position
    with every entry: a router's inverse permutation of 4,096 tokens. On the CPU, scatter's
    repeated indices too, where eager's serial loop makes the last win (an index_put's repeats
    are left undefined by eager and are not compared)."""
    g = torch.Generator().manual_seed(7)
    n = 4096
    perm = torch.randperm(n, generator=g, device="cpu")

    def invert(p):
        inv = torch.empty_like(p)
        inv[p] = torch.arange(p.numel(), device=p.device)
        return inv
    _compiled_matches(invert, perm.to(device))
    torch._dynamo.reset()
    _, sources = braze.run_and_get_code(torch.compile(invert, backend="braze", dynamic=False),
                                        perm.to(device))
    assert "atomic" in "\n".join(sources).lower()  # combined in place, not 2^24 comparisons
    if device != "cpu":
        return
    ids = torch.cat([perm, perm[:700], perm[100:300]])  # repeats: the later entries win
    vals = _make((ids.numel(),), dtype, g)
    _compiled_matches(lambda x, i, v: x.scatter(0, i, v), _make((n,), dtype, g), ids, vals)
    _compiled_matches(lambda x, i, v: x.scatter_reduce(0, i, v, "amax", include_self=False),
                      _make((n,), dtype, g), ids, vals)
