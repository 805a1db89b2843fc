"""The long tail of simpler ops: uninitialized creation, as_strided and copies of views,
whole-tensor max/min, single-kernel pointwise ops, small composites, search and scans, and
random distributions. Deterministic ops are compared with eager PyTorch; random ones are
checked statistically."""
import math

import pytest
import torch
import torch.nn.functional as F

import braze
from _device import eager

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.int64, torch.uint8]


def compiled(fn):
    return torch.compile(fn, backend="braze", dynamic=False)


def run_compiled(fn, *args):
    """fn compiled by braze with no op left to eager, and fn's eager result."""
    before = braze.counters()["fallback_ops"]
    got = compiled(fn)(*args)
    assert braze.counters()["fallback_ops"] == before
    return got, eager(fn, *args)


def assert_same(got, want, **tol):
    torch.testing.assert_close(got, want, equal_nan=True, **tol)


def test_uninitialized_creation_has_eager_shape_dtype_and_layout():
    def fn(x):
        d = x.device
        return (torch.empty(2, 3, dtype=torch.int16, device=d), torch.empty_like(x),
                torch.empty_strided((3, 4), (1, 3), device=d), x.new_empty_strided((2, 5), (5, 1)),
                torch.empty_permuted((2, 3, 4), (0, 2, 1), device=d), x.new_empty((0, 2)))
    got, want = run_compiled(fn, torch.randn(4, 3).t())
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert g.stride() == w.stride()


def test_as_strided_reads_the_contiguous_storage():
    def fn(x):
        return (torch.as_strided(x, (3, 3), (1, 2), 1), torch.as_strided(x, (2, 2, 2), (6, 0, 1)),
                torch.as_strided(x, (), (), 7), torch.as_strided_copy(x, (4,), (5,)))
    x = torch.randn(4, 5)
    got, want = run_compiled(fn, x)
    assert_same(got, want)
    # A view with a storage offset of its own: as_strided counts from the storage start.
    got, want = run_compiled(lambda x: torch.as_strided(x[1:] + 0, (2, 2), (1, 5), 6), x)
    assert_same(got, want)


def test_as_strided_of_a_transposed_input_stays_correct():
    x = torch.randn(4, 5).t()
    fn = lambda x: torch.as_strided(x, (2, 3), (3, 1), 0) * 2  # noqa: E731
    assert_same(compiled(fn)(x), fn(x))


def test_copies_of_views_and_whole_tensor_max_min():
    def fn(x):
        return (torch.view_copy(x, (6, 4)), torch.permute_copy(x, (2, 0, 1)),
                torch.narrow_copy(x, 1, 1, 2), *torch.unbind_copy(x, 2), torch.max(x), torch.min(x))
    for dt in (torch.float32, torch.int32, torch.bool):
        x = torch.randn(2, 3, 4).to(dt) if dt != torch.bool else torch.rand(2, 3, 4) > 0.5
        got, want = run_compiled(fn, x)
        assert_same(got, want)


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_pointwise(dtype):
    def fn(a, b, e):
        return (torch.fmax(a, b), torch.fmin(a, b), torch.signbit(b), torch.hypot(a, b),
                *torch.frexp(a * 100), torch.round(a * 10, decimals=2),
                torch.round(a * 1000, decimals=-2), torch.angle(b), torch.ldexp(a, e))
    a, b = torch.randn(6, 7).to(dtype), torch.randn(6, 7).to(dtype)
    a[0, 0] = b[1, 1] = a[2, 2] = b[2, 2] = float("nan")
    b[0, 1], b[0, 2] = -0.0, -float("inf")
    e = torch.randint(-6, 6, (6, 7))
    got, want = run_compiled(fn, a, b, e)
    assert_same(got, want)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_nextafter(dtype):
    big = torch.finfo(dtype).max
    a = torch.tensor([0.0, 1.0, -1.0, float("inf"), 1.0, float("nan"), 0.0, -0.0, big, 3.0], dtype=dtype)
    b = torch.tensor([1.0, 0.0, -2.0, 0.0, 1.0, 0.0, -1.0, 0.0, float("inf"), -3.0], dtype=dtype)
    got, want = run_compiled(torch.nextafter, a, b)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[:5], want[:5]) and torch.equal(got[6:], want[6:])
    assert torch.equal(got.signbit(), want.signbit())


@pytest.mark.parametrize("dtype", INTS)
def test_integer_pointwise(dtype):
    def fn(a, b, s):
        return (torch.gcd(a, b), torch.lcm(a, b), torch.bitwise_left_shift(a, s),
                torch.bitwise_right_shift(a, s), torch.signbit(a), torch.fmax(a, b), torch.angle(a))
    lo = 0 if dtype == torch.uint8 else -120
    a = torch.randint(lo, 120, (64,)).to(dtype)
    b = torch.randint(lo, 120, (64,)).to(dtype)
    a[:3] = 0
    # Shift counts across and beyond the bit width, and negative ones for signed types.
    s = torch.randint(0 if dtype == torch.uint8 else -5, 70, (64,)).to(dtype)
    got, want = run_compiled(fn, a, b, s)
    assert_same(got, want)


def test_addmm_on_integers_truncates_the_scalars():
    b, x, y = torch.randint(-5, 5, (3, 4)), torch.randint(-5, 5, (3, 5)), torch.randint(-5, 5, (5, 4))
    got, want = run_compiled(lambda b, x, y: (torch.addmm(b, x, y, beta=0.6, alpha=0.2),
                                              torch.addmm(b, x, y, beta=1.5, alpha=2.7)), b, x, y)
    assert_same(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_addbmm_and_bilinear(dtype):
    def fn(bias, b1, b2):
        return (torch.addbmm(bias, b1, b2, beta=2, alpha=3), torch.addbmm(bias[0], b1, b2),
                torch.addbmm(bias, b1, b2, beta=0.5, alpha=2.5))  # integers truncate the scalars
    mk = (lambda *s: torch.randn(*s).to(dtype)) if dtype.is_floating_point else \
        (lambda *s: torch.randint(-4, 5, s))
    got, want = run_compiled(fn, mk(3, 5), mk(4, 3, 6), mk(4, 6, 5))
    assert_same(got, want)
    if dtype.is_floating_point:
        got, want = run_compiled(F.bilinear, mk(2, 3, 4), mk(2, 3, 5), mk(6, 4, 5), mk(6))
        assert_same(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
def test_bucketize_and_searchsorted(dtype):
    def fn(x, bounds, seq, shuffled, sorter):
        return (torch.bucketize(x, bounds), torch.bucketize(x, bounds, right=True, out_int32=True),
                torch.searchsorted(seq, x[:, :4], side="right"),
                torch.searchsorted(shuffled, x, sorter=sorter),
                torch.bucketize(x[0, 0], bounds))
    x = (torch.randn(3, 4) * 6).to(dtype)
    bounds = torch.sort((torch.randn(7) * 6).to(dtype)).values
    bounds[2] = bounds[3]  # a repeated boundary
    x[0, 1] = bounds[2]    # values equal to boundaries
    seq = torch.sort((torch.randn(3, 5) * 6).to(dtype), dim=1).values
    shuffled = bounds[torch.randperm(7)]
    got, want = run_compiled(fn, x, bounds, seq, shuffled, torch.argsort(shuffled, stable=True))
    assert_same(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8, torch.bool])
def test_cummax_cummin(dtype):
    def fn(x):
        return (*torch.cummax(x, 1), *torch.cummin(x, 0), *torch.cummax(x[0, 0], 0))
    x = (torch.randint(-3, 4, (4, 9)).to(dtype) if dtype != torch.bool
         else torch.rand(4, 9) > 0.5)  # small range: many ties
    if dtype.is_floating_point:
        x[1, 3] = x[1, 6] = x[3, 0] = float("nan")
    got, want = run_compiled(fn, x)
    assert_same(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_histc(dtype):
    def fn(x):
        return (torch.histc(x, bins=7, min=-3, max=10), torch.histc(x[0], bins=3, min=0, max=10),
                torch.histc(x[1:12], bins=10, min=-10, max=0))
    x = (torch.randn(200) * 4).to(dtype)
    x[0], x[1], x[2], x[3], x[4] = float("nan"), 10, -10, 3, float("inf")  # edges, outside, NaN
    got, want = run_compiled(fn, x)
    assert_same(got, want)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_histc_of_integers(device, dtype):
    """Expert ids counted per expert, as a mixture of experts' router does on CUDA: eager's
    CUDA kernel bins integers with the range truncated to integers (min=-0.5 is 0), in
    integer arithmetic; braze matches it. Eager's CPU kernel refuses integers, and so does the
    compiled call (the op runs in eager)."""
    def fn(x):
        return (torch.histc(x, bins=8, min=0, max=7), torch.histc(x, bins=3, min=-0.5, max=7.9),
                torch.histc(x, bins=5, min=2, max=6))
    x = torch.randint(0, 9, (1000,), dtype=dtype)
    if device != "cuda":
        with pytest.raises((RuntimeError, NotImplementedError), match="not implemented"):
            compiled(fn)(x)
        return
    got, want = run_compiled(fn, x)
    assert_same(got, want, atol=0, rtol=0)


def test_histc_with_a_range_from_the_data_runs_eagerly():
    x = torch.tensor([1.0, float("inf")])
    with pytest.raises(Exception, match="not finite"):
        compiled(lambda x: torch.histc(x, bins=4))(x)


def test_decomposed_composites():
    def fn(b, m, v, x, y, g):
        return (torch.addmv(b, m, v, beta=0.5, alpha=2), torch.dist(x, y, 3),
                torch.linalg.cross(x[:, :3], y[:, :3]), F.group_norm(g, 2, g.new_ones(4), None),
                torch.tril_indices(4, 5, 1, device=b.device),
                torch.triu_indices(3, 3, -1, device=b.device))
    args = (torch.randn(3), torch.randn(3, 4), torch.randn(4), torch.randn(5, 3), torch.randn(5, 3),
            torch.randn(2, 4, 3))
    got, want = run_compiled(fn, *args)
    assert_same(got, want)


def test_cross_in_half_precision_rounds_each_step():
    a, b = (torch.randn(2, 5, 3) * 10).bfloat16(), (torch.randn(1, 5, 3) * 10).bfloat16()
    got, want = run_compiled(lambda a, b: (torch.linalg.cross(a, b), torch.cross(a[0].t(), b[0].t(), dim=0)),
                             a, b)
    assert_same(got, want, atol=0, rtol=0)


N = 1 << 18


def test_randint_covers_its_range_uniformly(device):
    # The device is explicit: under torch.set_default_device("cuda") these factory overloads
    # still make CPU tensors, and the CUDA variant would test the CPU kernels.
    r = run_compiled(lambda: torch.randint(-3, 5, (N,), device=device), )[0]
    assert r.device.type == device
    assert r.dtype == torch.int64 and r.min() == -3 and r.max() == 4
    counts = torch.bincount(r + 3, minlength=8).double()
    assert (counts - N / 8).abs().max() < 6 * math.sqrt(N / 8)
    like = run_compiled(lambda x: torch.randint_like(x, 10, 12), torch.zeros(1000, dtype=torch.int16))[0]
    assert like.dtype == torch.int16 and set(like.unique().tolist()) == {10, 11}
    big = run_compiled(lambda: torch.randint(0, 2 ** 40, (N,), device=device))[0]
    assert big.min() >= 0 and big.max() < 2 ** 40
    assert abs(big.double().mean().item() / 2 ** 40 - 0.5) < 6 * math.sqrt(1 / 12 / N)


def test_continuous_distributions():
    def fn(x):
        # normal's size overload is given x's device: under torch.set_default_device("cuda") it
        # makes a CPU tensor, and a graph that mixes devices runs in eager.
        return (torch.empty_like(x).uniform_(-2, 6), torch.normal(torch.full_like(x, 3.0), 2.0),
                torch.normal(1.0, 0.5, (N,), device=x.device),
                torch.empty_like(x).exponential_(4.0),
                torch.empty_like(x).geometric_(0.25), torch.empty_like(x).cauchy_(1.0, 2.0),
                torch.empty_like(x).log_normal_(0.0, 0.5))
    u, n1, n2, ex, ge, ca, ln = run_compiled(fn, torch.empty(N, dtype=torch.float64))[0]
    se = 6 / math.sqrt(N)
    assert u.min() >= -2 and u.max() < 6 and abs(u.mean().item() - 2) < 8 * se
    assert abs(n1.mean().item() - 3) < 2 * se and abs(n1.std().item() - 2) < 2 * se * 2
    assert abs(n2.mean().item() - 1) < 0.5 * se and abs(n2.std().item() - 0.5) < se
    assert ex.min() >= 0 and abs(ex.mean().item() - 0.25) < 0.25 * se
    assert ge.min() >= 1 and torch.equal(ge, ge.round()) and abs(ge.mean().item() - 4) < 4 * se * 2
    gi = run_compiled(lambda x: x.geometric_(0.5), torch.zeros(N, dtype=torch.int32))[0]
    assert gi.dtype == torch.int32 and gi.min() == 1 and abs(gi.double().mean().item() - 2) < 2 * se
    assert abs(ca.median().item() - 1) < 0.05
    assert abs(ln.log().mean().item()) < 0.5 * se and abs(ln.log().std().item() - 0.5) < se


def test_random_half_precision_and_fresh_draws():
    fn = compiled(lambda x: (torch.normal(x, 1.0), torch.empty_like(x).uniform_(0, 1)))
    a, b = fn(torch.zeros(4096, dtype=torch.float16))
    assert a.dtype == torch.float16 and abs(a.float().mean().item()) < 0.1
    assert b.min() >= 0 and b.max() <= 1
    assert not torch.equal(fn(torch.zeros(4096, dtype=torch.float16))[0], a)


def test_searchsorted_with_a_bad_sorter_raises():
    seq, x = torch.arange(5.0), torch.tensor([1.5, 3.5])
    with pytest.raises(Exception, match="gather"):
        compiled(lambda s, x, so: torch.searchsorted(s, x, sorter=so))(seq, x, torch.tensor([0, 1, 2, 3, 9]))


def test_generated_sources_are_kept_only_for_run_and_get_code():
    """run_and_get_code returns the sources of the graphs compiled during its call, nested calls
    included; outside such a call braze keeps none (a long-running process compiling many graphs
    does not grow)."""
    from braze import backend
    torch._dynamo.reset()
    f = torch.compile(lambda x: (x + 1).relu(), backend="braze")
    f(torch.randn(5))
    assert backend._state.source_records == []
    g = torch.compile(lambda x: x * 3, backend="braze")
    inner = []

    def both(x):
        inner.append(braze.run_and_get_code(g, x)[1])
        return f(x + 0.5)

    torch._dynamo.reset()
    _, outer = braze.run_and_get_code(both, torch.randn(7))
    assert len(inner[0]) == 1 and len(outer) == 2 and inner[0][0] in outer
    assert backend._state.source_records == []


class _FakeCapture:
    """Stands in for a CUDA-graph capture where there is no GPU: it fits the calls whose first
    argument is the tensor it was made with (an input read in place), or any call once that
    input is copied per call (among `moving`), and runs fn."""

    def __init__(self, fn, args, static, name, written, moving=frozenset()):
        self.fn = fn
        self.first = args[0]
        self.copied = 0 in moving
        self.fixed_positions = [] if self.copied else [0]
        self.fixed_ptrs = [args[0].data_ptr()]

    def busy(self):
        return False

    def fits(self, args):
        return self.copied or args[0] is self.first

    def run(self, args):
        return self.fn(*args)

    def release(self):
        pass


def test_cuda_graphs_of_dynamic_shapes_capture_per_size_up_to_the_limit(monkeypatch):
    """The bookkeeping of per-size capture, without a GPU: a size is keyed by its integers and
    tensor shapes (any other argument by its type), captured at its first call after the
    callable's first, replayed after that; sizes beyond the limit run uncaptured."""
    from braze import cudagraphs
    monkeypatch.setattr(cudagraphs, "_Capture", _FakeCapture)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d: type("P", (), {"total_memory": 1 << 30}))
    assert cudagraphs.size_key([torch.ones(2, 3), 5, None, [1], 2.5]) == (
        (2, 3), 5, None, "list", 2.5)
    counts = dict(cudagraphs.counts)
    r = cudagraphs.Replayed(lambda x, n: x * n, frozenset(), "g", max_sizes=2)
    xs = {n: torch.ones(n) for n in (3, 4, 5)}
    for _ in range(2):
        for n in (3, 4, 5):
            torch.testing.assert_close(r(xs[n], n), torch.full((n,), float(n)))
    got = {k: cudagraphs.counts[k] - counts[k] for k in counts}
    # 3 is the first call; 4 and 5 are captured (the limit); the second 3 is over the limit
    assert got == {"cuda_graphs": 2, "cuda_graph_replays": 4, "cuda_graph_busy": 0,
                   "cuda_graph_uncaptured_sizes": 1}, got
    assert len(r.captures) == 2 and r.full
    # a static callable tries the capture it replayed last first
    s = cudagraphs.Replayed(lambda x: x + 1, frozenset(), "s")
    a, b = torch.ones(2), torch.zeros(2)
    for x in (a, a, b, a, b):
        s(x)
    assert [c.first for c in s.captures] == [b, a]


def test_an_input_read_in_place_that_moves_at_every_call_is_copied(monkeypatch):
    """The bookkeeping of _copy_moving, without a GPU: an input read in place (a large zero
    gradient autograd makes per backward) at a new address at every call is captured at the
    callable's second, third and fourth calls, then copied per call, and every later call
    replays. An input alternating between two addresses (double buffering) keeps two captures
    that read it in place."""
    from braze import cudagraphs
    monkeypatch.setattr(cudagraphs, "_Capture", _FakeCapture)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    said = []
    monkeypatch.setattr(cudagraphs, "log", said.append)
    counts = dict(cudagraphs.counts)
    r = cudagraphs.Replayed(lambda x: x * 2, frozenset(), "g", launches=100)
    keep = []
    for k in range(12):
        keep.append(torch.full((4,), float(k)))  # a new address at every call
        torch.testing.assert_close(r(keep[-1]), torch.full((4,), 2.0 * k))
    got = {k: cudagraphs.counts[k] - counts[k] for k in counts}
    assert got == {"cuda_graphs": 4, "cuda_graph_replays": 11, "cuda_graph_busy": 0,
                   "cuda_graph_uncaptured_sizes": 0}, got
    assert r.moving == {0} and len(r.captures) == 1 and r.captures[0].copied
    assert [m for m in said if "copies inputs [0] per call from now on" in m], said
    counts = dict(cudagraphs.counts)
    s = cudagraphs.Replayed(lambda x: x + 1, frozenset(), "s", launches=100)
    a, b = torch.ones(4), torch.zeros(4)
    for x in (a, b) * 8:
        s(x)
    got = {k: cudagraphs.counts[k] - counts[k] for k in counts}
    assert got["cuda_graphs"] == 2 and got["cuda_graph_replays"] == 15 and not s.moving, got


def test_a_missing_cpu_library_is_said_once(device, monkeypatch):
    """A CPU library braze declares as a dependency (OpenBLAS, oneDNN) but cannot find is said
    once per process, naming the package and what runs instead; the graph still compiles and
    matches eager. BRAZE_BLAS naming a library keeps it silent."""
    import warnings
    from braze import cpu as cpu_support
    if device != "cpu":
        pytest.skip("the CPU libraries")
    monkeypatch.setattr(cpu_support, "blas_library", lambda: None)
    monkeypatch.delenv("BRAZE_BLAS", raising=False)
    cpu_support.missing_library_notice.cache_clear()
    try:
        a, b = torch.randn(5, 7), torch.randn(7, 3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                torch._dynamo.reset()
                got = torch.compile(lambda a, b: (a @ b).relu(), backend="braze")(a, b)
                torch.testing.assert_close(got, (a @ b).relu())
        said = [str(w.message) for w in caught if "scipy-openblas64" in str(w.message)]
        assert len(said) == 1 and "loop nests" in said[0] and "BRAZE_BLAS" in said[0], said
        cpu_support.missing_library_notice.cache_clear()
        monkeypatch.setenv("BRAZE_BLAS", "/somewhere/libopenblas.so")
        assert cpu_support.missing_library_notice("blas") is None
    finally:  # said (and dropped) again, as conftest does, for the tests after this one
        cpu_support.missing_library_notice.cache_clear()
        monkeypatch.undo()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cpu_support.say_missing_libraries(True, True)


def test_writes_into_inputs_with_returned_intermediates_match_eager(device):
    """An input updated in place whose update reads a value that is also returned (Adam's
    moments, from a gradient with the parameter's weight decay added): the returned value is
    the one computed from the input before the write, and the input holds the update."""
    def decayed(p, g):
        t = p * 2 + g
        p.add_(t)
        return t

    def moments(p, m, g):
        gg = g + 0.1 * p
        m.mul_(0.9).add_(gg)
        p.sub_(m * 0.5 + gg)
        return gg.sum()

    def read_after(p, g):
        t = p.exp()
        p.mul_(0.5).add_(t)
        return t, t.sum(), p.sum()

    torch.manual_seed(0)
    for f, n in ((decayed, 2), (moments, 3), (read_after, 2)):
        with torch.device("cpu"):
            args = [torch.randn(64, 33) for _ in range(n)]
        mine = [x.to(device) for x in args]
        theirs = [x.clone().to(device) for x in args]
        want = f(*theirs)
        torch._dynamo.reset()
        got = torch.compile(f, backend="braze")(*mine)
        torch.testing.assert_close(got, want)
        for x, y in zip(mine, theirs):
            torch.testing.assert_close(x, y)
