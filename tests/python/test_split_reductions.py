"""split-reductions: a long reduction with few results runs as partials, then a reduction of
those (lowering/split/SplitReductions.h). The step runs for CUDA only; its rewritten graph is
printed by braze-opt --cuda and run here on the CPU (braze-opt --run) against eager on the same
random inputs, so its arithmetic is checked on a machine without a GPU. On CUDA, models whose
reductions split are compared with eager whole."""
import subprocess

import pytest
import torch

import braze  # noqa: F401 (registers the "braze" backend)
from _device import braze_opt
from braze.package import _write_safetensors

_TEXT = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.bool: "bool",
         torch.float64: "f64"}


def _shape(s):
    return "[" + ", ".join(str(v) for v in s) + "]"


# (op, input shape, dims, keepdim, dtype, eager): each splits (checked below).
CASES = [
    ("sum", (32, 64, 32, 32), [0, 2, 3], False, torch.float32, lambda x: x.sum((0, 2, 3))),
    ("sum", (16384, 96), [0], True, torch.float16,
     lambda x: x.sum(0, keepdim=True, dtype=torch.float32).half()),
    ("sum", (16384, 96), [0], False, torch.bfloat16,
     lambda x: x.float().sum(0).bfloat16()),
    ("amax", (1 << 21,), [0], False, torch.float32, lambda x: x.amax()),
    ("amin", (8, 64, 4096), [0, 2], False, torch.float32, lambda x: x.amin((0, 2))),
    ("prod", (4, 65536, 8), [0, 1], False, torch.float64, lambda x: x.prod(1).prod(0)),
    ("any", (1 << 21,), [0], False, torch.bool, lambda x: x.any()),
    ("all", (64, 32768), [1], True, torch.bool, lambda x: x.all(1, keepdim=True)),
]


def _input(shape, dtype, op):
    g = torch.Generator().manual_seed(7)
    if dtype == torch.bool:  # mostly one value, so that any/all are not decided early
        return torch.rand(shape, generator=g) < (0.999999 if op == "all" else 0.000001)
    if op == "prod":  # near 1, so that the product of 2M values stays finite
        return 1 + 1e-4 * torch.randn(shape, generator=g, dtype=dtype)
    return torch.randn(shape, generator=g).to(dtype)


@pytest.mark.cpu_only("the rewritten graph runs on the CPU")
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{_TEXT[c[4]]}-{len(c[1])}d")
def test_a_split_reduction_computes_what_eager_does(case, tmp_path):
    op, shape, dims, keepdim, dtype, eager = case
    x = _input(shape, dtype, op)
    want = eager(x)
    out_dtype = want.dtype
    graph = tmp_path / "g.txt"
    graph.write_text(
        f"graph(%x: {_TEXT[dtype]}{_shape(shape)}) {{\n"
        f"  %r = {op}(%x) {{dims={dims}, keepdim={'true' if keepdim else 'false'}}} : "
        f"{_TEXT[out_dtype]}{_shape(want.shape)}\n  return %r\n}}\n")
    split = subprocess.run([braze_opt(), str(graph), "--cuda", "--passes=split-reductions"],
                           capture_output=True, text=True)
    assert split.returncode == 0, split.stderr
    assert "reshape(%x)" in split.stdout, split.stdout  # it did split
    (tmp_path / "split.txt").write_text(split.stdout)
    tensors = tmp_path / "t.safetensors"
    _write_safetensors(str(tensors), [("x", x.contiguous()), ("expected:0", want.contiguous())])
    tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}.get(dtype, 1e-4)
    run = subprocess.run([braze_opt(), str(tmp_path / "split.txt"), f"--run={tensors}",
                          f"--atol={tol}", f"--rtol={tol}"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.cpu_only("a text test")
def test_small_or_wide_reductions_do_not_split(tmp_path):
    graph = tmp_path / "g.txt"
    graph.write_text("graph(%x: f32[1, 32000], %y: f32[4096, 512]) {\n"
                     "  %a = amax(%x) {dims=[1], keepdim=true} : f32[1, 1]\n"
                     "  %b = sum(%y) {dims=[1], keepdim=false} : f32[4096]\n"
                     "  %c = argmax(%y) {dims=[0], keepdim=false} : i64[512]\n"
                     "  return %a, %b, %c\n}\n")
    split = subprocess.run([braze_opt(), str(graph), "--cuda", "--passes=split-reductions"],
                           capture_output=True, text=True)
    assert split.returncode == 0 and "reshape" not in split.stdout, split.stdout


@pytest.mark.cpu_only("the rewritten graph runs on the CPU")
@pytest.mark.parametrize("shape", [(8, 64, 64, 64), (32, 128, 7, 56)],
                         ids=["cut-H", "images-whole"])
def test_a_channels_last_column_split_computes_what_eager_does(shape, tmp_path):
    """Channel sums over a channels-last image: the partials keep C last, through a permute
    where H is cut ([8, 64, 64, 64]: N whole, H cut in 16), or the images whole without a cut
    ([32, 128, 7, 56]: 12,544 elements a channel keep at most 49 partials of 256, and H = 7
    has no cut within that)."""
    n, c, h, w = shape
    x = _input(shape, torch.float32, "sum")
    graph = tmp_path / "g.txt"
    graph.write_text(f"graph(%x: f32{_shape(shape)}{{{c * h * w}, 1, {w * c}, {c}}}) {{\n"
                     f"  %r = sum(%x) {{dims=[0, 2, 3], keepdim=false}} : f32[{c}]\n"
                     f"  return %r\n}}\n")
    split = subprocess.run([braze_opt(), str(graph), "--cuda", "--passes=split-reductions"],
                           capture_output=True, text=True)
    assert split.returncode == 0, split.stderr
    cut = shape[2] == 64
    assert ("permute(" in split.stdout) == cut, split.stdout
    assert cut or "sum(%x) {dims=[2, 3], keepdim=true}" in split.stdout, split.stdout
    # The arithmetic on the CPU, from a contiguous copy: the layout only steers the split.
    (tmp_path / "split.txt").write_text(
        split.stdout.replace(f"{{{c * h * w}, 1, {w * c}, {c}}}", "", 1))
    tensors = tmp_path / "t.safetensors"
    _write_safetensors(str(tensors), [("x", x.contiguous()), ("expected:0", x.sum((0, 2, 3)))])
    run = subprocess.run([braze_opt(), str(tmp_path / "split.txt"), f"--run={tensors}",
                          "--atol=1e-3", "--rtol=1e-4"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def _cuda_only(device):
    if device != "cuda":
        pytest.skip("split-reductions runs for CUDA")


def test_cuda_batch_norm_training_step_with_split_sums_matches_eager(device):
    _cuda_only(device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 64, 3, padding=1), torch.nn.BatchNorm2d(64),
                                torch.nn.ReLU(), torch.nn.Conv2d(64, 64, 1),
                                torch.nn.BatchNorm2d(64)).cuda()
    model = model.to(memory_format=torch.channels_last)
    ref = __import__("copy").deepcopy(model)
    x = torch.randn(32, 16, 48, 48, device="cuda").to(memory_format=torch.channels_last)
    compiled = torch.compile(model, backend="braze")
    for m in (compiled, ref):
        m(x).square().mean().backward()
    torch.testing.assert_close(compiled(x), ref(x), atol=1e-3, rtol=1e-3)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-3, rtol=1e-3, msg=name)
    torch.testing.assert_close(model[1].running_var, ref[1].running_var)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_long_column_sums_and_full_reductions_match_eager(dtype, device):
    _cuda_only(device)
    torch.manual_seed(1)
    x = torch.randn(16384, 256, device="cuda", dtype=dtype)
    v = torch.randn(1 << 22, device="cuda", dtype=dtype)

    def f(x, v):
        return x.sum(0), (x * x).sum(0), v.amax(), v.float().square().sum()

    got, want = torch.compile(f, backend="braze")(x, v), f(x, v)
    tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=tol * 10, rtol=tol)
