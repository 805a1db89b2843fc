"""Attention: PyTorch's attention ops become one braze attention op. Where the target fuses it
(f32 on the CPU; f16/bf16 on CUDA) it runs as one kernel with an online softmax, elsewhere it
decomposes into matmul + softmax + matmul. Either way it matches eager: causal and not, float and
bool masks (a row with every key masked gives 0), grouped-query heads, strided projections,
explicit scales, dynamic sequence lengths, and training graphs (traced as PyTorch's math path,
forward and backward compiled whole)."""
import os

import pytest
import torch
import torch.nn.functional as F

import braze
from braze import background


@pytest.fixture(autouse=True)
def compile_cuda_training_attention(monkeypatch):
    """These tests check the compiled training path on CUDA too (off by default there)."""
    from braze import rules_attention
    monkeypatch.setattr(rules_attention, "COMPILE_CUDA_TRAINING_ATTENTION", True)


def _compile(fn, **kw):
    torch._dynamo.reset()
    return torch.compile(fn, backend="braze", **kw)


def _tolerance(dtype):
    return {torch.float32: dict(atol=2e-5, rtol=1.3e-5), torch.float64: dict(atol=1e-7, rtol=1e-7),
            torch.float16: dict(atol=2e-3, rtol=2e-3), torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2)}[dtype]


def _dtypes(device):
    return [torch.float32, torch.float16, torch.bfloat16] if device == "cuda" else \
        [torch.float32, torch.float64, torch.bfloat16]


def _assert_matches(got, want, args, fn, dtype):
    """got equals eager's `want`. In f16/bf16 the reference is fn in f32 (rounded to dtype),
    and braze may differ from it by at most twice eager's own error (or the dtype tolerance):
    a fused kernel that skips eager's intermediate roundings must be as accurate as eager."""
    tol = _tolerance(dtype)
    if dtype in (torch.float16, torch.bfloat16):
        wide = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                for a in args]
        with torch.no_grad():
            ref = fn(*wide).to(dtype)
        finite = torch.isfinite(ref)
        eager_err = (want.float() - ref.float())[finite].abs().max().item() if finite.any() else 0
        tol = dict(atol=max(2 * eager_err, tol["atol"]), rtol=tol["rtol"])
        want = ref
    torch.testing.assert_close(got, want, **tol, equal_nan=True)


def _check(fn, *args, dtype=torch.float32, **kw):
    """Compiled fn matches eager fn (see _assert_matches), with no fallback op; returns the
    compiled result."""
    before = braze.counters()["fallback_ops"]
    with torch.no_grad():
        got = _compile(fn, **kw)(*args)
        want = fn(*args)
    _assert_matches(got, want, args, fn, dtype)
    assert braze.counters()["fallback_ops"] == before
    return got


# (batch, heads, query rows, key rows, head dim, value head dim)
SHAPES = [(2, 3, 40, 50, 8, 8), (1, 4, 300, 300, 64, 64), (2, 2, 5, 7, 16, 16),
          (1, 2, 33, 129, 32, 16), (3, 1, 1, 17, 128, 128), (1, 2, 260, 70, 80, 80)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_matches_eager(device, shape, causal):
    torch.manual_seed(0)
    b, h, sq, sk, d, dv = shape
    for dtype in _dtypes(device):
        q = torch.randn(b, h, sq, d, dtype=dtype)
        k = torch.randn(b, h, sk, d, dtype=dtype)
        v = torch.randn(b, h, sk, dv, dtype=dtype)
        _check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
               q, k, v, dtype=dtype)


@pytest.mark.parametrize("mask_shape", [(2, 1, 24, 40), (24, 40), (1, 40), (2, 3, 24, 40)],
                         ids=lambda s: "x".join(map(str, s)))
def test_additive_masks_broadcast(device, mask_shape):
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 3, 24, 16), torch.randn(2, 3, 40, 16), torch.randn(2, 3, 40, 16)
    mask = torch.randn(mask_shape)
    _check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, mask)


def test_bool_mask_with_a_fully_masked_row_gives_zero(device):
    torch.manual_seed(2)
    q, k, v = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    keep = torch.rand(6, 9) > 0.4
    keep[3] = False  # query 3 sees no key
    keep[0, 0] = True
    got = _check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=keep), q, k, v)
    assert torch.equal(got[:, :, 3], torch.zeros_like(got[:, :, 3]))


def test_grouped_query_attention(device):
    torch.manual_seed(3)
    q = torch.randn(2, 8, 20, 16)
    k, v = torch.randn(2, 2, 20, 16), torch.randn(2, 2, 20, 16)
    _check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                          enable_gqa=True), q, k, v)


def _repeat_kv(x, n):
    b, g, s, d = x.shape
    return x[:, :, None].expand(b, g, n, s, d).reshape(b, g * n, s, d)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_keys_repeated_per_query_head(device, dtype):
    """A LLaMA-style block repeats 2 key/value heads for 8 query heads (repeat_kv) and reads
    the result transposed back to rows: grouped-attention reads the keys and values once per
    group, in place, and the rows are written where the projection reads them."""
    torch.manual_seed(5)
    q = torch.randn(2, 8, 24, 16, dtype=dtype)
    k, v = torch.randn(2, 2, 24, 16, dtype=dtype), torch.randn(2, 2, 24, 16, dtype=dtype)
    w = torch.randn(128, 32, dtype=dtype) / 8

    def block(q, k, v, w):
        o = F.scaled_dot_product_attention(q, _repeat_kv(k, 4), _repeat_kv(v, 4), is_causal=True)
        return o.transpose(1, 2).reshape(2, 24, 128) @ w

    _check(block, q, k, v, w, dtype=dtype)


def test_explicit_scale_and_sequence_longer_than_keys(device):
    torch.manual_seed(4)
    q, k, v = torch.randn(1, 2, 70, 32), torch.randn(1, 2, 30, 32), torch.randn(1, 2, 30, 32)
    _check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3),
           q, k, v)


class SelfAttention(torch.nn.Module):
    """A transformer attention block: q, k and v are strided views of one projection, and the
    output is transposed back and projected."""

    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, d))


def test_attention_block_on_strided_projections(device):
    torch.manual_seed(5)
    block = SelfAttention().eval()
    _check(block, torch.randn(3, 37, 64))


def test_dynamic_sequence_length(device):
    torch.manual_seed(6)
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    compiled = _compile(fn, dynamic=True)
    with torch.no_grad():
        for s in (17, 40, 65):
            q, k, v = (torch.randn(2, 2, s, 16) for _ in range(3))
            torch.testing.assert_close(compiled(q, k, v), fn(q, k, v), **_tolerance(torch.float32))


def test_training_compiles_attention_and_its_backward(device):
    """In training, PyTorch's fused attention, its log-sum-exp and its backward compile (CPU
    flash attention; CUDA memory-efficient attention), so the forward and backward graphs
    compile whole, with no op left to eager, and values and gradients match."""
    torch.manual_seed(7)
    block = SelfAttention()
    x = torch.randn(2, 12, 64, requires_grad=True)
    compiled = _compile(block)
    before = braze.counters()["fallback_ops"]
    out = compiled(x)
    out.sum().backward()
    got = [x.grad.clone()] + [p.grad.clone() for p in block.parameters()]
    x.grad = None
    block.zero_grad()
    want_out = block(x)
    want_out.sum().backward()
    want = [x.grad] + [p.grad for p in block.parameters()]
    assert braze.counters()["fallback_ops"] == before
    torch.testing.assert_close(out, want_out, atol=2e-5, rtol=1.3e-5)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


def test_invalid_attention_is_a_clear_error():
    g = braze._C.Graph()
    s = [g.sym_const(n) for n in (2, 5, 8)]
    q = g.input("q", "f32", s, [])
    k = g.input("k", "f32", [s[0], s[1], g.sym_const(4)], [])
    g.set_name("attn")
    with pytest.raises(braze.CompileError,
                       match=r"attention \(node 'attn'\): key's last dim 4 must equal query's 8"):
        g.attention(q, k, k, None, 0.5, False)
    v = g.input("v", "f32", s, [])
    m = g.input("m", "f32", [g.sym_const(3), g.sym_const(5)], [])
    with pytest.raises(braze.CompileError, match=r"bias \[3, 5\] does not broadcast to the scores "
                                                 r"\[2, 5, 5\]"):
        g.attention(q, v, v, m, 0.5, False)


def _memory_case(name):
    """benchmarks/cpu_attention_memory.py's case `name`: (peak RSS growth MiB, scores MiB, max
    error, fallback ops), measured in a fresh process."""
    import importlib.util
    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks",
                        "cpu_attention_memory.py")
    spec = importlib.util.spec_from_file_location("cpu_attention_memory", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.run_case(name)


@pytest.mark.cpu_only("the bound is on host memory")
def test_long_sequence_runs_in_bounded_memory():
    """S = 4096, 8 heads, head dim 64, f32: the scores alone would be 512 MiB; the fused kernel
    holds a block per thread."""
    grown, scores, err, fallbacks = _memory_case("forward S=4096")
    assert fallbacks == 0 and err < 1e-4
    assert grown < scores / 4, f"peak memory grew by {grown} MiB; the scores are {scores} MiB"


# ---- attention written out (fuse-attention) --------------------------------------------------

def _written_out(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) / 8.0, -1) @ v


def _written_out_masked(q, k, v, keep, bias):
    """BERT-style: scale, an additive bias, a bool mask, the softmax in f32."""
    s = q @ k.transpose(-1, -2) * 0.3 + bias
    s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s.float(), -1).to(q.dtype) @ v


def test_written_out_attention_matches_eager(device):
    torch.manual_seed(8)
    for dtype in _dtypes(device):
        q, k, v = (torch.randn(2, 4, 48, 64, dtype=dtype) for _ in range(3))
        _check(_written_out, q, k, v, dtype=dtype)


def test_written_out_masked_attention_keeps_nan_rows(device):
    """A softmax written out gives nan for a row whose every key is masked (unlike PyTorch's
    attention ops, which give 0); the fused op keeps that."""
    torch.manual_seed(9)
    for dtype in _dtypes(device):
        q, k, v = (torch.randn(2, 3, 20, 32, dtype=dtype) for _ in range(3))
        keep = torch.rand(20, 20) > 0.3
        keep[5] = False
        keep[:, 0] = True
        keep[5, 0] = False
        bias = torch.randn(2, 1, 1, 20, dtype=dtype)
        before = braze.counters()["fallback_ops"]
        with torch.no_grad():
            got = _compile(_written_out_masked)(q, k, v, keep, bias)
            want = _written_out_masked(q, k, v, keep, bias)
        assert braze.counters()["fallback_ops"] == before
        assert torch.isnan(got[:, :, 5]).all() and torch.isnan(want[:, :, 5]).all()
        # the softmax runs in f32 whatever the operands' dtype: f64 results carry its rounding
        _assert_matches(got, want, (q, k, v, keep, bias), _written_out_masked,
                        torch.float32 if dtype == torch.float64 else dtype)


def _math_upcast(q, k, v, keep):
    """PyTorch's math attention for f16/bf16 operands as AOTAutograd traces it with a bool mask:
    widened to f32, q and kᵀ each scaled by d^-1/4, the mask as 0/-inf, the safe softmax, and
    the result rounded back."""
    c = q.shape[-1] ** -0.25
    mask = torch.where(keep, 0.0, float("-inf")).to(q.dtype).float()
    s = (q.float() * c) @ (k.float().transpose(-1, -2) * c) + mask
    p = torch.ops.aten._safe_softmax(s, -1)
    return (p @ v.float()).to(q.dtype)


def test_math_attention_in_f32_for_half_operands_matches_eager(device):
    """The f32 form above becomes one half-precision attention op (safe, with the mask as its
    bias), which matches eager, a fully masked row included (0, from the safe softmax)."""
    torch.manual_seed(10)
    for dtype in [t for t in _dtypes(device) if t in (torch.float16, torch.bfloat16)]:
        q, k, v = (torch.randn(2, 3, 40, 32, dtype=dtype, device=device) for _ in range(3))
        keep = torch.rand(2, 1, 40, 40, device=device) > 0.3
        keep[:, :, 7] = False
        got = _check(_math_upcast, q, k, v, keep, dtype=dtype)
        assert (got[:, :, 7] == 0).all()


def _position_mask(kind, sq, sk, dtype, device):
    """Masks built from positions as Hugging Face models build them when traced."""
    q = torch.arange(sq, device=device)[:, None]
    k = torch.arange(sk, device=device)[None, :]
    zero = torch.zeros((), dtype=dtype, device=device)
    low = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=device)
    if kind == "causal":
        return torch.where(k <= q, zero, low)
    if kind == "causal complement":
        return torch.zeros((), dtype=dtype, device=device).masked_fill(k > q, float("-inf"))
    if kind == "keeps everything":
        return torch.where(q + 0 >= 0, 0.0, float("-inf")).to(dtype).expand(sq, sk)
    if kind == "strict":  # the diagonal masked too: stays a bias (row 0 masked whole)
        return torch.where(k < q, 0.0, float("-inf")).to(dtype)
    return torch.where(k <= q + 3, zero, low)  # shifted (3 keys ahead): stays a bias


@pytest.mark.parametrize("kind", ["causal", "causal complement", "keeps everything", "strict",
                                  "shifted"])
def test_position_masks_match_eager(device, kind):
    """A positional mask computed inside the graph folds into the attention op (causal, or no
    mask) where it is one; the results match eager either way."""
    torch.manual_seed(11)

    def fn(q, k, v):
        m = _position_mask(kind, q.shape[-2], k.shape[-2], q.dtype, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    for dtype in _dtypes(device):
        q, k, v = (torch.randn(2, 3, 24, 16, dtype=dtype, device=device) for _ in range(3))
        _check(fn, q, k, v, dtype=dtype)


@pytest.mark.parametrize("mask", ["causal", "bool", "float", "broadcast bool"])
def test_training_with_masks_matches_eager(device, mask):
    """CPU training compiles PyTorch's flash attention and its backward with the mask as a bias:
    a bool mask counts as 0 / -inf, as scaled_dot_product_attention reads it, never as 1 / 0.
    (On CUDA the fused attention stays in eager; the values must match there too.)"""
    torch.manual_seed(11)
    b, h, s, d = 2, 3, 10, 16
    q, k, v = (torch.randn(b, h, s, d, device=device, requires_grad=True) for _ in range(3))
    keep = torch.rand(b, 1, s, s, device=device) > 0.4
    keep[..., 0] = True
    m = {"causal": None, "bool": keep.expand(b, h, s, s).contiguous(),
         "float": torch.randn(b, h, s, s, device=device),
         "broadcast bool": keep[0, 0]}[mask]

    def fn(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=m is None)

    compiled = _compile(fn)
    before = braze.counters()["fallback_ops"]
    out = compiled(q, k, v, m)
    got = torch.autograd.grad(out, (q, k, v), out.detach() * 0.5 + 1)
    want_out = fn(q, k, v, m)
    want = torch.autograd.grad(want_out, (q, k, v), want_out.detach() * 0.5 + 1)
    assert braze.counters()["fallback_ops"] == before
    torch.testing.assert_close(out, want_out, atol=2e-5, rtol=1.3e-5)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32])
def test_cuda_training_attention_over_the_score_limit_stays_fused_in_eager(device, dtype):
    """On CUDA in f32 (which braze's fused kernels do not take), attention's log-sum-exp and
    backward are computed from their scores; above MATH_TRAINING_MAX_SCORES scores per call the
    fused op and its backward run in eager (counted as fallbacks), and the results still
    match."""
    if device != "cuda":
        pytest.skip("the score limit is CUDA's")
    from braze import rules_attention
    torch.manual_seed(3)
    s = 4096
    q, k, v = (torch.randn(1, 5, s, 64, dtype=dtype, requires_grad=True) for _ in range(3))
    assert 5 * s * s > rules_attention.MATH_TRAINING_MAX_SCORES

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q * 1.5, k, v, is_causal=True)

    got, want, fallbacks = _fused_training(fn, (q, k, v))
    assert fallbacks >= 2  # the forward and the backward op
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **tol)


def test_cuda_training_attention_stays_in_eager_without_the_math_path(device, monkeypatch):
    """With COMPILE_CUDA_TRAINING_ATTENTION and the math path on CUDA off, CUDA training keeps
    the fused attention op and its backward in eager, counted as fallbacks; the CPU compiles
    them."""
    from braze import rules_attention
    monkeypatch.setattr(rules_attention, "COMPILE_CUDA_TRAINING_ATTENTION", False)
    monkeypatch.setattr(rules_attention, "MATH_TRAINING_UNFUSED_ON_CUDA", False)
    torch.manual_seed(4)
    q, k, v = (torch.randn(2, 3, 40, 16, requires_grad=True) for _ in range(3))

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    got, want, fallbacks = _fused_training(fn, (q, k, v))
    assert (fallbacks >= 2) == (device == "cuda")
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_training_attention_compiles_by_default(device, monkeypatch, dtype):
    """By default nothing of training attention runs in eager on either device: on CUDA, f32
    calls (which braze's fused CUDA kernels do not take) are traced as the math path, and bf16
    ones run the fused kernels; the values and gradients are eager's."""
    from braze import rules_attention
    monkeypatch.setattr(rules_attention, "COMPILE_CUDA_TRAINING_ATTENTION", False)
    torch.manual_seed(5)
    q, k, v = (torch.randn(2, 3, 40, 16, dtype=dtype, requires_grad=True) for _ in range(3))
    mask = torch.randn(40, 40, dtype=dtype)

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask) * 2

    got, want, fallbacks = _fused_training(fn, (q, k, v))
    assert fallbacks == 0
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **tol)


def _kernel_names(fn, *args):
    """Names of the CUDA kernels one call of fn launches."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    return [e.key for e in prof.key_averages() if e.device_type.name == "CUDA"]


def _cudnn_layouts(dtype):
    """(name, fn, args, cuDNN takes it): row-major operands, grouped heads repeated by
    repeat_kv (5-d, keys and values at stride 0), odd sizes, and keys and values broadcast
    over the batch (stride 0), which do not map to cuDNN's operands."""
    def rows(b, s, h, d):  # [b, h, s, d] read from a [b, s, h, d] projection
        return torch.randn(b, s, h, d, dtype=dtype).transpose(1, 2)

    q, k, v = rows(2, 70, 8, 64), rows(2, 70, 2, 64), rows(2, 70, 2, 64)
    return [
        ("row-major causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
         (rows(2, 77, 4, 64), rows(2, 77, 4, 64), rows(2, 77, 4, 64)), True),
        ("repeat_kv", lambda q, k, v: F.scaled_dot_product_attention(
            q, _repeat_kv(k, 4), _repeat_kv(v, 4), is_causal=True), (q, k, v), True),
        ("more keys, d 128", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
         (torch.randn(1, 2, 33, 128, dtype=dtype), torch.randn(1, 2, 129, 128, dtype=dtype),
          torch.randn(1, 2, 129, 128, dtype=dtype)), True),
        ("keys and values shared by the batch", lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
         (torch.randn(2, 3, 40, 64, dtype=dtype),
          torch.randn(1, 3, 40, 64, dtype=dtype).expand(2, 3, 40, 64),
          torch.randn(1, 3, 40, 64, dtype=dtype).expand(2, 3, 40, 64)), False),
    ]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_attention_runs_on_cudnn_where_it_takes_it(device, dtype):
    """With cuDNN (PyTorch's CUDA wheels) an f16/bf16 attention runs as cuDNN's fused flash
    attention; torch.backends.cuda.enable_cudnn_sdp(False), or operands cuDNN does not take,
    run braze's own kernel. Both match eager. Offered to cuDNN, braze's kernel is deferred:
    compiled and loaded only when cuDNN declines (deferred_kernels_loaded)."""
    from braze import cuda
    if device != "cuda" or not cuda.cudnn_library():
        pytest.skip("needs CUDA and cuDNN")
    torch.manual_seed(6)
    for name, fn, args, takes in _cudnn_layouts(dtype):
        for enabled in (True, False):
            torch.backends.cuda.enable_cudnn_sdp(enabled)
            try:
                compiled = _compile(fn)
                before = braze.counters()["deferred_kernels_loaded"]
                with torch.no_grad():
                    got = compiled(*args)
                    loaded = braze.counters()["deferred_kernels_loaded"] - before
                    names = _kernel_names(compiled, *args)
                    want = fn(*args)
            finally:
                torch.backends.cuda.enable_cudnn_sdp(True)
            _assert_matches(got, want, args, fn, dtype)
            on_cudnn = any("sdpa" in n or "fmha" in n or "cudnn" in n for n in names)
            assert on_cudnn == (enabled and takes), (name, enabled, names)
            assert (loaded > 0) == (enabled and not takes), (name, enabled, loaded)


def _own_kernel_masks(sq, sk):
    """Mask tensors for braze's own CUDA kernel: a causal bool mask (whole key tiles masked), a
    padding mask over the batch ([b, 1, 1, sk]: a row stride of 0), a random bool mask with an
    empty query row and an empty stretch of keys, and an additive mask holding bf16's lowest
    value at random. (A row that value covers whole averages its keys in braze, as eager's math
    path does; eager's f32 CUDA kernel, the test's reference, scales it to -inf and gives 0.)"""
    causal = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)
    lengths = torch.tensor([sk, sk // 3])
    padding = (torch.arange(sk)[None, :] < lengths[:, None])[:, None, None, :]
    rnd = torch.rand(sq, sk) > 0.3
    rnd[5] = False
    rnd[:, 64:200] = False
    low = torch.where(torch.rand(sq, sk) > 0.5, 0.0, torch.finfo(torch.bfloat16).min)
    return {"causal": causal, "padding": padding, "random": rnd, "lowest": low}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128])
def test_cuda_own_kernel_with_mask_tensors(device, dtype, d):
    """With cuDNN off, braze's own kernel takes a mask tensor: read as pairs of adjacent keys
    where its rows are 4-byte aligned (key lengths 256 and 200, the latter ending inside a key
    tile), one value at a time otherwise (203 keys), skipping key tiles a warp's mask covers
    whole. Each matches eager."""
    if device != "cuda":
        pytest.skip("braze's own attention kernel is CUDA's")
    torch.manual_seed(12)
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        for sq, sk in ((256, 256), (130, 200), (70, 203)):
            q = torch.randn(2, 4, sq, d, dtype=dtype)
            k, v = (torch.randn(2, 4, sk, d, dtype=dtype) for _ in range(2))
            for name, mask in _own_kernel_masks(sq, sk).items():
                m = mask if mask.dtype == torch.bool else mask.to(dtype)
                _check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                       q, k, v, m, dtype=dtype)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)


def _fallbacks():
    c = braze.counters()
    return c["fallback_ops"] + c["fallback_graphs"] + c["recompiles"]


def _fused_training(fn, args, grad_scale=0.5):
    """Values and gradients of compiled fn and of eager fn, and the fallbacks (ops and whole
    graphs left to eager, and variants recompiled for inputs laid out otherwise than traced)
    counted while the compiled one ran."""
    compiled = _compile(fn)
    before = _fallbacks()
    out = compiled(*args)
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    g = torch.randn_like(out) * grad_scale
    got = [out.detach()] + list(torch.autograd.grad(out, leaves, g))
    background.wait_all()
    fallbacks = _fallbacks() - before
    out = fn(*args)
    want = [out.detach()] + list(torch.autograd.grad(out, leaves, g))
    return got, want, fallbacks


# (batch, heads, key heads, query rows, key rows, head dim): sizes off the kernel's blocks of
# 64 query rows and 256 keys, more queries than keys and fewer, grouped-query heads.
FUSED_TRAINING = [(2, 3, 3, 70, 300, 40), (1, 2, 2, 300, 70, 64), (2, 4, 2, 33, 33, 16),
                  (1, 1, 1, 1, 5, 8)]


@pytest.mark.parametrize("shape", FUSED_TRAINING, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mask", ["none", "causal", "float", "bool with an empty row"])
def test_fused_training_attention_compiles_forward_and_backward(shape, mask):
    """PyTorch's fused attention in training (CPU flash attention, CUDA memory-efficient
    attention): its output and log-sum-exp (attention and attention_lse) and its backward (one
    attention_grad per gradient) compile, with nothing left to eager, and match eager's values
    and gradients. A row with no kept key has a zero output and zero gradients."""
    torch.manual_seed(13)
    b, h, hk, sq, sk, d = shape
    q = torch.randn(b, h, sq, d, requires_grad=True)
    k, v = (torch.randn(b, hk, sk, d, requires_grad=True) for _ in range(2))
    m = None
    if mask == "float":
        m = torch.randn(b, 1, sq, sk)
    elif mask == "bool with an empty row":
        m = torch.rand(sq, sk) > 0.3
        m[0] = False
    kw = {"enable_gqa": True} if h != hk else {}

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=mask == "causal",
                                              **kw)

    got, want, fallbacks = _fused_training(fn, (q, k, v))
    assert fallbacks == 0
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4, equal_nan=True)


@pytest.mark.cpu_only("the CPU's fused dropout kernels (CUDA's math path: the statistics test)")
def test_training_with_attention_dropout_compiles():
    """Attention dropout in CPU training compiles, forward and backward: p = 1 (every score
    dropped) as PyTorch's math path, which gives every gradient 0, as eager; p = 0.3 as
    braze::attention_dropout's fused kernels (test_attention_dropout checks their draws)."""
    torch.manual_seed(14)
    q, k, v = (torch.randn(1, 2, 16, 8, requires_grad=True) for _ in range(3))
    for p, check in ((1.0, True), (0.3, False)):
        fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        got, want, fallbacks = _fused_training(fn, (q, k, v))
        assert fallbacks == 0
        if check:
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w)
        else:
            assert all(torch.isfinite(g).all() for g in got)


def test_training_with_attention_dropout_has_pytorchs_statistics(device):
    """A block's training step with attention dropout compiles whole on each device (the CPU's
    fused kernels, CUDA's math path), with nothing in eager, and its draws have dropout's
    statistics (test_attention_dropout.train_with_dropout)."""
    from test_attention_dropout import train_with_dropout
    train_with_dropout()


@pytest.mark.cpu_only("the bound is on host memory")
def test_long_sequence_backward_runs_in_bounded_memory():
    """The backward of S = 2048 attention (2 heads, f32): its scores would be 32 MiB per
    product; the fused kernels hold blocks per thread."""
    grown, scores, err, fallbacks = _memory_case("training S=2048")
    assert fallbacks == 0 and err < 1e-4
    assert grown < scores, f"peak memory grew by {grown} MiB; one product's scores are {scores} MiB"


# (batch, heads, key heads, query rows, key rows, head dim, mask): sizes off the CUDA kernels'
# tiles of 64 (and 32) rows, more queries than keys and fewer, grouped-query heads, head dims
# that are not multiples of 16, and masks: causal, additive over batch and heads, a padding
# mask of keys per batch point, and a sliding window built in the graph.
CUDA_FUSED_TRAINING = [(2, 4, 4, 128, 128, 64, "causal"), (1, 2, 2, 100, 77, 64, "none"),
                       (1, 2, 2, 200, 200, 128, "causal"), (2, 3, 3, 70, 300, 40, "float"),
                       (2, 4, 2, 96, 96, 64, "padding"), (1, 8, 2, 150, 150, 80, "causal"),
                       (1, 2, 2, 64, 96, 32, "causal"), (2, 2, 2, 130, 130, 64, "window"),
                       (1, 1, 1, 1, 5, 16, "none")]


def _half_training_reference(fn, args, g):
    """fn's value and gradients in f32 from args rounded to their half dtype, rounded back."""
    wide = [a.detach().float().requires_grad_() for a in args]
    out = fn(*wide)
    grads = torch.autograd.grad(out, wide, g.float())
    return [out.detach()] + list(grads)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("case", CUDA_FUSED_TRAINING, ids=lambda c: "x".join(map(str, c)))
def test_cuda_fused_training_attention_matches_eager(device, dtype, case):
    """On CUDA in f16 and bf16, attention's output, log-sum-exp and gradients run braze's fused
    kernels (the output and its log-sum-exp in one kernel, cuDNN's where it takes it; the
    backward recomputes the probabilities from the log-sum-exp, k's and v's gradients in one
    kernel), with nothing left to eager and no decomposition's scores: each of the output and
    the three gradients is as close to the f32 result as eager's is (within twice eager's
    error, or the dtype's tolerance)."""
    _check_fused_training(device, dtype, case)


@pytest.mark.parametrize("case", [CUDA_FUSED_TRAINING[i] for i in (3, 4, 7)],
                         ids=lambda c: "x".join(map(str, c)))
def test_cuda_fused_training_attention_without_cudnn(device, case):
    """As above with cuDNN's attention turned off (torch.backends.cuda.enable_cudnn_sdp): eager
    traces these masked attentions as memory-efficient attention, and the forward's output and
    log-sum-exp come from braze's own kernel."""
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        _check_fused_training(device, torch.bfloat16, case)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)


# (batch, heads, key heads, query rows, key rows, head dim, mask, whether cuDNN's fused backward
# takes it): causal, more keys than queries, grouped-query heads whose k and v gradients are each
# query head's own (summed after), an additive mask per query row; a padding mask broadcast over
# the query rows is one cuDNN's backward gets wrong (cuDNN 9.19), so braze's kernels take it.
CUDNN_BACKWARD = [(2, 4, 4, 128, 128, 64, "causal", True), (1, 2, 2, 64, 96, 128, "none", True),
                  (1, 8, 2, 150, 150, 64, "causal", True), (2, 4, 2, 96, 96, 64, "float", True),
                  (2, 4, 4, 96, 96, 64, "padding", False)]


@pytest.mark.parametrize("case", CUDNN_BACKWARD, ids=lambda c: "x".join(map(str, c[:-1])))
def test_cuda_attention_backward_runs_on_cudnn(device, case):
    """With cuDNN, the gradients of q, k and v are one call of cuDNN's fused attention
    backward: the backward launches cuDNN's kernels, and braze's own gradient kernels (compiled
    only where cuDNN declines) are never loaded. Where cuDNN declines, both of them run.
    Either way the gradients are as close to the f32 result as eager's are (within
    twice eager's error, or bf16's tolerance)."""
    from braze import cuda
    if device != "cuda" or not cuda.cudnn_library():
        pytest.skip("needs CUDA and cuDNN")
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("the fused kernels need sm_80")
    torch.manual_seed(22)
    q, k, v, fn = _training_case(torch.bfloat16, case)
    takes = case[-1]

    from torch.profiler import ProfilerActivity, profile
    compiled = _compile(fn)
    out = compiled(q, k, v)
    g = torch.randn_like(out)
    before = braze.counters()["deferred_kernels_loaded"]
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        grads = torch.autograd.grad(out, (q, k, v), g)
        torch.cuda.synchronize()
    loaded = braze.counters()["deferred_kernels_loaded"] - before
    names = [e.key for e in prof.key_averages() if e.device_type.name == "CUDA"]
    own = [n for n in names if n.endswith("_dq")]
    if takes:
        assert loaded == 0 and not own, (names, loaded)
        assert any("sdpa" in n and "bprop" in n for n in names), names
    else:
        assert len(own) == 1, names  # (loaded here, or by an earlier compile of this graph)
    want = _half_training_reference(fn, (q, k, v), g)[1:]
    eager = torch.autograd.grad(fn(q, k, v), (q, k, v), g)
    for got, w, e in zip(grads, want, eager):
        limit = max(2 * (e.float() - w).abs().max().item(), 1.6e-2)
        assert (got.float() - w).abs().max().item() <= limit


def test_cuda_flash_attention_training_stays_in_eager(device):
    """PyTorch's flash attention (what eager traces without a mask where cuDNN's attention is
    off) saves its random state as uint64 tensors, a dtype braze has not: in training, the op
    and its backward run in eager PyTorch, counted as two fallbacks, and the results match."""
    if device != "cuda" or torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("flash attention is CUDA's, on sm_80+")
    torch.manual_seed(5)
    q, k, v = (torch.randn(2, 4, 128, 64, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        got, want, fallbacks = _fused_training(fn, (q, k, v))
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)
    assert fallbacks == 2
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=2e-2, rtol=2e-2)


def _training_case(dtype, case):
    """q, k and v (leaves of `dtype`) and the attention fn of a training case (batch, heads,
    key heads, query rows, key rows, head dim, mask): mask "causal", "float" (additive, per
    batch point and query row), "padding" (keys per batch point), "window" (keys i - 31 .. i of
    query i, built in the graph) or "none"."""
    b, h, hk, sq, sk, d, mask = case[:7]
    q = torch.randn(b, h, sq, d, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(b, hk, sk, d, dtype=dtype, requires_grad=True) for _ in range(2))
    m = None
    if mask == "float":
        m = torch.randn(b, 1, sq, sk, dtype=dtype)
    elif mask == "padding":
        lengths = torch.tensor([sk, sk // 3])
        m = (torch.arange(sk)[None, :] < lengths[:, None])[:, None, None, :]
    kw = {"enable_gqa": True} if h != hk else {}

    def fn(q, k, v):
        attn_mask = m.to(q.dtype) if m is not None and m.is_floating_point() else m
        if mask == "window":
            i = torch.arange(q.shape[-2], device=q.device)[:, None]
            j = torch.arange(k.shape[-2], device=q.device)[None, :]
            attn_mask = (j <= i) & (j > i - 32)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                              is_causal=mask == "causal", **kw)
    return q, k, v, fn


def _check_fused_training(device, dtype, case):
    if device != "cuda":
        pytest.skip("the fused half-precision training kernels are CUDA's")
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("the fused kernels need sm_80")
    torch.manual_seed(21)
    q, k, v, fn = _training_case(dtype, case)
    g = torch.randn_like(q)

    def value_and_grads(f):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        out = f(*leaves)
        return [out.detach()] + list(torch.autograd.grad(out, leaves, g))

    compiled = _compile(fn)
    before = _fallbacks()
    got = value_and_grads(compiled)
    background.wait_all()
    assert _fallbacks() == before
    want = value_and_grads(fn)
    ref = _half_training_reference(fn, (q, k, v), g)
    tol = _tolerance(dtype)
    for name, x, w, r in zip(["out", "dq", "dk", "dv"], got, want, ref):
        eager_err = (w.float() - r).abs().max().item()
        err = (x.float() - r).abs().max().item()
        assert torch.isfinite(x).all(), name
        assert err <= max(2 * eager_err, tol["atol"] + tol["rtol"] * r.abs().max().item()), \
            f"{name}: braze's error {err} against eager's {eager_err}"


def test_cuda_fused_training_attention_of_a_long_sequence(device):
    """A causal bf16 attention over 4096 positions and 5 heads (84M scores per call, over
    MATH_TRAINING_MAX_SCORES) trains through the fused kernels: no fallback, gradients close to
    eager's."""
    if device != "cuda" or torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("the fused half-precision training kernels are CUDA's, on sm_80+")
    torch.manual_seed(3)
    s = 4096
    q, k, v = (torch.randn(1, 5, s, 64, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q * 1.5, k, v, is_causal=True)

    got, want, fallbacks = _fused_training(fn, (q, k, v))
    assert fallbacks == 0
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=2e-2, rtol=2e-2)
