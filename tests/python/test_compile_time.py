"""Where compile time goes, and the work braze does not repeat: the per-stage split, support
decided once per distinct node, partitions compiled on a thread pool."""
import pytest
import torch

import braze
from braze import backend, support
from braze.fx_import import Translator


@pytest.mark.cpu_only("the split is the same on every device; this checks its bookkeeping")
def test_compile_times_split_and_log(monkeypatch, capfd):
    monkeypatch.setenv("BRAZE_LOG", "compile_time")
    before = braze.compile_times()
    f = torch.compile(lambda x: (x * 3).tanh().sum(-1), backend="braze")
    x = torch.randn(8, 8)
    torch.testing.assert_close(f(x), (x * 3).tanh().sum(-1))
    after = braze.compile_times()
    for stage in ("support", "lower", "host_compile", "load", "python", "total"):
        assert after.get(stage, 0) >= before.get(stage, 0), stage
    assert after["total"] > before.get("total", 0)
    err = capfd.readouterr().err
    assert "===== braze: compile_time =====" in err and "host_compile" in err


@pytest.mark.cpu_only("support is decided before any device code exists")
def test_a_graph_braze_takes_whole_is_translated_once(monkeypatch):
    """When braze takes every node, the translation that decides support is the one that
    compiles: each node is translated once, and no node alone."""
    translated, tried = [], []
    original = Translator.translate
    monkeypatch.setattr(Translator, "translate",
                        lambda t, node: translated.append(node.name) or original(t, node))
    monkeypatch.setattr(support, "try_node", lambda node, *a, **k: tried.append(node))

    def layers(x, w):
        for _ in range(3):
            x = torch.relu(x @ w) * 0.5
        return x

    x, w = torch.randn(4, 16), torch.randn(16, 16)
    torch.testing.assert_close(torch.compile(layers, backend="braze")(x, w), layers(x, w))
    assert len(translated) == 9 and len(set(translated)) == 9 and tried == []


@torch.library.custom_op("braze_test::eager_double", mutates_args=())
def eager_double(x: torch.Tensor) -> torch.Tensor:
    """An op braze has no rule for: it runs in eager."""
    return x * 2


@eager_double.register_fake
def _(x):
    return torch.empty_like(x)


@pytest.mark.cpu_only("support is decided before any device code exists")
def test_repeated_nodes_are_tried_once(monkeypatch):
    """A graph with a node braze refuses is searched node by node; nodes that repeat are
    translated alone once."""
    tried = []
    original = support.try_node
    monkeypatch.setattr(support, "try_node",
                        lambda node, *a, **k: tried.append(node) or original(node, *a, **k))
    support._cache.clear()

    def layers(x, w):
        for _ in range(6):
            x = torch.relu(x @ w) * 0.5
        return eager_double(x)

    x, w = torch.randn(4, 16), torch.randn(16, 16)
    torch.testing.assert_close(torch.compile(layers, backend="braze")(x, w), layers(x, w))
    # mm, relu and mul, each tried once for the six layers
    assert 3 <= len(tried) <= 4, [n.format_node() for n in tried]


def test_partitions_compiled_on_threads_match_eager():
    def f(x, w):
        for _ in range(3):
            x = torch.linalg.inv(x @ w + torch.eye(16, device=x.device) * 4)  # eager between
            x = (x @ w).relu().sin() + x.cos()
        return x

    x, w = torch.randn(16, 16), torch.randn(16, 16) / 4
    before = braze.counters()
    got = torch.compile(f, backend="braze")(x, w)
    torch.testing.assert_close(got, f(x, w), rtol=1e-4, atol=1e-4)
    assert braze.counters()["partitions"] - before["partitions"] >= 3


@pytest.mark.cpu_only("support is decided before any device code exists")
def test_support_is_a_query_that_does_not_lower(monkeypatch):
    """The partitioner asks braze::supports, which verifies the node's graph without lowering
    it: the lowering trial never runs for a graph that compiles."""
    lowered, original = [], support.try_node

    def try_node(node, device=None, trial=False):
        if trial:
            lowered.append(node)
        return original(node, device, trial)

    monkeypatch.setattr(support, "try_node", try_node)
    support._cache.clear()

    def f(x):
        return (x.exp() * 2).sum(-1)

    x = torch.randn(8, 8)
    torch.testing.assert_close(torch.compile(f, backend="braze")(x), f(x))
    assert lowered == []


def test_supports_names_what_the_target_cannot_generate():
    """Special functions generate on both targets. A half-precision transposed convolution of
    more than 64 taps is refused where it would round after each tap (eager's CPU kernel without
    oneDNN), and accepted on CUDA or where oneDNN runs it."""
    g = braze._C.Graph()
    x = g.input("x", "f32", [g.sym_const(4)], [])
    g.output([g.elementwise(braze._C.OpKind.Digamma, [x])])
    assert g.supports(cuda=False) == (True, "")
    assert g.supports(cuda=True) == (True, "")

    g = braze._C.Graph()
    c = g.sym_const
    x = g.input("x", "f16", [c(1), c(2), c(5), c(5)], [])
    w = g.input("w", "f16", [c(2), c(3), c(9), c(9)], [])
    g.output([g.conv_transpose(x, w, None, [1, 1], [0, 0], [1, 1], [0, 0], 1)])
    ok, why = g.supports(cuda=False)
    assert not ok and "81 kernel taps" in why
    assert g.supports(cuda=True) == (True, "")
    assert g.supports(cuda=False, one_dnn_half=["f16"]) == (True, "")


@pytest.mark.cpu_only("the recovery is device-independent bookkeeping")
def test_nodes_that_fail_together_are_found_by_the_trial(monkeypatch):
    """When every node is supported alone but the whole graph fails to compile, the nodes that
    fail the lowering trial run in eager PyTorch and the rest stays compiled."""
    original_try, original_whole = support.try_node, backend._compile_whole

    def try_node(node, device=None, trial=False):
        if trial and node.target is torch.ops.aten.sin.default:
            return False, "refused by the trial"
        return original_try(node, device, trial)

    def compile_whole(gm, *a, **k):
        if any(n.target is torch.ops.aten.sin.default for n in gm.graph.nodes):
            raise braze._C.CompileError("sin does not compile here")
        return original_whole(gm, *a, **k)

    monkeypatch.setattr(support, "try_node", try_node)
    monkeypatch.setattr(backend, "_compile_whole", compile_whole)
    support._cache.clear()

    def f(x):
        return (x.exp() * 2).sin() + 1

    x = torch.randn(8, 8)
    before = braze.counters()
    torch.testing.assert_close(torch.compile(f, backend="braze")(x), f(x))
    after = braze.counters()
    assert after["fallback_ops"] - before["fallback_ops"] == 1
    assert after["fallback_graphs"] == before["fallback_graphs"]
    assert after["partitions"] - before["partitions"] == 2


def _loss(x, w1, w2):
    return ((x @ w1).tanh() @ w2).square().mean()


def _weights():
    torch.manual_seed(0)
    return (torch.randn(8, 16), torch.randn(16, 16, requires_grad=True),
            torch.randn(16, 4, requires_grad=True))


def _step(f, x, w1, w2):
    """One training step's loss and gradients (cleared after)."""
    loss = f(x, w1, w2)
    loss.backward()
    out = (loss.detach(), w1.grad.clone(), w2.grad.clone())
    w1.grad = w2.grad = None
    return out


@pytest.mark.parametrize("early", [True, False, None])
def test_backward_compiles_in_the_background_from_the_forward(monkeypatch, device, early):
    """With Options.early_backward (by default on CUDA) a training graph's backward is handed
    over with its forward and compiles on a background thread while the forward runs; the first
    backward call waits for it. Off (by default on the CPU), AOTAutograd compiles it at the
    first backward call."""
    if early is None:
        early_here = device == "cuda"
    else:
        early_here = early
    handed = []
    original = backend._compile_early
    monkeypatch.setattr(backend, "_compile_early",
                        lambda *a, **k: handed.append(a[0]) or original(*a, **k))
    x, w1, w2 = _weights()
    want = _step(_loss, x, w1, w2)
    times = braze.compile_times()
    before = braze.counters()
    f = torch.compile(_loss, backend="braze", options={"early_backward": early})
    loss = f(x, w1, w2)
    assert len(handed) == (1 if early_here else 0)  # before any backward call
    loss.backward()
    got = (loss.detach(), w1.grad.clone(), w2.grad.clone())
    w1.grad = w2.grad = None
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    after = braze.counters()
    assert after["graphs"] - before["graphs"] == 2
    assert after["fallback_graphs"] == before["fallback_graphs"]
    now = braze.compile_times()
    assert (now.get("background", 0) > times.get("background", 0)) == early_here
    for _ in range(2):  # later steps use the compiled backward
        torch.testing.assert_close(_step(f, x, w1, w2), want, rtol=1e-5, atol=1e-6)


@pytest.mark.graph_fallback("the backward that fails runs in eager")
@pytest.mark.cpu_only("the background compile's errors are device-independent bookkeeping")
@pytest.mark.parametrize("strict", [False, True])
def test_a_backward_that_fails_in_the_background(monkeypatch, strict):
    """A backward graph that fails to compile on the background thread runs in eager PyTorch,
    counted and with a warning, as it would have at its first call; with strict=True its error
    is raised by the backward call."""
    import threading
    original = backend._compile_whole

    def compile_whole(gm, *a, **k):
        if threading.current_thread().name.startswith("braze-backward"):
            raise braze.CompileError("the backward does not compile here")
        return original(gm, *a, **k)

    monkeypatch.setattr(backend, "_compile_whole", compile_whole)
    x, w1, w2 = _weights()
    want = _step(_loss, x, w1, w2)
    before = braze.counters()
    f = torch.compile(_loss, backend="braze", options={"strict": strict, "early_backward": True})
    if strict:
        loss = f(x, w1, w2)
        with pytest.raises(braze.CompileError, match="the backward does not compile here"):
            loss.backward()
        return
    # The warning comes from the background thread, by the time the backward call returns.
    with pytest.warns(UserWarning, match="the backward does not compile here"):
        loss = f(x, w1, w2)
        loss.backward()
    got = (loss.detach(), w1.grad.clone(), w2.grad.clone())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert braze.counters()["fallback_graphs"] - before["fallback_graphs"] == 1
