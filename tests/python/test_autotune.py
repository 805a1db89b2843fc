"""The autotuner (driver/Autotune.h; Options.autotune, BRAZE_AUTOTUNE, mode="max-autotune").
On CUDA each graph's loop kernels that take its time are run in other forms of their launch
record, and the fastest form that writes what the planned one writes is kept, as is the fastest
of cuBLASLt's algorithms for each matrix product; the tuned module is what the cache stores, so
a warm compile tunes nothing. On the CPU the kernels with the most points are timed in their
other records (shared outer loops, simd, lanes, groups) through a tuning module of their forms.
The forms are what `braze-opt --forms` prints: each is a record `--launch` takes, and its code
compiles."""
import re
import subprocess

import pytest
import torch

import braze
from braze import cuda as cuda_support
from _device import braze_opt

# Rows persistent in registers (a softmax over 1024), a pointwise kernel with lanes, and a
# column sum: each kind of loop kernel the forms vary.
GRAPH = """graph(%x: f32[4096, 1024], %g: f32[8192, 512], %a: f32[1024, 1024]) {
  %m = amax(%x) {dims=[1], keepdim=true} : f32[4096, 1]
  %c = sub(%x, %m) : f32[4096, 1024]
  %e = exp(%c) : f32[4096, 1024]
  %s = sum(%e) {dims=[1], keepdim=true} : f32[4096, 1]
  %y = div(%e, %s) : f32[4096, 1024]
  %k = sum(%g) {dims=[0], keepdim=false} : f32[512]
  %p = mul(%a, %a) : f32[1024, 1024]
  return %y, %k, %p
}
"""


def _opt(*args):
    return subprocess.run([braze_opt(), *args], capture_output=True, text=True)


def _forms(path):
    out = _opt(str(path), "--cuda", "--forms")
    assert out.returncode == 0, out.stderr
    forms = {}
    for line in out.stdout.splitlines():
        kernel, form, record, blocks = re.fullmatch(r"(kernel\d+) form(\d+) (launch\{.*\}) "
                                                    r"blocks=(-?\d+)", line).groups()
        forms.setdefault(kernel, []).append((int(form), record, int(blocks)))
    return forms


@pytest.mark.cpu_only("braze-opt text and NVRTC: nothing runs")
def test_each_kernel_has_forms_beginning_with_its_planned_record(tmp_path):
    graph = tmp_path / "g.txt"
    graph.write_text(GRAPH)
    forms = _forms(graph)
    schedule = _opt(str(graph), "--cuda", "--print=schedule").stdout
    assert len(forms) >= 3
    for kernel, listed in forms.items():
        assert [f for f, _, _ in listed] == list(range(len(listed)))
        planned = re.search(kernel + r" .*?(launch\{[^}]*\})", schedule).group(1)
        assert listed[0][1] == planned
        records = [r for _, r, _ in listed]
        assert len(set(records)) == len(records) > 1, records
        assert all(b > 0 for _, _, b in listed)


@pytest.mark.cpu_only("braze-opt text and NVRTC: nothing runs")
@pytest.mark.skipif(cuda_support.nvrtc_library() is None, reason="NVRTC not installed")
def test_every_form_is_a_record_launch_takes_and_its_code_compiles(tmp_path):
    graph = tmp_path / "g.txt"
    graph.write_text(GRAPH)
    forms = _forms(graph)
    most = max(len(v) for v in forms.values())
    for i in range(1, most):
        records = tmp_path / f"r{i}.txt"
        chosen = {k: v[i][1] for k, v in forms.items() if i < len(v)}
        records.write_text("".join(f"{k} {r}\n" for k, r in chosen.items()))
        schedule = _opt(str(graph), "--cuda", f"--launch={records}", "--print=schedule")
        assert schedule.returncode == 0, schedule.stderr
        for k, r in chosen.items():
            assert re.search(k + r" .*" + re.escape(r), schedule.stdout), (k, r)
        code = _opt(str(graph), "--cuda", f"--launch={records}", "--print=code")
        assert code.returncode == 0, code.stderr
        device = code.stdout.split("\n#include <stdint.h>\n")[0]
        assert braze._C.nvrtc_compile(device, cuda_support.nvrtc_library(), 90,
                                      str(tmp_path / f"c{i}"))


@pytest.mark.cpu_only("NVRTC: nothing runs")
@pytest.mark.skipif(cuda_support.nvrtc_library() is None, reason="NVRTC not installed")
def test_the_tuners_own_kernels_compile(tmp_path):
    source = braze._C.autotune_checker_source()
    for name in ["braze_tune_fill", "braze_tune_bytes"] + [
            f"braze_tune_{k}{i}" for k in ("maxabs", "compare") for i in range(4)]:
        assert f"__global__ void {name}(" in source
    assert braze._C.nvrtc_compile(source, cuda_support.nvrtc_library(), 90, str(tmp_path))


@pytest.mark.cpu_only("braze-opt's arguments")
def test_forms_list_the_cpus_records_and_need_a_graph(tmp_path):
    graph = tmp_path / "g.txt"
    graph.write_text(GRAPH)
    out = _opt(str(graph), "--forms")
    assert out.returncode == 0, out.stderr
    schedule = _opt(str(graph), "--print=schedule").stdout
    for kernel in {line.split()[0] for line in out.stdout.splitlines()}:
        listed = [line.split(" ", 2)[2] for line in out.stdout.splitlines()
                  if line.startswith(kernel + " ")]
        assert listed[0] == re.search(kernel + r" .*?(cpu\{[^}]*\})", schedule).group(1)
        assert len(set(listed)) == len(listed) > 1
    out = _opt(str(graph), "--forms", "--print=code")
    assert out.returncode == 1 and "--forms" in out.stderr and "needs a graph" in out.stderr


@pytest.mark.cpu_only("the environment is read before any device is involved")
def test_a_bad_budget_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv("BRAZE_AUTOTUNE", "fast")
    fn = torch.compile(lambda x: x + 1, backend="braze", options={"strict": True})
    with pytest.raises(Exception, match="BRAZE_AUTOTUNE.*'fast'"):
        fn(torch.randn(4))
    with pytest.raises(ValueError, match=r"Options\(autotune=...\) is 'x'"):
        braze.Options(autotune="x")


def _model(device, dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.LayerNorm(1024), torch.nn.Linear(1024, 1024),
                               torch.nn.GELU(), torch.nn.LayerNorm(1024)).to(device, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tuned_graph_computes_what_eager_does(device, dtype, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("BRAZE_LOG", "autotune")
    model = _model(device, dtype)
    x = torch.randn(2048, 1024, device=device, dtype=dtype)
    before = braze.compile_times().get("autotune", 0.0)
    fn = torch.compile(model, backend="braze", options={"autotune": 3})
    with torch.no_grad():
        got, want = fn(x), model(x)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    said = capfd.readouterr().err
    assert "===== braze: autotune =====" in said
    if device == "cpu":
        assert re.search(r"timed [1-9]\d* kernels", said), said
        assert re.search(r"\* cpu\{[^}]*\}  [\d.]+ us", said), said  # the winner, timed
    else:
        assert re.search(r"timed \d+ functions", said), said
        assert re.search(r"\* launch\{[^}]*\}  [\d.]+ us", said), said  # the winner, timed
        # The Linear's product, in each algorithm cuBLASLt's heuristics offer.
        assert re.search(r"matrix products:\ngemm_[\d_]+:\n  [* ] algorithm 0  [\d.]+ us",
                         said), said
    spent = braze.compile_times()["autotune"] - before
    # The budget, and the compile of the winners; on the CPU also the tuning module's compile,
    # which the budget cannot stop (on 2 busy cores, seconds).
    assert 0 < spent < 3 + (2 if device == "cuda" else 30)
    # A warm compile (the manifest of the tuned module) tunes nothing.
    torch._dynamo.reset()
    before = braze.compile_times()["autotune"]
    fn = torch.compile(model, backend="braze", options={"autotune": 3})
    with torch.no_grad():
        torch.testing.assert_close(fn(x), want, atol=tol, rtol=tol)
    assert braze.compile_times()["autotune"] == before


def test_kernels_near_their_bound_are_not_tuned(device, tmp_path, monkeypatch, capfd):
    # A pointwise kernel over 2^27 floats streams 1 GiB at the memory's bandwidth, and one
    # over 256 floats takes about a launch: no form could gain, so none is compiled or timed,
    # nothing is checked (the checker is not built) and the tuning takes milliseconds.
    if device != "cuda":
        pytest.skip("the CPU's tuner has no bound rule")
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("BRAZE_LOG", "autotune")

    def f(x):
        return ((x + 1) * 2).sin()

    for n in (1 << 27, 256):
        torch._dynamo.reset()
        x = torch.randn(n, device=device)
        got = torch.compile(f, backend="braze", options={"autotune": 5})(x)
        torch.testing.assert_close(got, f(x))
        said = capfd.readouterr().err
        assert re.search(r"launch floor [\d.]+ us, theoretical bandwidth (\d+ GB/s|unknown)",
                         said), said
        if n > 256 and "bandwidth unknown" in said:
            continue  # the driver does not say: no bandwidth rule
        why = "of the theoretical bandwidth" if n > 256 else "launch-bound"
        assert re.search(r"not tuned, near their bound:\n  kernel\d+: .*" + why, said), said
        spent = re.search(r"timed 0 functions .* in ([\d.e+-]+) s", said)
        assert spent and float(spent.group(1)) < 0.1, said
        assert "checker ready" not in said, said
    # BRAZE_AUTOTUNE_NEAR_BOUND=1 (how the rule is measured) times it anyway, from the store's
    # empty cache, and says why it would not have.
    monkeypatch.setenv("BRAZE_AUTOTUNE_NEAR_BOUND", "1")
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path / "anyway"))
    torch._dynamo.reset()
    got = torch.compile(f, backend="braze", options={"autotune": 5})(x)
    torch.testing.assert_close(got, f(x))
    said = capfd.readouterr().err
    assert re.search(r"kernel\d+: .*launch-bound .*\(timed anyway\)", said), said
    assert re.search(r"timed 1 functions", said), said
    assert "checker ready" in said, said


def test_a_kernel_that_updates_its_input_is_tuned_from_one_state(device, tmp_path, monkeypatch):
    # Each form runs the update from the state before it, and the run goes on from there: the
    # compiled call applies the update once.
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path))

    def step(p, g):
        p.mul_(0.9).add_(g, alpha=0.1)
        return p.sum(dim=0)

    torch.manual_seed(0)
    p = torch.randn(4096, 2048, device=device)
    g = torch.randn(4096, 2048, device=device)
    want_p = p * 0.9 + g * 0.1
    fn = torch.compile(step, backend="braze", options={"autotune": 2})
    got = fn(p, g)
    torch.testing.assert_close(p, want_p)
    torch.testing.assert_close(got, want_p.sum(dim=0), atol=1e-3, rtol=1e-4)


def _skip_without_cudnn(device, what):
    if device != "cuda":
        pytest.skip(f"cuDNN's engines serve CUDA {what}")
    if cuda_support.cudnn_library() is None:
        pytest.skip("cuDNN was not found")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_convolutions_take_the_fastest_of_cudnns_engines(device, dtype, tmp_path, monkeypatch,
                                                         capfd):
    # A training step's convolutions (forward, weight and input gradients) in each engine
    # config cuDNN's heuristics offer; the choices are stored with the tuned module and a warm
    # compile restores them, tuning nothing.
    _skip_without_cudnn(device, "convolutions")
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("BRAZE_LOG", "autotune")
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(64, 128, 3, padding=1).to(device, dtype, memory_format=torch.channels_last)
    x = torch.randn(16, 64, 56, 56, device=device, dtype=dtype).contiguous(
        memory_format=torch.channels_last).requires_grad_()

    def step(x):
        return conv(x).relu().square().mean()

    def grads(fn):
        for t in (x, conv.weight, conv.bias):
            t.grad = None
        loss = fn(x)
        loss.backward()
        return [loss.detach(), x.grad, conv.weight.grad, conv.bias.grad]

    want = grads(step)
    got = grads(torch.compile(step, backend="braze", options={"autotune": 5}))
    tol = 1e-2 if dtype == torch.float16 else 1e-4
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=tol * w.abs().max().item(), rtol=tol)
    said = capfd.readouterr().err
    timed = re.findall(r"convolutions:\n((?:conv_[\d_-]+:\n(?:  [* ] engine \d+  .*\n)+)+)", said)
    assert timed, said
    problems = re.findall(r"^conv_[\d_-]+:$", "".join(timed), re.M)
    winners = re.findall(r"^  \* engine \d+  [\d.]+ us$", "".join(timed), re.M)
    # The forward in the forward graph; the two gradients in the backward's.
    assert len(problems) >= 3 and len(winners) == len(problems), said
    stored = [m for m in tmp_path.rglob("*.manifest")
              if re.search(rb"\nconv_engine \d+\nconv_[\d_-]+ \d+\n", m.read_bytes())]
    assert stored, "no manifest records the engines"
    # A warm compile restores the choices from the manifest and tunes nothing.
    torch._dynamo.reset()
    before = braze.compile_times()["autotune"]
    again = grads(torch.compile(step, backend="braze", options={"autotune": 5}))
    for g, w in zip(again, got):
        torch.testing.assert_close(g, w, atol=tol * w.abs().max().item(), rtol=tol)
    assert braze.compile_times()["autotune"] == before



@pytest.mark.parametrize("causal", [True, False])
def test_attentions_take_the_fastest_of_cudnns_engines(device, causal, tmp_path, monkeypatch,
                                                       capfd):
    # By default the tuner leaves cuDNN's attention in its heuristics' first engine. With
    # BRAZE_AUTOTUNE_ATTENTION=1, a training step through a fused attention (its forward, and
    # its backward's three gradients) runs in each engine config cuDNN's heuristics offer, each
    # result checked against the first config's; the choices are stored with the tuned module
    # and a warm compile restores them, tuning nothing.
    _skip_without_cudnn(device, "attentions")
    monkeypatch.setenv("BRAZE_LOG", "autotune")
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 8, 512, 64, device=device, dtype=torch.bfloat16).requires_grad_()
               for _ in range(3))
    mask = None if causal else torch.randn(1, 1, 512, 512, device=device, dtype=torch.bfloat16)

    def step(q, k, v):
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                             is_causal=causal)
        return o.float().square().mean()

    def grads(fn):
        for t in (q, k, v):
            t.grad = None
        loss = fn(q, k, v)
        loss.backward()
        return [loss.detach(), q.grad, k.grad, v.grad]

    def tuned(cache):
        # The forward graph's attentions and the backward graph's: what the tuner timed of them.
        monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path / cache))
        torch._dynamo.reset()
        fallbacks = braze.counters()["fallback_ops"]
        got = grads(torch.compile(step, backend="braze", options={"autotune": 5}))
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=2e-2 * w.abs().max().item(), rtol=2e-2)
        said = capfd.readouterr().err
        assert braze.counters()["fallback_ops"] == fallbacks, said
        sections = re.findall(r"attentions:\n((?:attention_[\d_-]+:\n(?:  [* ] engine \d+  .*\n)+)*)"
                              r"batches:", said)
        summaries = [int(n) for n in re.findall(r"; (\d+) attentions, \d+ changed; in ", said)]
        assert len(summaries) == 2 and len(sections) == 2, said
        problems = re.findall(r"^attention_(-[12])_[\d_-]+:$", "".join(sections), re.M)
        winners = re.findall(r"^  \* engine \d+  [\d.]+ us$", "".join(sections), re.M)
        assert len(problems) == sum(summaries) and len(winners) == len(problems), said
        return got, problems, said

    want = grads(step)
    _, problems, said = tuned("default")
    assert problems == [], said
    monkeypatch.setenv("BRAZE_AUTOTUNE_ATTENTION", "1")
    got, problems, said = tuned("attention")
    if not problems:
        pytest.skip("cuDNN's heuristics offer one engine for each of these attentions:\n" + said)
    stored = [m for m in (tmp_path / "attention").rglob("*.manifest")
              if re.search(rb"\nattention_engine \d+\nattention_-[12]_[\d_-]+ \d+\n",
                           m.read_bytes())]
    assert stored, "no manifest records the engines"
    torch._dynamo.reset()
    before = braze.compile_times()["autotune"]
    again = grads(torch.compile(step, backend="braze", options={"autotune": 5}))
    for g, w in zip(again, got):
        torch.testing.assert_close(g, w, atol=2e-2 * w.abs().max().item(), rtol=2e-2)
    assert braze.compile_times()["autotune"] == before
