"""Partition boundaries: layouts that eager kernels really produce, outputs laid out as the graph
declares, and a call path that never breaks the user's program.

The ops below are custom ops braze cannot compile (so they run in eager between partitions) whose
fake (meta) functions promise another layout than their kernels return, as PyTorch's attention
kernels do on CUDA."""
import operator
import warnings

import pytest
import torch

import braze
from braze import layouts

warnings.filterwarnings("ignore", message=".*braze cannot compile.*")


@torch.library.custom_op("braze_test::row_major_but_fake_column_major", mutates_args=())
def row_major_but_fake_column_major(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@row_major_but_fake_column_major.register_fake
def _(x):
    return torch.empty_strided(x.shape, (1, x.shape[0]), dtype=x.dtype, device=x.device)


@torch.library.custom_op("braze_test::dense_but_fake_expanded", mutates_args=())
def dense_but_fake_expanded(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.expand(n, *x.shape[1:]).contiguous()


@dense_but_fake_expanded.register_fake
def _(x, n):
    return x.expand(n, *x.shape[1:])


@torch.library.custom_op("braze_test::plain_eager", mutates_args=())
def plain_eager(x: torch.Tensor) -> torch.Tensor:
    return x + 0.5


@plain_eager.register_fake
def _(x):
    return torch.empty_like(x)


_probed = {}


@torch.library.custom_op("braze_test::probe_argument", mutates_args=())
def probe_argument(x: torch.Tensor) -> torch.Tensor:
    """x + 0.5, noting whether the tensor _probed["ref"] names is still alive."""
    _probed["alive"] = _probed.get("ref", lambda: None)() is not None
    return x + 0.5


@probe_argument.register_fake
def _(x):
    return torch.empty_like(x)


def _delta(before, after, *keys):
    return {k: after[k] - before[k] for k in keys}


def test_view_after_an_eager_op_whose_layout_differs_from_its_meta():
    """GPT-2 on CUDA: the graph's `view` was traced against the meta layout of an eager op's
    result; the real result is laid out otherwise. braze compiles a variant for the layout it
    receives, once, and never runs the partition in eager."""
    def fn(x):
        y = row_major_but_fake_column_major(x + 1)
        return y.t().reshape(-1) * 3  # a view for the meta layout, not for the real one

    x = torch.randn(6, 5)
    want = fn(x)
    before = braze.counters()
    compiled = torch.compile(fn, backend="braze")
    for _ in range(3):
        torch.testing.assert_close(compiled(x), want)
    moved = _delta(before, braze.counters(), "recompiles", "fallback_graphs", "fallback_ops")
    assert moved == {"recompiles": 1, "fallback_graphs": 0, "fallback_ops": 1}


def test_input_materialized_where_the_graph_expected_an_expansion():
    """LLaMA on CUDA: an input of a partition has stride 262144 where the compiled graph
    expected 0 (an expanded mask that an eager kernel materialized)."""
    def fn(x):
        return dense_but_fake_expanded(x, 4).sin() + 1

    x = torch.randn(1, 3, 8)
    want = fn(x)
    before = braze.counters()
    compiled = torch.compile(fn, backend="braze")
    for _ in range(3):
        torch.testing.assert_close(compiled(x), want)
    moved = _delta(before, braze.counters(), "recompiles", "fallback_graphs")
    assert moved == {"recompiles": 1, "fallback_graphs": 0}


def test_an_expanded_result_reaches_the_next_partition_expanded():
    """LLaMA on CUDA, the other way round: a partition's result that the graph declares expanded
    (stride 0, a broadcast mask) reaches the next partition, across an eager op, with stride 0,
    as that partition was compiled for: no variant, no eager call."""
    def fn(x, w):
        mask = (w.sum(-1, keepdim=True) > 0).float().expand(-1, 8)
        y = plain_eager(x * mask)
        return y * mask

    x, w = torch.randn(6, 8), torch.randn(6, 3)
    want = fn(x, w)
    before = braze.counters()
    compiled = torch.compile(fn, backend="braze")
    for _ in range(3):
        torch.testing.assert_close(compiled(x, w), want)
    moved = _delta(before, braze.counters(), "recompiles", "fallback_graphs", "partitions")
    assert moved == {"recompiles": 0, "fallback_graphs": 0, "partitions": 2}


def test_each_layout_seen_is_compiled_once():
    def fn(x):
        return row_major_but_fake_column_major(x).t().reshape(-1) + 1

    compiled = torch.compile(fn, backend="braze", dynamic=False)
    a, b = torch.randn(4, 7), torch.randn(4, 7)
    before = braze.counters()
    for x in (a, b, a, b):
        torch.testing.assert_close(compiled(x), fn(x))
    assert braze.counters()["recompiles"] - before["recompiles"] == 1


@pytest.mark.parametrize("case", ["strided", "expanded", "transposed", "column"])
def test_outputs_have_the_declared_layout(case):
    fns = {
        "strided": lambda x: (x + 1)[:, :3],
        "expanded": lambda x: (x.sum(1, keepdim=True) + 1).expand(-1, 4),
        "transposed": lambda x: (x * 2).t(),
        "column": lambda x: (x * 2).t()[1:, ::2],
    }
    x = torch.randn(5, 6)
    fn = fns[case]
    want = fn(x)
    got = torch.compile(fn, backend="braze")(x)
    assert got.shape == want.shape and got.stride() == want.stride()
    torch.testing.assert_close(got, want)


def test_a_strided_output_can_be_viewed_as_in_eager():
    def fn(x):
        return (x + 1)[:, :4], (x * 3).t()

    x = torch.randn(4, 6)
    got = torch.compile(fn, backend="braze")(x)
    want = fn(x)
    for g, w in zip(got, want):
        assert g.stride() == w.stride()
    torch.testing.assert_close(got[1].reshape(-1), want[1].reshape(-1))
    torch.testing.assert_close(got[0].view(4, 2, 2), want[0].view(4, 2, 2))


def _break_variants(monkeypatch, exc):
    real = braze.backend._compile_whole

    def compile_whole(gm, opts, device=None, args=None, **kw):
        if args is not None:
            raise exc
        return real(gm, opts, device, args, **kw)
    monkeypatch.setattr(braze.backend, "_compile_whole", compile_whole)


@pytest.mark.graph_fallback("calls that braze's call path refuses run in eager")
def test_eager_fallback_receives_the_layouts_it_was_traced_with(monkeypatch):
    """The last resort: when no variant can be compiled, the partition's call runs in eager on
    inputs laid out as its meta values say (so its `view` holds), with one warning."""
    _break_variants(monkeypatch, braze.CompileError("no variant in this test"))

    def fn(x):
        y = row_major_but_fake_column_major(x + 1)
        return y.t().reshape(-1) * 3

    x = torch.randn(6, 5)
    want = fn(x)
    before = braze.counters()
    compiled = torch.compile(fn, backend="braze")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            torch.testing.assert_close(compiled(x), want)
    mine = [w for w in caught if "running this call in eager PyTorch" in str(w.message)]
    assert len(mine) == 1 and "no variant in this test" in str(mine[0].message)
    assert braze.counters()["fallback_graphs"] - before["fallback_graphs"] == 2


@pytest.mark.graph_fallback("an internal error in the call path runs the call in eager")
def test_an_internal_error_in_the_call_path_runs_eager(monkeypatch):
    _break_variants(monkeypatch, RuntimeError("internal failure in this test"))

    def fn(x):
        return row_major_but_fake_column_major(x).t().reshape(-1) + 1

    x = torch.randn(3, 4)
    with pytest.warns(UserWarning, match="internal error in braze's call .*internal failure"):
        torch.testing.assert_close(torch.compile(fn, backend="braze")(x), fn(x))


def test_strict_raises_instead_of_running_eager(monkeypatch):
    _break_variants(monkeypatch, RuntimeError("internal failure in this test"))

    def fn(x):
        return row_major_but_fake_column_major(x).t().reshape(-1) + 1

    compiled = torch.compile(fn, backend="braze", options={"strict": True})
    with pytest.raises(Exception, match="internal failure in this test"):
        compiled(torch.randn(3, 4))


def test_an_index_out_of_range_still_raises():
    def fn(x, i):
        return row_major_but_fake_column_major(x).t()[i] + 1

    x, i = torch.randn(3, 4), torch.tensor([0, 9])
    with pytest.raises(Exception, match="out of|index"):
        torch.compile(fn, backend="braze")(x, i)


# ---- the boundary after eager ops -----------------------------------------------------------
def test_match_layout_copies_only_when_the_layout_differs():
    x = torch.randn(3, 4)
    assert layouts.match_layout(x, (3, 4), (4, 1)) is x
    assert layouts.match_layout(x[:1], (1, 4), (99, 1)) is not None  # size-1 dims: any stride
    y = layouts.match_layout(x, (3, 4), (1, 3))
    assert y.stride() == (1, 3)
    torch.testing.assert_close(y, x)
    z = layouts.match_layout(x[:, :1].expand(3, 4).contiguous(), (3, 4), (1, 0))
    assert z.stride() == (1, 0)
    torch.testing.assert_close(z, x[:, :1].expand(3, 4))


def test_eager_results_read_by_eager_ops_are_laid_out_as_declared():
    """A boundary is placed after an eager op exactly where its result reaches another eager op;
    a result only compiled partitions read keeps its real layout (they take any layout)."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    a = graph.call_function(torch.ops.aten.sin.default, (x,))
    b = graph.call_function(torch.ops.aten.cos.default, (a,))
    p = graph.call_module("fused_0", (a,))
    q = graph.call_function(operator.getitem, (p, 0))
    graph.output((b, q))
    val = torch.empty_strided((2, 3), (1, 2))
    a.meta["val"] = val
    b.meta["val"] = torch.empty(2, 3)

    class Root(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fused_0 = torch.nn.Identity()

    gm = torch.fx.GraphModule(Root(), graph)
    assert layouts.guard_eager_layouts(gm, {"fused_0"}) == 1
    guards = [n for n in gm.graph.nodes if n.target is layouts.match_layout]
    assert len(guards) == 1 and guards[0].args == (a, (2, 3), (1, 2))
    assert b.args[0] is guards[0] and p.args[0] is a  # the partition reads the real result


def test_a_partition_braze_cannot_compile_runs_in_eager_alone(monkeypatch):
    """One partition that fails to compile leaves its own ops to eager; the graph's other
    partitions stay compiled and no call runs the whole graph in eager."""
    real = braze.backend._compile_whole

    def compile_whole(gm, opts, device=None, args=None, **kw):
        if any(n.target is torch.ops.aten.exp.default for n in gm.graph.nodes):
            raise braze.CompileError("not this partition, in this test")
        return real(gm, opts, device, args)
    monkeypatch.setattr(braze.backend, "_compile_whole", compile_whole)

    def fn(x):
        y = row_major_but_fake_column_major(x.exp() + 1)
        return (y * 3).sum(0), y.cos()

    x = torch.randn(5, 4)
    before, ops_before = braze.counters(), braze.fallback_ops_by_op()
    got = torch.compile(fn, backend="braze")(x)
    torch.testing.assert_close(got, fn(x))
    after = braze.counters()
    assert after["fallback_graphs"] == before["fallback_graphs"]
    assert after["partitions"] - before["partitions"] == 1
    moved = {op for op, n in braze.fallback_ops_by_op().items() if n != ops_before.get(op, 0)}
    assert moved == {"braze_test.row_major_but_fake_column_major.default",
                     "aten.exp.default", "aten.add.Tensor"}


def test_cpu_constants_move_with_the_graph_to_its_device():
    """A constant Dynamo made on the CPU (an index tensor built inside the user's function) in
    a graph on another device moves there, with its meta values, so that the ops reading it
    compile instead of running in eager (the meta device stands in for CUDA here)."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    const = graph.get_attr("consts.index")
    copy = graph.call_function(torch.ops.aten.lift_fresh_copy.default, (const,))
    graph.output(graph.call_function(torch.ops.aten.index.Tensor, (x, [copy])))
    root = torch.nn.Module()
    root.consts = torch.nn.Module()
    root.consts.index = torch.tensor([1, 0])
    const.meta["val"] = copy.meta["val"] = root.consts.index
    gm = torch.fx.GraphModule(root, graph)
    meta = torch.device("meta")
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    with FakeTensorMode():  # as AOTAutograd calls the compiler: the copy must still be real
        assert braze.devices.constants_to_device(gm, meta) == 1
    assert gm.consts.index.device == meta and not isinstance(gm.consts.index, FakeTensor)
    assert const.meta["val"].device == meta and copy.meta["val"].device == meta
    assert braze.devices.constants_to_device(gm, meta) == 0


def test_an_output_viewing_an_argument_by_a_symbolic_size_is_a_view_of_it():
    """A view of an argument whose sizes are symbolic (an expand to another input's length) is
    made at each call with that call's sizes, as a view: AOTAutograd regenerates an output
    aliasing an input from its strides, so a computed copy would be wrong, and braze's call
    used to fail there and run eager."""
    f = torch.compile(lambda x, y: (x.expand(y.shape[0], -1), y * 2), backend="braze",
                      dynamic=True)
    before = braze.counters()
    for m in (3, 5, 7):
        x, y = torch.randn(1, 4), torch.randn(m)
        a, b = f(x, y)
        assert torch.equal(a, x.expand(m, -1)) and torch.equal(b, y * 2)
        assert a.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    after = braze.counters()
    assert after["fallback_graphs"] == before["fallback_graphs"]
    assert after["fallback_ops"] == before["fallback_ops"]


@pytest.mark.parametrize("split", ["unbind", "split", "split_with_sizes"])
def test_outputs_that_view_a_computed_value_share_it_as_in_eager(split):
    """A returned K/V cache sliced from a fused projection (a strided view, not a dense tensor)
    is made as that view of the projection, which braze computes as an output of its own: the
    slices share one storage and have eager's strides, and no copy is made. An expanded
    computed value is returned expanded."""
    def f(x, w, b):
        qkv = x @ w + b
        if split == "unbind":
            q, k, v = qkv.view(2, 8, 3, 4, 16).unbind(2)
        elif split == "split":
            q, k, v = (t.view(2, 8, 4, 16) for t in qkv.view(2, 8, 192).split(64, dim=2))
        else:
            q, k, v = (t.reshape(2, 8, 4, 16)
                       for t in qkv.view(2, 8, 192).split_with_sizes([64, 64, 64], dim=2))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        y = torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1) @ v
        return y, k, v, (b * 2).unsqueeze(0).expand(16, 192)

    torch.manual_seed(0)
    x, w, b = torch.randn(16, 64), torch.randn(64, 192), torch.randn(192)
    torch._dynamo.reset()
    g = torch.compile(f, backend="braze", options={"strict": True})
    with torch.no_grad():
        got, want = g(x, w, b), f(x, w, b)
    for a, e in zip(got, want):
        assert a.shape == e.shape and a.stride() == e.stride()
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)
    assert got[1].untyped_storage().data_ptr() == got[2].untyped_storage().data_ptr()


def test_outputs_after_a_view_of_an_argument_keep_their_dtypes(device):
    """A graph whose first output views an argument (made at each call, not compiled) and whose
    later outputs have other dtypes (a training forward's saved random seeds): each compiled
    output is allocated with its own dtype."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, i):
        return x.t(), i + 1, x * 2, (x > 0).sum(0)

    x, i = torch.randn(4, 5), torch.randint(0, 9, (3,))
    gm = make_fx(f)(x, i)
    fn, _ = braze.backend._compile_whole(gm, braze.backend.Options(),
                                         device=x.device if device == "cuda" else None)
    for got, want in zip(fn(x, i), f(x, i)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)


def test_outputs_that_share_memory_in_eager_share_it(device):
    """Outputs that are one value and views of it (an activation a training forward saves
    twice, beside its transpose and its reshape) are one computed buffer and views of it, as in
    eager, not a copy each; an argument returned as it is (a saved weight) is the argument,
    on CUDA too."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w):
        y = torch.relu(x @ w)
        return y, y.t(), y.view(-1), y, w, x * 2

    x, w = torch.randn(6, 4), torch.randn(4, 5)
    gm = make_fx(f, tracing_mode="fake")(x, w)
    fn, _ = braze.backend._compile_whole(gm, braze.backend.Options(),
                                         device=x.device if device == "cuda" else None)
    got = fn(x, w)
    for a, e in zip(got, f(x, w)):
        assert a.shape == e.shape and a.stride() == e.stride()
        torch.testing.assert_close(a, e)
    ptr = got[0].untyped_storage().data_ptr()
    assert all(g.untyped_storage().data_ptr() == ptr for g in got[1:4])
    assert got[4].untyped_storage().data_ptr() == w.untyped_storage().data_ptr()
    assert got[5].untyped_storage().data_ptr() not in (ptr, x.untyped_storage().data_ptr())


def test_training_with_a_tied_weight_matches_eager():
    """A language-model head tied to the embedding: the forward saves the transposed weight
    for the backward as a view of the weight; loss and gradients match eager's."""
    torch.manual_seed(0)

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(97, 16)
            self.ln = torch.nn.LayerNorm(16)

        def forward(self, ids):
            h = self.ln(self.emb(ids))
            return torch.nn.functional.cross_entropy((h @ self.emb.weight.t()).flatten(0, 1),
                                                     ids.flatten())

    m = Tied()
    ids = torch.randint(0, 97, (2, 8))
    want = m(ids)
    want.backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    torch._dynamo.reset()
    got = torch.compile(m, backend="braze")(ids)
    got.backward()
    torch.testing.assert_close(got, want)
    for p, gw in zip(m.parameters(), grads):
        torch.testing.assert_close(p.grad, gw)


def test_training_saves_logits_not_their_log_softmax():
    """A cross-entropy loss in training: the forward writes no log-softmax; the backward
    recomputes it from the logits and per-row statistics (min-cut partition), so the one
    [tokens, vocabulary] tensor saved for the backward is the logits themselves. Loss and
    gradients match eager."""
    torch.manual_seed(1)
    lin = torch.nn.Linear(64, 5000)
    x, t = torch.randn(32, 64), torch.randint(0, 5000, (32,))

    def loss(x, t):
        return torch.nn.functional.cross_entropy(lin(x), t)

    want = loss(x, t)
    want.backward()
    grads = [p.grad.clone() for p in lin.parameters()]
    lin.zero_grad()
    saved = []

    def pack(v):
        saved.append(v)
        return v

    torch._dynamo.reset()
    compiled = torch.compile(loss, backend="braze")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda v: v):
        got = compiled(x, t)
    got.backward()
    wide = [v for v in saved if tuple(v.shape) == (32, 5000)]
    assert len(wide) == 1
    torch.testing.assert_close(wide[0], lin(x).detach())
    torch.testing.assert_close(got, want)
    for p, gw in zip(lin.parameters(), grads):
        torch.testing.assert_close(p.grad, gw)


def test_partitioned_calls_free_each_argument_after_its_last_reader(device):
    """A partitioned graph takes AOTAutograd's boxed call (one list of arguments, which it
    empties): an argument that only the first partition reads (a saved activation in a
    backward) is freed before the eager op that follows it runs, not held to the end."""
    import weakref
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(a, b):
        return (probe_argument(torch.tanh(a) * 2) + b,)

    a, b = torch.randn(64, 32, device=device), torch.randn(64, 32, device=device)
    gm = make_fx(f, tracing_mode="fake")(a, b)
    fn = braze.backend._compile_fx(gm, [a, b], braze.backend.Options(cuda_graphs=False))
    assert getattr(fn, "_boxed_call", False)
    want = f(a, b)
    args = [a.clone(), b]
    _probed["ref"] = weakref.ref(args[0])
    del a
    got = fn(args)
    assert args == [] and _probed["alive"] is False
    torch.testing.assert_close(got[0], want[0])


def test_partitions_follow_the_graph_order_around_eager_ops():
    """A product that reads only what comes before an eager op (a layer's weight gradient in a
    backward) is computed in the partition before that op, so what it reads can die there; fx's
    CapabilityBasedPartitioner merged it into the last partition. Neighbouring runs with no
    path between them through an eager op are one partition."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from braze import partition

    def f(x, w1, w2):
        h = torch.tanh(x @ w1)
        gw = h.t() @ h
        e = plain_eager(h)
        return e @ w2, gw, torch.relu(x) * 3

    x, w1, w2 = torch.randn(8, 4), torch.randn(4, 4), torch.randn(4, 4)
    gm = make_fx(f)(x, w1, w2)
    eager = {n: "eager" for n in gm.graph.nodes if "plain_eager" in str(n.target)}
    parts = partition.propose(gm, eager)
    mms = [n for n in gm.graph.nodes if n.target is torch.ops.aten.mm.default]
    assert len(parts) == 2
    assert mms[0] in parts[0] and mms[1] in parts[0] and mms[2] in parts[1]
    relu = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.relu.default)
    assert relu in parts[1]  # after the eager op in graph order, merged with its neighbour
    fn = braze.backend._compile_fx(gm, [x, w1, w2], braze.backend.Options(cuda_graphs=False))
    for got, want in zip(fn([x, w1, w2]), f(x, w1, w2)):
        torch.testing.assert_close(got, want)

    def g(x):
        a = x * 2
        e = plain_eager(x)  # reads no partition's result: the runs around it are one
        return a + 1, e * a

    gm = make_fx(g)(x)
    eager = {n: "eager" for n in gm.graph.nodes if "plain_eager" in str(n.target)}
    assert [len(p) for p in partition.propose(gm, eager)] == [3]

    def h(x):
        a = x * 2
        e = plain_eager(a)  # reads the partition that continues after it
        return e, x + 1

    # The eager op comes before the call of the one partition it reads; fuse moves it after.
    gm = make_fx(h)(x)
    eager = {n: "eager" for n in gm.graph.nodes if "plain_eager" in str(n.target)}
    assert [len(p) for p in partition.propose(gm, eager)] == [2]
    fn = braze.backend._compile_fx(gm, [x], braze.backend.Options(cuda_graphs=False, strict=True))
    for got, want in zip(fn([x]), h(x)):
        torch.testing.assert_close(got, want)


def test_a_large_product_read_after_an_eager_op_runs_in_the_later_partition():
    """A product read only after an eager op moves past it when its result is larger than twice
    what the move keeps alive longer: a tied embedding's output-layer gradient in a backward
    (the incoming gradient, which the autograd call holds anyway, times a small activation) is
    computed where the embedding's gradient is summed into it, not beside every saved
    activation. A product whose operands die with it, and are larger than it, stays."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from braze import partition

    def f(tangents, h, x):
        gw = tangents.t() @ h  # [8192, 64]: 2 MiB from a held 1 MiB gradient and 8 KiB of h
        e = plain_eager(torch.tanh(x))
        return gw + e.mean(), e

    args = [torch.randn(32, 8192), torch.randn(32, 64), torch.randn(16, 16)]
    gm = make_fx(f)(*args)
    eager = {n: "eager" for n in gm.graph.nodes if "plain_eager" in str(n.target)}
    mm = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.mm.default)
    op = next(iter(eager))
    assert list(gm.graph.nodes).index(mm) < list(gm.graph.nodes).index(op)
    assert partition.sink_large_products(gm, eager)
    assert list(gm.graph.nodes).index(mm) > list(gm.graph.nodes).index(op)
    parts = partition.propose(gm, eager)
    assert len(parts) == 2 and mm in parts[1]
    fn = braze.backend._compile_fx(gm, args, braze.backend.Options(cuda_graphs=False),
                                   forward=False)
    for got, want in zip(fn(list(args)), f(*args)):
        torch.testing.assert_close(got, want)

    def g(tangents, a, b, x):
        p = a @ b  # 1 MiB from 2 MiB + 2 MiB that die with it
        e = plain_eager(x)
        return p + e.mean(), tangents * 2

    gm = make_fx(g)(torch.randn(4), torch.randn(512, 1024), torch.randn(1024, 512),
                    torch.randn(4))
    eager = {n: "eager" for n in gm.graph.nodes if "plain_eager" in str(n.target)}
    assert not partition.sink_large_products(gm, eager)

    def k(tangents, g, a, x):
        w = g.t() @ a  # 8 MiB; g (16 MiB) is read again below, but only before the eager op
        s = g.sum(0)
        e = plain_eager(x)
        return w + e.mean(), s, tangents * 2

    gm = make_fx(k)(torch.randn(4), torch.randn(1024, 4096), torch.randn(1024, 512),
                    torch.randn(4))
    eager = {n: "eager" for n in gm.graph.nodes if "plain_eager" in str(n.target)}
    assert not partition.sink_large_products(gm, eager)


def test_a_graph_that_mixes_the_cpu_and_cuda_compiles_its_cuda_part(device):
    """A CUDA graph with some tensors on the CPU (a CPU input, a CPU factory op, a copy to the
    GPU): the nodes that read or make CPU tensors run in eager between partitions, counted as
    fallback ops, and the rest compiles; it is not replayed as a CUDA graph, since a replay
    would not run its CPU ops. A constant that only a CPU op reads, or that the graph returns,
    stays on the CPU."""
    if device != "cuda":
        pytest.skip("a graph on a CUDA device")
    torch.manual_seed(5)
    steps = torch.tensor([1.0, 2.0, 3.0], device="cpu")

    def fn(x, c):
        on_cpu = (c * 2 + torch.arange(3, device="cpu")) * steps  # CPU ops, a CPU constant
        y = (x.sin() + 1) * on_cpu.to(x.device)
        return y.exp(), on_cpu, torch.tensor([0.5, 1.5], device="cpu")

    x, c = torch.randn(4, 3, device="cuda"), torch.randn(3, device="cpu")
    before = braze.counters()
    compiled = torch.compile(fn, backend="braze")
    for _ in range(3):  # the later calls are where a CUDA graph would be replayed
        c = torch.randn(3, device="cpu")
        got, want = compiled(x, c), fn(x, c)
        for g, w in zip(got, want):
            assert g.device == w.device
            torch.testing.assert_close(g, w)
    after = braze.counters()
    assert after["fallback_graphs"] == before["fallback_graphs"]
    assert after["fallback_ops"] > before["fallback_ops"]
    assert after["graphs_compiled"] > before["graphs_compiled"]
    assert after["cuda_graphs"] == before["cuda_graphs"]


def test_a_cpu_scalar_read_by_cuda_ops_moves_with_each_call(device):
    """A 0-d CPU tensor argument that only CUDA ops read (transformers' static cache keeps its
    length on the CPU until its first write copies it to the GPU, in the graph) is moved to
    the device at each call: the graph compiles whole, with no op left to eager, is replayed
    as a CUDA graph, and each call reads its own value."""
    if device != "cuda":
        pytest.skip("a graph on a CUDA device")
    torch.manual_seed(6)

    def fn(x, n, m):
        return x * n.to(x.device) + n, (x + 1) * 2 + m

    x = torch.randn(64, 32, device="cuda")
    before = braze.counters()
    compiled = torch.compile(fn, backend="braze", mode="reduce-overhead")
    for k in range(4):
        n = torch.tensor(float(k) + 0.5)
        m = torch.tensor(float(k) - 2)
        got, want = compiled(x, n, m), fn(x, n, m)
        for g, w in zip(got, want):
            assert g.device == w.device
            torch.testing.assert_close(g, w)
    after = braze.counters()
    assert after["fallback_graphs"] == before["fallback_graphs"]
    assert after["fallback_ops"] == before["fallback_ops"]
    assert after["cuda_graph_replays"] > before["cuda_graph_replays"]
