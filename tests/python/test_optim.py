"""Optimizer steps compile: torch.compile(optimizer.step) with the multi-tensor (foreach)
implementations of SGD, Adam and AdamW, and gradient clipping, give eager's parameters and
state after several steps with no op left to eager."""
import pytest
import torch

import braze


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.GELU(), torch.nn.Linear(48, 8))


# On CUDA, Adam keeps its step counts on the device (capturable): otherwise they are CPU
# tensors, whose ops a CUDA graph leaves to eager.
OPTIMIZERS = {
    "sgd-momentum": lambda p, cuda: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-3,
                                                    foreach=True),
    "sgd-nesterov": lambda p, cuda: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True,
                                                    foreach=True),
    "adam": lambda p, cuda: torch.optim.Adam(p, lr=1e-2, foreach=True, capturable=cuda),
    "adam-amsgrad": lambda p, cuda: torch.optim.Adam(p, lr=1e-2, amsgrad=True, weight_decay=1e-2,
                                                     foreach=True, capturable=cuda),
    "adam-decay": lambda p, cuda: torch.optim.Adam(p, lr=1e-2, weight_decay=1e-2, foreach=True,
                                                   capturable=cuda),
    "adamw": lambda p, cuda: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, foreach=True,
                                               capturable=cuda),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_compiled_optimizer_step_matches_eager(name, device):
    models = [_model().to(device), _model().to(device)]
    opts = [OPTIMIZERS[name](m.parameters(), device == "cuda") for m in models]
    step = torch.compile(opts[1].step, backend="braze")
    before = braze.counters()
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        x = torch.randn(16, 24, generator=g, device="cpu").to(device)
        for k, (m, o) in enumerate(zip(models, opts)):
            m.zero_grad()
            m(x).square().mean().backward()
            if k == 0:
                o.step()
            else:
                step()
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    for pa, pb in zip(models[0].parameters(), models[1].parameters()):
        for key, va in opts[0].state[pa].items():
            torch.testing.assert_close(opts[1].state[pb][key], va, rtol=1e-5, atol=1e-6)
    now = braze.counters()
    assert now["graphs"] > before["graphs"]
    assert now["fallback_ops"] == before["fallback_ops"], braze.fallback_ops_by_op()
    assert now["fallback_graphs"] == before["fallback_graphs"]
    # Parameters, moments and step counts updated in place; with Adam's weight decay the
    # gradient the moments read is the parameter's function too.
    if name in ("adam", "adam-decay", "adamw"):
        assert now["inputs_copied_back"] == before["inputs_copied_back"]
        assert now["inputs_written_in_place"] > before["inputs_written_in_place"]


def test_cpu_adamw_step_is_one_pass_per_parameter(device):
    """On the CPU each parameter's m, v and update are computed in one pass over its memory:
    one kernel per parameter size after the step counts' scalar kernel, however many sizes
    the step interleaves, and parameters of one size as loops of their own in that kernel."""
    import re
    if device != "cpu":
        pytest.skip("the CPU schedule (CUDA keeps program order)")
    torch.manual_seed(0)
    shapes = [(n, 3) for n in range(5, 15)] + [(5, 3), (7, 3)]  # 10 sizes, two of them twice
    params = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p)
    want = [p.detach().clone() for p in params]
    ref = torch.optim.AdamW([torch.nn.Parameter(w) for w in want], lr=1e-2, weight_decay=0.1,
                            foreach=True)
    for r, p in zip(ref.param_groups[0]["params"], params):
        r.grad = p.grad.clone()
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, foreach=True)
    _, sources = braze.run_and_get_code(torch.compile(opt.step, backend="braze"))
    ref.step()
    for p, w in zip(params, ref.param_groups[0]["params"]):
        torch.testing.assert_close(p, w, rtol=1e-6, atol=1e-6)
    kernels = re.findall(r"static void kernel\d+\(.*?\n}\n", sources[0], re.S)
    assert len(kernels) == 11
    sizes = [15, 21]  # the sizes of two parameters each
    for k in kernels[1:]:
        extent = int(re.search(r"x0 < INT64_C\((\d+)\)", k).group(1))
        count = 2 if extent in sizes else 1
        assert len(re.findall(r"b\d+\[x0\] =", k)) == 3 * count  # m, v and the parameter
        assert k.count("#pragma omp for simd nowait") == (count if count > 1 else 0)


def test_foreach_ops_with_lists_of_scalars_and_reductions(device):
    """Each _foreach_ overload applies its op per tensor, with the i-th scalar of a scalar list;
    norms reduce each tensor (gradient clipping's _foreach_norm)."""
    torch.manual_seed(2)
    xs = [torch.randn(5, 3, device=device), torch.randn(7, device=device)]
    ys = [torch.rand(5, 3, device=device) + 0.5, torch.rand(7, device=device) + 0.5]

    def f(xs, ys):
        a = torch._foreach_add(xs, ys, alpha=2)
        b = torch._foreach_mul(xs, [3.0, -1.5])
        c = torch._foreach_pow(2.0, ys)
        d = torch._foreach_norm(xs, 3)
        e = torch._foreach_maximum(xs, 0.25)
        h = torch._foreach_lerp(xs, ys, 0.3)
        k = torch._foreach_addcdiv(xs, xs, ys, [0.5, 2.0])
        return [*a, *b, *c, *d, *e, *h, *k]

    before = braze.counters()
    got = torch.compile(f, backend="braze")(xs, ys)
    for g, w in zip(got, f(xs, ys)):
        torch.testing.assert_close(g, w)
    assert braze.counters()["fallback_ops"] == before["fallback_ops"], braze.fallback_ops_by_op()


def test_gradient_clipping_compiles(device):
    m = _model().to(device)
    x = torch.randn(16, 24, device=device)
    m(x).square().sum().backward()
    grads = [p.grad.clone() for p in m.parameters()]

    def clip():
        return torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5, foreach=True)

    before = braze.counters()
    total = torch.compile(clip, backend="braze")()
    want = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    torch.testing.assert_close(total, want)
    scale = min(1.0, 0.5 / (float(want) + 1e-6))
    for p, g in zip(m.parameters(), grads):
        torch.testing.assert_close(p.grad, g * scale, rtol=1e-5, atol=1e-6)
    assert braze.counters()["fallback_ops"] == before["fallback_ops"], braze.fallback_ops_by_op()


def _decompose_cos_with(monkeypatch, decomposition):
    """braze's decomposition table with `decomposition` for aten.cos, and a fresh Dynamo."""
    from braze import decompositions
    table = dict(decompositions.table())
    table[torch.ops.aten.cos.default] = decomposition
    monkeypatch.setattr(decompositions, "table", lambda training=False: dict(table))
    torch._dynamo.reset()


@pytest.mark.graph_fallback("a trace that fails runs the graph in eager")
@pytest.mark.cpu_only("the guard is around tracing, the same on every device")
def test_a_failed_trace_runs_the_graph_in_eager(monkeypatch):
    """A decomposition that fails while AOTAutograd traces the graph: the graph runs in eager,
    counted and said, never an error in the user's program."""
    def broken(*args, **kwargs):
        raise RuntimeError("a broken decomposition")

    _decompose_cos_with(monkeypatch, broken)
    before = braze.counters()
    x = torch.randn(8)
    with pytest.warns(UserWarning, match="tracing for braze failed"):
        out = torch.compile(lambda x: x.cos() * 2, backend="braze")(x)
    torch.testing.assert_close(out, x.cos() * 2)
    assert braze.counters()["fallback_graphs"] == before["fallback_graphs"] + 1


@pytest.mark.cpu_only("the guard is around tracing, the same on every device")
def test_exceptions_dynamo_acts_on_are_not_taken_for_failures(monkeypatch):
    """An exception Dynamo expects from a backend and acts on itself (here a data-dependent
    output, on which it breaks the graph) passes through braze's guard around tracing: it is
    not counted as a graph braze ran in eager, and the program still runs."""
    from torch._subclasses.fake_tensor import DataDependentOutputException

    def data_dependent(*args, **kwargs):
        raise DataDependentOutputException(torch.ops.aten.cos.default)

    _decompose_cos_with(monkeypatch, data_dependent)
    before = braze.counters()
    x = torch.randn(8)
    out = torch.compile(lambda x: x.cos() * 2, backend="braze")(x)
    torch.testing.assert_close(out, x.cos() * 2)
    assert braze.counters()["fallback_graphs"] == before["fallback_graphs"]
