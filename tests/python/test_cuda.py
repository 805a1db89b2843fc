"""The CUDA path. Where NVRTC is installed (CI installs it, with no GPU), every workload's
generated CUDA sources are compiled by NVRTC for sm_90 and the host code by the host compiler,
so codegen that does not compile fails here. With a GPU, the rest of the suite also runs on
CUDA (conftest.py); the tests below check what is particular to the CUDA runtime."""
import os

import pytest
import torch
import torch.nn.functional as F

import braze
from braze import cuda as cuda_support
from braze.backend import Options

pytestmark = pytest.mark.cpu_only("checks of the CUDA path itself; they pick their devices")

needs_nvrtc = pytest.mark.skipif(cuda_support.nvrtc_library() is None, reason="NVRTC not installed")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def seed(a, b):
    return ((a.ceil() + b.floor()).sum(-1).softmax(-1) * 10) ** 3


def rmsnorm(x, w):
    v = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(v + 1e-6)).to(x.dtype) * w


WORKLOADS = {
    "seed": (seed, lambda dt: (torch.randn(64, 128, dtype=dt), torch.randn(64, 128, dtype=dt))),
    "pointwise": (lambda x: ((x + 1) * 2).sin(), lambda dt: (torch.randn(4096, dtype=dt),)),
    "softmax": (lambda x: torch.softmax(x, -1), lambda dt: (torch.randn(16, 8192, dtype=dt),)),
    "layer_norm_gelu": (lambda x, w, b: F.gelu(F.layer_norm(x, (768,), w, b)),
                        lambda dt: (torch.randn(32, 768, dtype=dt), torch.randn(768, dtype=dt),
                                    torch.randn(768, dtype=dt))),
    "rmsnorm": (rmsnorm, lambda dt: (torch.randn(8, 4096, dtype=dt), torch.randn(4096, dtype=dt))),
    "cross_entropy": (lambda x, t: F.cross_entropy(x, t),
                      lambda dt: (torch.randn(8, 32000, dtype=dt), torch.randint(0, 32000, (8,)))),
    "argmax": (lambda x: x.argmax(-1), lambda dt: (torch.randn(7, 33, dtype=dt),)),
    # column mode: reductions over the rows of row-major matrices (and the product's own
    # fallback kernel, A^T A), wide and narrow (a block of whole warps for 4 columns)
    "column_sums": (lambda x, y: (x.sum(0), x.argmin(0), x.var(0), y.t() @ y, y.amax(0)),
                    lambda dt: (torch.randn(300, 40, dtype=dt), torch.randn(16, 4, dtype=dt))),
    "transposed_store": (lambda x: torch.sin(x).t().contiguous() * 3,
                         lambda dt: (torch.randn(50, 70, dtype=dt),)),
    # 2^20 points or more in rows without vector lanes: 4 points per thread, a block apart
    "unaligned_rows": (lambda x, y: (x * 2).sin() + y,
                       lambda dt: (torch.randn(1024, 1025, dtype=dt), torch.randn(1025, dtype=dt))),
    "matmul_bias_gelu": (lambda x, w, b: F.gelu(x @ w.t() + b),
                         lambda dt: (torch.randn(64, 32, dtype=dt), torch.randn(16, 32, dtype=dt),
                                     torch.randn(16, dtype=dt))),
    "gather_sum": (lambda x, i: x[i].sum(0),
                   lambda dt: (torch.randn(10, 8, dtype=dt), torch.randint(0, 10, (5,)))),
    "integers": (lambda x: (x // 3) % 5 + x.max() + (x > 2).sum(),
                 lambda dt: (torch.randint(-100, 100, (1000,)),)),
    "full_sum": (lambda x: x.sum() + x.amax(), lambda dt: (torch.randn(1 << 16, dtype=dt),)),
    "random": (lambda x: x + torch.rand_like(x) * 0, lambda dt: (torch.randn(100, dtype=dt),)),
    "cumsum": (lambda x: x.cumsum(-1), lambda dt: (torch.randn(4, 100, dtype=dt),)),
    # f16/bf16: the fused attention kernel (mma.sync); f32/f64: matmul, softmax, matmul
    "attention": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                  lambda dt: (torch.randn(2, 3, 70, 64, dtype=dt), torch.randn(2, 3, 90, 64, dtype=dt),
                              torch.randn(2, 3, 90, 64, dtype=dt), torch.randn(70, 90, dtype=dt))),
    "causal_attention": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                         lambda dt: tuple(torch.randn(1, 2, 40, 256, dtype=dt) for _ in range(3))),
    # codegen/SpecialMath's prelude as device functions (templates over the result type too)
    "special": (lambda x, a: (torch.digamma(x) + torch.polygamma(2, a) + torch.erfinv(x.tanh())
                              + torch.special.i1e(x) + torch.igamma(a, a + 1),
                              torch.special.chebyshev_polynomial_t(x.float(), 5)),
                lambda dt: (torch.randn(257, dtype=dt), torch.rand(257, dtype=dt) + 0.5)),
}


@needs_nvrtc
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_generated_cuda_compiles(name, dtype):
    fn, make = WORKLOADS[name]
    torch.manual_seed(0)
    args = make(dtype)
    compiled = torch.compile(fn, backend=lambda gm, ex: braze.braze_backend(
        gm, ex, Options(cuda_codegen_only=True, strict=True)))
    out, sources = braze.run_and_get_code(compiled, *args)
    assert sources, "nothing was generated"
    assert all("__global__" in s for s in sources)
    torch.testing.assert_close(out, fn(*args))  # the graph itself ran in eager


def _many_sums(*xs):
    return [a + b for a, b in zip(xs[::2], xs[1::2])]


@needs_nvrtc
def test_a_kernel_names_no_more_buffers_than_a_launch_passes():
    """160 same-shaped sums (480 buffers) are more than a 4 KiB launch passes: without the
    device's word on its argument space, they are split into kernels of at most 448 pointers
    each, and NVRTC compiles every one."""
    xs = [torch.randn(16) for _ in range(320)]
    compiled = torch.compile(_many_sums, backend=lambda gm, ex: braze.braze_backend(
        gm, ex, Options(cuda_codegen_only=True, strict=True)))
    out, sources = braze.run_and_get_code(compiled, *xs)
    kernels = [k for s in sources for k in s.split("__global__")[1:]]
    assert len(kernels) == 2
    assert max(k.split("{")[0].count("__restrict__") for k in kernels) <= 449
    torch.testing.assert_close(out, _many_sums(*xs))


def test_the_launch_argument_space_follows_nvrtc_and_the_driver(monkeypatch):
    """32764 bytes of kernel arguments where NVRTC and the driver are CUDA 12.1 or later; 4 KiB
    otherwise, or where either cannot be read."""
    cuda_support.kernel_arg_bytes.cache_clear()
    monkeypatch.setattr(cuda_support, "nvrtc_library", lambda: "libnvrtc.so.12")
    monkeypatch.setattr(cuda_support, "nvrtc_load_error", lambda path: None)
    cases = [("12.9", 12090, 32764), ("12.1", 12010, 32764), ("12.0", 12090, 4096),
             ("12.9", 12000, 4096), ("13.0", 0, 4096), ("garbled", 13000, 4096)]
    try:
        for nvrtc, driver, want in cases:
            cuda_support.kernel_arg_bytes.cache_clear()
            monkeypatch.setattr(cuda_support._C, "nvrtc_version", lambda path, v=nvrtc: v)
            monkeypatch.setattr(cuda_support, "driver_version", lambda d=driver: d)
            assert cuda_support.kernel_arg_bytes() == want, (nvrtc, driver)
        monkeypatch.setattr(cuda_support, "nvrtc_library", lambda: None)
        cuda_support.kernel_arg_bytes.cache_clear()
        assert cuda_support.kernel_arg_bytes() == 4096
    finally:
        cuda_support.kernel_arg_bytes.cache_clear()


@needs_nvrtc
def test_generated_cuda_compiles_with_dynamic_sizes():
    """The host code of a graph whose arena size depends on a size symbol divides it (floor
    division of index expressions), which the host side must declare."""
    compiled = torch.compile(seed, dynamic=True, backend=lambda gm, ex: braze.braze_backend(
        gm, ex, Options(cuda_codegen_only=True, strict=True)))
    a, b = torch.randn(33, 13), torch.randn(33, 13)
    out, sources = braze.run_and_get_code(compiled, a, b)
    assert sources
    torch.testing.assert_close(out, seed(a, b))


@needs_nvrtc
def test_graphs_that_check_indices_end_with_the_index_guard():
    """A graph whose kernels bounds-check an index has one more kernel, launched last when the
    runtime asks (index_checks="assert"): it asserts on the error flag. NVRTC compiles it; a
    graph without indexing has none."""
    def sources_of(fn, *args):
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend=lambda gm, ex: braze.braze_backend(
            gm, ex, Options(cuda_codegen_only=True, strict=True)))
        return "\n".join(braze.run_and_get_code(compiled, *args)[1])

    src = sources_of(lambda x, i: x[i] * 2, torch.randn(10), torch.tensor([1, 2]))
    assert 'extern "C" __global__ void braze_index_guard(const int* __restrict__ err)' in src
    assert "__assertfail(" in src
    assert "if (api->assertIndices) {" in src
    plain = sources_of(lambda x: x.sin() * 2, torch.randn(10))
    assert "void braze_index_guard(" not in plain and "if (api->assertIndices)" not in plain


@needs_nvrtc
@pytest.mark.parametrize("tf32", [False, True])
def test_f32_products_follow_the_tf32_flag(tf32):
    """An f32 product may use TF32 exactly when torch.backends.cuda.matmul.allow_tf32 (or
    torch.set_float32_matmul_precision) allowed it when the graph was compiled."""
    fn = lambda a, b: a @ b
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend=lambda gm, ex: braze.braze_backend(
            gm, ex, Options(cuda_codegen_only=True, strict=True)))
        a, b = torch.randn(64, 32), torch.randn(32, 48)
        _, sources = braze.run_and_get_code(compiled, a, b)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    gemms = [line for s in sources for line in s.splitlines() if "BrazeGemm g = {" in line]
    assert gemms, "the product did not go to cuBLASLt"
    assert all(line.rstrip().endswith(", 1};" if tf32 else ", 0};") for line in gemms), gemms


@needs_nvrtc
def test_nvrtc_reports_errors_with_the_log(tmp_path):
    with pytest.raises(braze.InternalError, match="(?s)failed to compile.*undefined_name"):
        braze._C.nvrtc_compile('extern "C" __global__ void k() { undefined_name(); }',
                               cuda_support.nvrtc_library(), 90, str(tmp_path))


@needs_nvrtc
def test_nvrtc_compiles_kernels_as_parallel_programs(tmp_path):
    """A source of many kernels is compiled as several NVRTC programs at once (one per kernel, at
    most one per hardware thread and 16): each program holds the prelude and a share of the
    kernels, and every kernel is in exactly one cubin. A second compile finds them all cached."""
    prelude = "__device__ float twice(float x) { return 2.0f * x; }\n"
    names = [f"k{i}" for i in range(12)]
    source = prelude + "".join(
        f'extern "C" __global__ void {n}(float* a) {{ a[threadIdx.x] = twice(a[threadIdx.x]) + {i}; }}\n'
        for i, n in enumerate(names))
    paths = braze._C.nvrtc_compile(source, cuda_support.nvrtc_library(), 90, str(tmp_path))
    assert len(paths) == max(1, min(len(names), os.cpu_count(), 16))
    images = [open(p, "rb").read() for p in paths]
    for n in names:
        assert sum(n.encode() + b"\0" in image for image in images) == 1, n
    assert braze._C.nvrtc_compile(source, cuda_support.nvrtc_library(), 90, str(tmp_path)) == paths


@needs_gpu
def test_runs_on_the_current_stream():
    x = torch.randn(1 << 20, device="cuda")
    f = torch.compile(lambda x: (x * 2).sin(), backend="braze")
    f(x)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = f(x)  # queued behind nothing else on s; read on s
        z = y.clone()
    s.synchronize()
    torch.testing.assert_close(z, (x * 2).sin())


@needs_gpu
def test_out_of_bounds_index_is_an_error_of_that_call():
    x = torch.randn(10, device="cuda")
    f = torch.compile(lambda x, i: x[i] * 2, backend="braze")
    torch.testing.assert_close(f(x, torch.tensor([1, 2], device="cuda")), x[[1, 2]] * 2)
    with pytest.raises(braze.RunError, match="out of bounds"):
        f(x, torch.tensor([1, 12], device="cuda"))
    torch.testing.assert_close(f(x, torch.tensor([3], device="cuda")), x[[3]] * 2)


_ASSERTING_CHILD = """
import sys, torch, braze
x = torch.randn(10, device="cuda")
f = torch.compile(lambda x, i: x[i] * 2, backend="braze",
                  options={"index_checks": "assert", "cuda_graphs": False})
assert torch.equal(f(x, torch.tensor([1, 2], device="cuda")), x[[1, 2]] * 2)
print("good call ok", flush=True)
y = f(x, torch.tensor([1, 12], device="cuda"))  # returns at once: nothing waits
print("bad call returned", flush=True)
try:
    y.cpu()
except Exception as e:
    print("raised:", type(e).__name__, str(e).splitlines()[0], flush=True)
    sys.exit(0)
print("no error", flush=True)
sys.exit(1)
"""


@needs_gpu
def test_by_default_a_bad_index_stops_cuda_with_a_device_side_assertion():
    """index_checks="assert" (the default outside this test session): a call with a bad index
    returns without waiting for its kernels; the guard after them stops the stream with an
    assertion that names the bad index, so the result is never read. In a child process: CUDA
    is unusable after it, as after eager's own assertions."""
    import subprocess
    import sys
    env = dict(os.environ)
    env.pop("BRAZE_INDEX_CHECKS", None)
    r = subprocess.run([sys.executable, "-c", _ASSERTING_CHILD], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "good call ok" in r.stdout and "bad call returned" in r.stdout, r.stdout
    assert "raised:" in r.stdout and "assert" in r.stdout.lower(), r.stdout
    assert "braze: an index is out of bounds" in r.stderr, r.stderr[-2000:]


def test_index_checks_option_is_validated(monkeypatch):
    with pytest.raises(ValueError, match="index_checks.*'wait'.*'assert'.*'sync'"):
        Options(index_checks="wait")
    assert Options(index_checks="sync").sync_index_checks()
    assert not Options(index_checks="assert").sync_index_checks()
    monkeypatch.delenv("BRAZE_INDEX_CHECKS", raising=False)
    assert not Options().sync_index_checks()
    monkeypatch.setenv("BRAZE_INDEX_CHECKS", "later")
    with pytest.raises(ValueError, match="BRAZE_INDEX_CHECKS is 'later'"):
        Options().sync_index_checks()


@torch.library.custom_op("braze_test::eager_halve", mutates_args=())
def eager_halve(x: torch.Tensor) -> torch.Tensor:
    return x / 2


@eager_halve.register_fake
def _(x):
    return torch.empty_like(x)


@needs_gpu
def test_partitions_check_indices_once_after_the_last():
    """A graph cut by an eager op: its partitions that check indices do not wait for their
    kernels one by one, in the middle of the graph, but once after the last partition; a bad
    index still raises from the call that had it, and the next call is right."""
    x, w = torch.randn(10, device="cuda"), torch.randn(6, device="cuda")

    def fn(x, i, j):
        y = eager_halve(x[i] * 2)
        return torch.ops.braze_test.eager_halve(w[j] + y)

    before = braze.counters()
    f = torch.compile(fn, backend="braze", options={"cuda_graphs": False})
    i, j = torch.tensor([1, 2], device="cuda"), torch.tensor([0, 5], device="cuda")
    torch.testing.assert_close(f(x, i, j), fn(x, i, j))
    assert braze.counters()["fallback_ops"] - before["fallback_ops"] == 2
    for bad_i, bad_j in ((torch.tensor([1, 12]), j.cpu()), (i.cpu(), torch.tensor([0, 6]))):
        with pytest.raises(braze.RunError, match="out of bounds"):
            f(x, bad_i.cuda(), bad_j.cuda())
    torch.testing.assert_close(f(x, j, i), fn(x, j, i))


@needs_gpu
def test_outputs_are_owned_by_pytorch():
    x = torch.randn(1000, 1000, device="cuda")
    f = torch.compile(lambda x: torch.softmax(x, -1), backend="braze")
    before = torch.cuda.memory_allocated()
    y = f(x)
    assert y.device.type == "cuda" and y.is_contiguous()
    assert torch.cuda.memory_allocated() >= before + y.numel() * 4
    del y
    assert torch.cuda.memory_allocated() == before


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_unaligned_vocabulary_products_write_padded_rows(dtype):
    """A large product whose rows are not whole 16-byte words (GPT-2's 50257-column logits) is
    written with its rows padded to 16 bytes, in place, and returned with those strides (as
    TorchInductor returns it); a loss over it and its gradient read the padded rows. Results
    equal eager's."""
    torch.manual_seed(0)
    x = torch.randn(1024, 768, device="cuda", dtype=dtype)
    w = torch.randn(50257, 768, device="cuda", dtype=dtype) * 0.02
    t = torch.randint(0, 50257, (1024,), device="cuda")

    def logits(x, w):
        return x @ w.t()

    def loss(x, w, t):
        return F.cross_entropy((x @ w.t()).float(), t)

    torch._dynamo.reset()
    got = torch.compile(logits, backend="braze")(x, w)
    want = logits(x, w)
    assert got.stride() == (50264 if dtype == torch.bfloat16 else 50260, 1)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(got, want, **tol)
    xg = x.detach().clone().requires_grad_()
    xe = x.detach().clone().requires_grad_()
    torch._dynamo.reset()
    lg = torch.compile(loss, backend="braze")(xg, w, t)
    le = loss(xe, w, t)
    lg.backward()
    le.backward()
    torch.testing.assert_close(lg, le, **tol)
    torch.testing.assert_close(xg.grad, xe.grad, **tol)


@needs_nvrtc
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64])
def test_generated_cuda_compiles_scatters_combining_in_place(dtype):
    """Scatters beyond the pair cap in every mode, with self and without, are atomic adds and
    compare-and-swap loops (products, maxima, minima) that NVRTC compiles."""
    def every(x, i, s):
        return tuple(x.scatter_reduce(0, i, s, mode, include_self=inc) * 1
                     for mode in ("sum", "prod", "mean", "amax", "amin") for inc in (True, False))
    g = torch.Generator().manual_seed(3)
    i = torch.randint(0, 1500, (6000, 8), generator=g)
    x, s = (torch.randn(2000, 8, generator=g) * 5).to(dtype), torch.ones(6000, 8, dtype=dtype)
    compiled = torch.compile(every, backend=lambda gm, ex: braze.braze_backend(
        gm, ex, Options(cuda_codegen_only=True, strict=True)))
    out, sources = braze.run_and_get_code(compiled, x, i, s)
    assert len(sources) == 1
    for combine in ("add", "prod", "max", "min"):
        assert f"braze_atomic_{combine}(" in sources[0]
    torch.testing.assert_close(out, every(x, i, s))


@needs_nvrtc
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_generated_cuda_compiles_half_precision_adds_in_place(dtype):
    """A half-precision index_put sum of more values per element than the ordered reductions
    follow adds in place: a compare-and-swap of the 32-bit word holding each element."""
    fn = lambda x, i, s: x.index_put((i,), s, accumulate=True) * 2
    x, s = torch.randn(2, 4).to(dtype), torch.randn(40, 4).to(dtype)
    i = torch.arange(40) % 2
    compiled = torch.compile(fn, backend=lambda gm, ex: braze.braze_backend(
        gm, ex, Options(cuda_codegen_only=True, strict=True)))
    out, sources = braze.run_and_get_code(compiled, x, i, s)
    suffix = "bf16" if dtype == torch.bfloat16 else "f16"
    assert f"braze_atomic_add_{suffix}(" in sources[0]
    torch.testing.assert_close(out, fn(x, i, s))
