"""Static CUDA graphs are replayed as CUDA graphs, and the replayed results equal the uncaptured
ones: with random ops in training, with an eager op between braze partitions, with inputs at new
addresses, and with outputs still held while the next call runs."""
import pytest
import torch
import torch.nn.functional as F

import braze

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.fixture(autouse=True)
def cuda_only(device):
    if device != "cuda":
        pytest.skip("CUDA graphs exist only on CUDA")


def compiled(fn, cuda_graphs=True, strict=True, **kw):
    options = {"cuda_graphs": cuda_graphs}
    if strict:
        options["strict"] = True
    return torch.compile(fn, backend="braze", options=options, **kw)


def delta(before):
    now = braze.counters()
    return {k: now[k] - before[k] for k in ("cuda_graphs", "cuda_graph_replays",
                                            "fallback_graphs")}


def logged(monkeypatch, copy_limit=None):
    """braze.cudagraphs' log lines, collected in the returned list (as if BRAZE_LOG=cudagraphs);
    with copy_limit, inputs of that many bytes and more count as large (read in place)."""
    from braze import cudagraphs
    said = []
    if copy_limit is not None:
        monkeypatch.setattr(cudagraphs, "_COPY_LIMIT_BYTES", copy_limit)
    monkeypatch.setattr(cudagraphs, "log", said.append)
    monkeypatch.setattr(cudagraphs, "logging", lambda: True)
    return said


class DropoutMlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 128)
        self.b = torch.nn.Linear(128, 32)

    def forward(self, x):
        h = F.dropout(F.gelu(self.a(x)), p=0.3, training=self.training)
        return F.dropout(self.b(h), p=0.1, training=self.training).square().mean()


def _train_steps(model, cuda_graphs, batches, seed=None, lr=0.0):
    """Loss and gradients of a training step of `model` (a fresh one, made after seeding) on
    each batch; `seed` reseeds before the first step (random ops); with `lr`, a plain gradient
    step updates the parameters in place after each."""
    torch.manual_seed(0)
    m = model().cuda().train()
    step = compiled(m, cuda_graphs)
    if seed is not None:
        torch.manual_seed(seed)
    history = []
    for x in batches:
        m.zero_grad(set_to_none=True)
        loss = step(x)
        loss.backward()
        history.append([loss.detach().clone()] + [p.grad.clone() for p in m.parameters()])
        if lr:
            with torch.no_grad():
                for p in m.parameters():
                    p -= lr * p.grad
    return history


def test_training_with_dropout_replays_equal_the_uncaptured_run():
    before = braze.counters()
    x = torch.randn(16, 64, device="cuda")
    captured = _train_steps(DropoutMlp, True, [x] * 4, seed=1)
    d = delta(before)
    assert d["cuda_graphs"] >= 2 and d["cuda_graph_replays"] >= 4, d  # forward and backward
    torch._dynamo.reset()
    plain = _train_steps(DropoutMlp, False, [x] * 4, seed=1)
    for step_c, step_p in zip(captured, plain):
        for c, p in zip(step_c, step_p):
            torch.testing.assert_close(c, p, rtol=0, atol=0)
    # dropout drew fresh masks per replay: the steps differ from one another
    assert not torch.equal(captured[1][0], captured[2][0])


class EmbeddingHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(100, 32)
        self.head = torch.nn.Linear(32, 100)

    def forward(self, ids):
        return F.cross_entropy(self.head(F.gelu(self.emb(ids))).flatten(0, 1), ids.flatten())


def test_a_forward_that_returns_its_input_for_the_backward_is_captured():
    # The forward saves its ids (copied into the capture per call) for the embedding's
    # backward: each replay hands the backward the caller's ids, not the capture's copy, so a
    # step with new ids at a new address computes its own gradients.
    batches = [torch.randint(0, 100, (4, 16), device="cuda") for _ in range(5)]
    before = braze.counters()
    captured = _train_steps(EmbeddingHead, True, batches)
    d = delta(before)
    assert d["cuda_graphs"] >= 2 and d["cuda_graph_replays"] >= 6, d  # forward and backward
    torch._dynamo.reset()
    plain = _train_steps(EmbeddingHead, False, batches)
    for step_c, step_p in zip(captured, plain):
        for c, p in zip(step_c, step_p):
            torch.testing.assert_close(c, p, rtol=1e-5, atol=1e-6)


def test_an_eager_op_between_partitions_is_captured_with_them():
    q, k, v = (torch.randn(2, 4, 64, 32, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def fn(q, k, v):
        o = F.scaled_dot_product_attention(q * 0.5, k, v, is_causal=True)
        return (o.float() * 2).relu()

    before = braze.counters()
    f = compiled(fn)
    outs = [f(q, k, v) for _ in range(5)]  # held: calls 2-4 capture, call 5 runs uncaptured
    d = delta(before)
    assert d["cuda_graphs"] == 3 and d["cuda_graph_replays"] == 3, d
    del outs
    outs = [f(q, k, v)]
    assert delta(before)["cuda_graph_replays"] == 4
    for o in outs:
        torch.testing.assert_close(o, fn(q, k, v), rtol=2e-2, atol=2e-2)


def test_inputs_at_new_addresses_and_held_outputs():
    w = torch.randn(32, 32, device="cuda")
    f = compiled(lambda x: torch.softmax(x @ w, -1) + x.sin())
    xs = [torch.randn(8, 32, device="cuda") for _ in range(6)]
    before = braze.counters()
    held = [f(x) for x in xs]  # every output is still held when the next call runs
    for x, y in zip(xs, held):
        torch.testing.assert_close(y, torch.softmax(x @ w, -1) + x.sin())
    d = delta(before)
    assert d["cuda_graphs"] == 3, d  # three captures, all busy afterwards: the rest uncaptured
    del held
    y = f(xs[0])  # a capture is free again
    torch.testing.assert_close(y, torch.softmax(xs[0] @ w, -1) + xs[0].sin())
    assert delta(before)["cuda_graph_replays"] == d["cuda_graph_replays"] + 1
    # a view of an output keeps its capture busy too
    before = braze.counters()
    first = f(xs[1])[:, :4]
    second = f(xs[2])
    third = f(xs[3])
    torch.testing.assert_close(first, (torch.softmax(xs[1] @ w, -1) + xs[1].sin())[:, :4])
    torch.testing.assert_close(second, torch.softmax(xs[2] @ w, -1) + xs[2].sin())
    torch.testing.assert_close(third, torch.softmax(xs[3] @ w, -1) + xs[3].sin())


class LogitsHead(torch.nn.Module):
    """A language model's shape: the loss and the logits, which the loss reads but the caller
    does not differentiate, so autograd hands the backward a new zero gradient for them at
    every call."""
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 256)
        self.b = torch.nn.Linear(256, 512)

    def forward(self, x):
        logits = self.b(F.gelu(self.a(x)))
        return logits.logsumexp(-1).mean(), logits


def test_a_zero_gradient_made_anew_per_backward_is_copied_from_the_first_capture(monkeypatch):
    """The logits' zero gradient (128 KiB, large here) is at a new address at every step. It
    moved between the backward's first two calls, so it is copied per call from the first
    capture: one capture for the forward and one for the backward, each replayed at every
    later step. Every step equals the uncaptured run's."""
    said = logged(monkeypatch, 64 << 10)
    x = torch.randn(64, 64, device="cuda")

    def steps(cuda_graphs):
        torch.manual_seed(0)
        m = LogitsHead().cuda().train()
        f = compiled(m, cuda_graphs)
        history, keep = [], []
        for step in range(16):
            m.zero_grad(set_to_none=True)
            loss, logits = f(x)
            loss.backward()
            history.append([loss.detach().clone()] + [p.grad.clone() for p in m.parameters()])
            # Memory that takes the freed zero gradient's block: the next one is elsewhere.
            keep.append(torch.empty_like(logits))
            # Held across the next call, the loss and logits would keep the forward's capture
            # busy: forward and backward would take a second capture each (double buffering).
            del loss, logits
        return history

    before, busy = braze.counters(), braze.counters()["cuda_graph_busy"]
    captured = steps(True)
    d = delta(before)
    moved = [m for m in said if "moved between its first two calls" in m]
    assert len(moved) == 1 and "(backward) copies inputs [" in moved[0], said
    assert d["cuda_graphs"] == 2 and d["cuda_graph_replays"] == 2 * 15, d
    assert braze.counters()["cuda_graph_busy"] == busy
    torch._dynamo.reset()
    plain = steps(False)
    for step_c, step_p in zip(captured, plain):
        for c, p in zip(step_c, step_p):
            torch.testing.assert_close(c, p, rtol=1e-5, atol=1e-6)


def test_a_large_input_that_starts_moving_later_is_copied_once_it_moves_at_most_calls(
        monkeypatch):
    """A large input (4 MiB, large here) at one address for the first two calls is read in
    place by the first capture. From the third call it is at a new address at every call: two
    more captures read it in place, and at the fifth call, before they paid off, it is copied
    per call from then on (a fourth capture, replayed at every later call). Each call's result
    equals eager's. The results of a call are dropped before the next: held, they would keep
    the capture busy, and the next call would take another (double buffering)."""
    said = logged(monkeypatch, 1 << 20)
    w = torch.randn(256, 256, device="cuda")

    def fn(x):
        h = (x @ w).relu()
        return h.sum(0) + (h * x.sin()).mean(0), (x @ w.t()).softmax(-1).amax(0)

    f = compiled(fn)
    big = torch.randn(4096, 256, device="cuda")
    held = []  # every input kept: a freed one's block would take the next at its address
    before = braze.counters()
    for call in range(16):
        x = big if call < 2 else big + call
        held.append(x)
        outs = f(x)
        for got, want in zip(outs, fn(x)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)
        del outs, got, want
    d = delta(before)
    moved = [m for m in said if "per call from now on" in m]
    assert len(moved) == 1 and "copies inputs [0] per call from now on" in moved[0], said
    assert not any("moved between its first two calls" in m for m in said), said
    # Every call from the second replays (a capture's own call included).
    assert d["cuda_graphs"] == 4 and d["cuda_graph_replays"] == 15, d


class Tower(torch.nn.Module):
    """Weights the backward reads (a linear layer's input gradient needs its weight) and a
    normalization's scale: the forward saves them, views of its parameters, for the backward."""
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 128)
        self.n = torch.nn.LayerNorm(128)
        self.b = torch.nn.Linear(128, 64)

    def forward(self, x):
        return self.b(F.gelu(self.n(self.a(x)))).square().mean()


def test_a_backward_reads_the_forwards_parameters_in_place(monkeypatch):
    """A backward graph's inputs are not marked static, but the weights its forward saved are
    the parameters the forward's capture reads in place: the backward reads them in place too
    and copies per call only the loss's gradient and the batch (saved for a's weight gradient).
    Parameters updated in place between steps (an optimizer) are read as they are then: every
    step equals the uncaptured run's."""
    from braze import cudagraphs
    said = []
    monkeypatch.setattr(cudagraphs, "log", said.append)
    batches = [torch.randn(32, 64, device="cuda") for _ in range(6)]
    captured = _train_steps(Tower, True, batches, lr=0.1)
    backward = [m for m in said if m.startswith("captured") and "(backward)" in m]
    assert backward and all(", 2 inputs copied per call" in m for m in backward), said
    torch._dynamo.reset()
    plain = _train_steps(Tower, False, batches, lr=0.1)
    for step_c, step_p in zip(captured, plain):
        for c, p in zip(step_c, step_p):
            torch.testing.assert_close(c, p, rtol=1e-5, atol=1e-6)


def test_the_log_says_why_a_graph_is_captured_again(monkeypatch):
    said = logged(monkeypatch)
    w = torch.randn(32, 32, device="cuda")
    f = compiled(lambda x: (x @ w).relu())
    x = torch.randn(8, 32, device="cuda")
    f(x)
    held = f(x)  # the first capture's output, still held at the next call
    f(x)
    again = [m for m in said if "captures again" in m]
    assert len(again) == 1, said
    assert "capture 1 cannot replay: its outputs are still in use (output 0" in again[0], again
    del held


def test_large_and_expanded_inputs_are_read_in_place():
    big = torch.randn(4096, 4096, device="cuda")  # 64 MiB: not copied per call
    row = torch.randn(1, 4096, device="cuda").expand(4096, 4096)  # overlaps itself
    f = compiled(lambda a, b: (a * 2 + b).relu())
    before = braze.counters()
    for _ in range(4):
        torch.testing.assert_close(f(big, row), (big * 2 + row).relu())
    assert delta(before)["cuda_graph_replays"] == 3
    other = torch.randn(4096, 4096, device="cuda")  # a new address: another capture
    torch.testing.assert_close(f(other, row), (other * 2 + row).relu())
    torch.testing.assert_close(f(big, row), (big * 2 + row).relu())
    assert delta(before)["cuda_graphs"] == 2


def test_a_cache_remade_per_generation_retires_the_oldest_capture():
    """A KV cache written in place (read where it is) that each generation allocates anew: the
    least recently replayed capture is dropped for one at the new address, so every generation
    replays after its first step, and each result equals eager's. An input read in place that
    moves at every call does not recapture at every call."""
    w = torch.randn(64, 64, device="cuda")

    def step(cache, x, pos):
        cache.index_copy_(0, pos, x @ w)
        return cache.sum(0) * 2

    f = compiled(step)
    before = braze.counters()
    with torch.no_grad():
        for gen in range(6):  # six caches: twice the captures a callable keeps
            cache = torch.zeros(4096, 64, device="cuda")  # 1 MiB, large: read in place
            want = cache.clone()
            for t in range(12):
                x, pos = torch.randn(1, 64, device="cuda"), torch.tensor([t], device="cuda")
                torch.testing.assert_close(f(cache, x, pos), step(want, x, pos))
                torch.testing.assert_close(cache, want)
    d = delta(before)
    assert d["cuda_graphs"] == 6 and d["cuda_graph_replays"] == 6 * 12 - 1, d
    assert braze.counters()["cuda_graph_busy"] == before["cuda_graph_busy"]
    g = compiled(lambda cache, x, pos: step(cache, x, pos))
    before = braze.counters()
    with torch.no_grad():
        for t in range(40):  # a new cache at every call
            cache = torch.zeros(4096, 64, device="cuda")
            g(cache, torch.randn(1, 64, device="cuda"), torch.tensor([t], device="cuda"))
    assert delta(before)["cuda_graphs"] == 3


def test_the_off_switch(monkeypatch):
    before = braze.counters()
    f = compiled(lambda x: x.cos() * 3, cuda_graphs=False)
    for _ in range(3):
        f(torch.randn(100, device="cuda"))
    torch._dynamo.reset()
    monkeypatch.setenv("BRAZE_CUDA_GRAPHS", "0")
    g = compiled(lambda x: x.cos() * 3, cuda_graphs=None)
    for _ in range(3):
        g(torch.randn(100, device="cuda"))
    assert delta(before)["cuda_graphs"] == 0


def _calls_at_sizes(f, fn, rounds, sizes=(5, 6, 7, 8)):
    """Calls f at each size in turn, `rounds` times, each equal to fn; the counters before."""
    before = braze.counters()
    for _ in range(rounds):
        for n in sizes:
            x = torch.randn(n, 16, device="cuda")
            torch.testing.assert_close(f(x), fn(x))
    return before


def test_dynamic_shapes_are_captured_per_size():
    """A graph with dynamic shapes is captured at each new size after its first call, and a
    replay at a size seen before equals eager; sizes beyond Options(cuda_graph_sizes) run
    uncaptured, and 0 turns capture off for such graphs."""
    w = torch.randn(16, 16, device="cuda")

    def fn(x):
        return (x @ w).softmax(-1) * x.shape[0]

    d = delta(_calls_at_sizes(compiled(fn, dynamic=True), fn, 3))
    assert d["cuda_graphs"] == 4 and d["cuda_graph_replays"] == 11, d
    torch._dynamo.reset()
    g = torch.compile(fn, backend="braze", dynamic=True,
                      options={"cuda_graphs": True, "cuda_graph_sizes": 2, "strict": True})
    before = _calls_at_sizes(g, fn, 2)
    d = delta(before)
    # sizes 6 and 7 are captured; 5 (the first call) and 8 run uncaptured
    assert d["cuda_graphs"] == 2 and d["cuda_graph_replays"] == 4, d
    assert braze.counters()["cuda_graph_uncaptured_sizes"] - before[
        "cuda_graph_uncaptured_sizes"] == 3
    torch._dynamo.reset()
    h = torch.compile(fn, backend="braze", dynamic=True,
                      options={"cuda_graphs": True, "cuda_graph_sizes": 0})
    assert delta(_calls_at_sizes(h, fn, 2, (5, 6)))["cuda_graphs"] == 0
    with pytest.raises(ValueError, match="cuda_graph_sizes"):
        braze.Options(cuda_graph_sizes=-1)


def test_a_growing_cache_replays_from_the_second_step():
    """A decode step whose cache grows by a concatenation (transformers' DynamicCache): each
    step is a new size, captured at its first call, so every step after the graph's first call
    is a replay, in the first generation and the later ones; the cache a step returns is the
    next step's input, read in place where the previous replay wrote it."""
    wq, wk = torch.randn(32, 32, device="cuda"), torch.randn(32, 32, device="cuda")

    def step(cache, x):
        cache = torch.cat([cache, x @ wk], dim=0)
        scores = ((x @ wq) @ cache.T).softmax(-1)
        return cache, scores @ cache

    f = compiled(step)  # sizes vary from the second call: Dynamo recompiles it dynamic
    before = braze.counters()
    for gen in range(3):
        cache = want = torch.randn(4, 32, device="cuda")
        for t in range(10):
            x = torch.randn(1, 32, device="cuda")
            cache, out = f(cache, x)
            want, expect = step(want, x)
            torch.testing.assert_close(out, expect)
            torch.testing.assert_close(cache, want)
    d = delta(before)
    # the first call of each of Dynamo's two graphs (static, then dynamic) runs uncaptured
    assert d["cuda_graph_replays"] == 3 * 10 - 2, d
    assert d["fallback_graphs"] == 0


def test_a_collected_capture_leaves_no_address_read_in_place():
    """The memory a capture's replays write is read in place by later captures only while that
    capture lives: once it is collected, a tensor the allocator places there is an ordinary
    input (copied per call), or a later capture would serve only calls passing that address."""
    import gc
    from braze import cudagraphs
    before = set(cudagraphs._replay_outputs)
    f = compiled(lambda x: (x.sin() * 2).cos().exp() + 1)
    x = torch.randn(256, device="cuda")
    for _ in range(3):
        torch.testing.assert_close(f(x), (x.sin() * 2).cos().exp() + 1)
    assert len(cudagraphs._replay_outputs) > len(before)
    del f
    torch._dynamo.reset()
    gc.collect()
    assert not set(cudagraphs._replay_outputs) - before


def test_a_graph_whose_input_copies_cost_more_than_its_launches_runs_uncaptured():
    """A 31.5 MiB input would be copied into the capture at every call, which costs more than
    its four launches save (an optimizer step copying its gradients): by default the graph runs
    uncaptured. Options(cuda_graphs=True) still captures it."""
    torch.manual_seed(0)
    x = torch.randn(3840, 2048, device="cuda")
    ws = [torch.randn(2048, 2048, device="cuda") / 45 for _ in range(4)]

    def chain(x):
        for w in ws:
            x = x @ w
        return x

    for option, captures in ((None, 0), (True, 1)):
        torch._dynamo.reset()
        f = compiled(chain, cuda_graphs=option)
        before = braze.counters()
        for _ in range(3):
            torch.testing.assert_close(f(x), chain(x), rtol=1e-3, atol=1e-3)
        assert delta(before)["cuda_graphs"] == captures, option


def test_a_bad_index_raises_from_a_replay_too():
    # bounds-checked indexing: a replay waits for its kernels and raises, as a plain call does
    x = torch.randn(10, device="cuda")
    f = compiled(lambda x, i: x[i] * 2)
    before = braze.counters()
    for _ in range(3):
        i = torch.tensor([1, 2], device="cuda")
        torch.testing.assert_close(f(x, i), x[[1, 2]] * 2)
    assert delta(before)["cuda_graphs"] == 1
    with pytest.raises(braze.RunError, match="out of bounds"):
        f(x, torch.tensor([1, 12], device="cuda"))
    torch.testing.assert_close(f(x, torch.tensor([3, 4], device="cuda")), x[[3, 4]] * 2)
    assert delta(before)["cuda_graph_replays"] == 4


@torch.library.custom_op("braze_test::synchronizing_double", mutates_args=())
def synchronizing_double(x: torch.Tensor) -> torch.Tensor:
    torch.cuda.synchronize()  # not allowed while a stream is captured
    return x * 2


@synchronizing_double.register_fake
def _(x):
    return torch.empty_like(x)


def test_a_failed_capture_runs_uncaptured_and_random_ops_still_work():
    x = torch.randn(1000, device="cuda")
    f = compiled(lambda x: synchronizing_double(x.sin()).cos() + torch.rand_like(x) * 0,
                 strict=None)
    before = braze.counters()
    for _ in range(3):
        torch.testing.assert_close(f(x), (x.sin() * 2).cos())
    assert delta(before)["cuda_graphs"] == 0
    r = torch.rand(10000, device="cuda")  # the generator left capture mode
    assert 0.45 < float(r.mean()) < 0.55
    y = F.dropout(torch.ones(10000, device="cuda"), 0.5)
    assert 0.4 < float((y == 0).float().mean()) < 0.6
