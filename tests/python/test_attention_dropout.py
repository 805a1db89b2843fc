"""Attention dropout in CPU training, fused: scaled_dot_product_attention with dropout becomes
braze::attention_dropout (python/braze/attention_dropout.py), whose forward saves the output and
its log-sum-exp and whose backward draws the same dropped probabilities again from the seed.
braze's fused CPU kernels (f32) and its decomposition (other dtypes, and CUDA's written-out
attention) draw exactly what the eager ops draw, so a compiled call compares with the eager ops
at one seed; training through scaled_dot_product_attention is checked by statistics, as a draw
is not eager's."""
import math

import pytest
import torch
import torch.nn.functional as F

import braze
from braze import attention_dropout as ad
from braze import background
from braze import rules_attention

pytestmark = pytest.mark.cpu_only("braze's fused attention dropout is the CPU's; CUDA traces "
                                  "attention with dropout as the math path (test_attention)")


def _fallbacks():
    c = braze.counters()
    return c["fallback_ops"] + c["fallback_graphs"] + c["recompiles"]


def _mask(kind, b, sq, sk):
    if kind == "float":
        return torch.randn(b, 1, sq, sk)
    if kind == "bool with an empty row":
        m = torch.rand(sq, sk) > 0.3
        m[0] = False
        return m
    return None


# (batch, heads, query rows, key rows, head dim): off the CPU kernel's blocks of 64 query rows
# and 256 keys, more keys than queries and fewer.
SHAPES = [(2, 3, 70, 300, 40), (1, 2, 300, 70, 16)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16],
                         ids=["f32 fused", "f64 decomposed", "bf16 decomposed"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mask", ["none", "causal", "float", "bool with an empty row"])
def test_compiled_dropout_draws_what_the_eager_op_draws(dtype, shape, mask):
    """At one seed the compiled output and q, k and v gradients equal the eager op's within the
    dtype's rounding (the same probabilities dropped), nothing runs in eager, and the dropout
    is real: the output differs from p = 0's."""
    torch.manual_seed(21)
    b, h, sq, sk, d = shape
    q = torch.randn(b, h, sq, d, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(b, h, sk, d, dtype=dtype, requires_grad=True) for _ in range(2))
    bias = _mask(mask, b, sq, sk)
    if bias is not None and bias.dtype != torch.bool:
        bias = bias.to(dtype)
    seed = torch.tensor(2**40 + 12345, dtype=torch.int64)
    scale = 1 / math.sqrt(d)

    def fn(q, k, v, seed, p=0.25):
        return ad.attention_dropout(q, k, v, bias, seed, p, mask == "causal", scale)[0]

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="braze")
    before = _fallbacks()
    out = compiled(q, k, v, seed)
    g = torch.randn_like(out)
    got = [out.detach()] + list(torch.autograd.grad(out, (q, k, v), g))
    assert _fallbacks() == before
    ref = fn(q, k, v, seed)
    want = [ref.detach()] + list(torch.autograd.grad(ref, (q, k, v), g))
    tol = {torch.float32: 2e-4, torch.float64: 1e-10, torch.bfloat16: 4e-2}[dtype]
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, atol=tol, rtol=tol)
    undropped = fn(q, k, v, seed, p=1e-9).detach()
    assert (want[0] - undropped).abs().max() > 0.1


def test_the_draw_keeps_one_minus_p_and_scales_the_rest():
    """keep_factor, the eager ops' draw (Philox, as braze's kernels): about 1 - p of the
    positions kept (within 5 standard deviations), each scaled by 1 / (1 - p); another seed
    drops others."""
    n = (4, 8, 128, 128)
    count = math.prod(n)
    for p in (0.1, 0.5):
        f = ad.keep_factor(torch.tensor(7), n, p, "cpu")
        kept = float((f > 0).float().mean())
        assert abs(kept - (1 - p)) < 5 * math.sqrt(p * (1 - p) / count)
        assert torch.allclose(f[f > 0], torch.tensor(1 / (1 - p)))
        other = ad.keep_factor(torch.tensor(8), n, p, "cpu")  # independent: 2p(1 - p) differ
        assert abs(float(((f > 0) != (other > 0)).float().mean()) - 2 * p * (1 - p)) < 0.01


def test_philox_words_are_uniform_24_bit_fractions():
    """philox_uniform in PyTorch ops (the compiled kernels' draws are compared with it through
    the op above): float32 multiples of 2^-24 in [0, 1), at counters past 2^32 too, with the
    mean of a uniform draw."""
    seed = torch.tensor(0x123456789AB, dtype=torch.int64)
    counter = torch.arange(0, 1 << 12, dtype=torch.int64) * 977 + (1 << 33)
    u = ad.philox_uniform(seed, counter)
    assert u.dtype == torch.float32 and 0 <= float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.02
    assert torch.equal(u * 2**24, torch.floor(u * 2**24))


class _Block(torch.nn.Module):
    def __init__(self, d=32, heads=4, p=0.3):
        super().__init__()
        self.qkv, self.o, self.heads, self.p = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d), \
            heads, p

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0,
                                           is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, d))


def test_training_with_attention_dropout_is_fused(monkeypatch):
    """A block's training step with attention dropout is traced as braze::attention_dropout
    (not the math path) and has dropout's statistics (train_with_dropout)."""
    rewritten = []
    real = rules_attention.attention_with_dropout

    def counting(*args, **kwargs):
        rewritten.append(kwargs.get("dropout_p", args[4] if len(args) > 4 else None))
        return real(*args, **kwargs)

    monkeypatch.setattr(rules_attention, "attention_with_dropout", counting)
    train_with_dropout()
    assert rewritten and set(rewritten) == {0.3}  # AOTAutograd traces the call more than once


def train_with_dropout():
    """A block's training step with attention dropout compiles whole (a forward and a backward
    graph) with nothing in eager and finite gradients, and its draws have dropout's statistics
    (check_statistics)."""
    torch.manual_seed(22)
    m = _Block()
    x = torch.randn(2, 50, 32)
    torch._dynamo.reset()
    compiled = torch.compile(m, backend="braze")
    before = braze.counters()
    compiled(x).square().mean().backward()
    background.wait_all()
    after = braze.counters()
    assert after["graphs"] - before["graphs"] == 2
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())
    check_statistics(m, compiled, x)
    after = braze.counters()
    for key in ("fallback_ops", "fallback_graphs", "recompiles"):
        assert after[key] == before[key], key


def check_statistics(m, compiled, x):
    """Compiled module `m` (in training) draws anew per call, repeats a call at torch's seed,
    keeps the undropped output as its mean over many draws (dropout keeps the expectation),
    and drops nothing in eval mode. The draws are the training graph's (grad mode on; the
    outputs are let go): a call without grad runs another graph."""
    torch.manual_seed(5)
    a, b = compiled(x).detach(), compiled(x).detach()
    torch.manual_seed(5)
    again = compiled(x).detach()
    assert not torch.equal(a, b) and torch.equal(a, again)
    draws = torch.stack([compiled(x).detach() for _ in range(300)])
    m.eval()
    with torch.no_grad():
        undropped = m(x)
        # Each draw's spread about the undropped output, over the square root of the draws.
        spread = (draws - undropped).std(0) / math.sqrt(len(draws))
        assert ((draws.mean(0) - undropped).abs() <= 6 * spread + 1e-4).all()
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(m, backend="braze")(x), undropped)
    m.train()


def test_training_with_attention_dropout_runs_in_bounded_memory():
    """The backward of S = 2048 attention with dropout (2 heads, f32): the math path held
    32 MiB of probabilities per product; the fused kernels hold blocks per thread. The compiled
    gradients equal the eager op's at the same seed."""
    from test_attention import _memory_case
    grown, scores, err, fallbacks = _memory_case("training with dropout S=2048")
    assert fallbacks == 0 and err < 1e-3
    assert grown < scores, f"peak memory grew by {grown} MiB; one product's scores are {scores} MiB"
