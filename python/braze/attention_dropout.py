"""Attention with dropout as two ops that autograd knows, so that a training graph saves the
output and its log-sum-exp (rows) rather than the dropped probabilities (Sq x Sk per head):

    braze::attention_dropout(q, k, v, bias, seed, p, causal, scale) -> (out, lse)
    braze::attention_dropout_backward(dout, q, k, v, bias, out, lse, seed, p, causal, scale)
        -> (dq, dk, dv)

The probability at row-major position n of the scores [B.., Sq, Sk] is dropped where
philox_uniform(seed, n) < p (braze's Philox draw, as its random ops make them) and the rest are
scaled by 1 / (1 - p); the backward draws the same ones again from the saved seed. braze compiles
both as its fused CPU attention kernels (rules_attention); the eager implementations here, written
with PyTorch ops, run wherever braze does not, and draw exactly what braze's kernels draw. The
seed comes from torch.randint, so torch.manual_seed reproduces a run, and every call draws anew.
"""
import math
from typing import Optional

import torch

_M32 = 0xFFFFFFFF


def philox_uniform(seed, counter):
    """braze_philox_uniform (codegen/CFamily.cpp) of an int64 `seed` scalar tensor at int64
    `counter` positions: Philox4x32-10's first word as a float32 in [0, 1). The 32-bit products
    are taken in int64, whose wrap keeps their low 64 bits."""
    s = int(seed)
    k0, k1 = s & _M32, (s >> 32) & _M32
    c0, c1 = counter & _M32, (counter >> 32) & _M32
    c2 = c3 = torch.zeros_like(counter)
    for _ in range(10):
        p0, p1 = c0 * 0xD2511F53, c2 * 0xCD9E8D57
        n0 = ((p1 >> 32) & _M32) ^ c1 ^ k0
        n2 = ((p0 >> 32) & _M32) ^ c3 ^ k1
        c1, c3, c0, c2 = p1 & _M32, p0 & _M32, n0, n2
        k0, k1 = (k0 + 0x9E3779B9) & _M32, (k1 + 0xBB67AE85) & _M32
    return (c0 >> 8).to(torch.float32) * (1.0 / 16777216.0)


def keep_factor(seed, shape, p, device, dtype=torch.float32):
    """1 / (1 - p) where the draw at a position of `shape` keeps it, else 0, in `dtype`; the
    draw is compared with p in float32, as the kernels compare it."""
    n = torch.arange(math.prod(shape), dtype=torch.int64, device=device).reshape(shape)
    keep = philox_uniform(seed, n) >= torch.tensor(p, dtype=torch.float32)
    return keep.to(dtype) * (1.0 / (1.0 - p))


def _wide(x):
    return x.double() if x.dtype == torch.float64 else x.float()


def additive_mask(mask, dtype):
    """An attention mask as the scores' addend: a bool mask as 0 where True and -inf where
    False, in `dtype` (as scaled_dot_product_attention converts it); any other as it is."""
    if mask.dtype != torch.bool:
        return mask
    return torch.zeros_like(mask, dtype=dtype).masked_fill(mask.logical_not(), float("-inf"))


def _scores(q, k, bias, causal, scale):
    """scale * q·kᵀ + bias in the compute type, the keys a causal mask drops at -inf."""
    s = _wide(q) @ _wide(k).transpose(-1, -2) * scale
    if bias is not None:
        s = s + _wide(additive_mask(bias, s.dtype))
    if causal:
        sq, sk = s.shape[-2], s.shape[-1]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device=s.device).triu(1),
                          float("-inf"))
    return s


def _probabilities(s, lse):
    """exp(s - lse), 0 in rows whose every key is masked."""
    lse = lse.unsqueeze(-1)
    return torch.where(lse == float("-inf"), torch.zeros_like(s), torch.exp(s - lse))


@torch.library.custom_op("braze::attention_dropout", mutates_args=())
def attention_dropout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      bias: Optional[torch.Tensor], seed: torch.Tensor, p: float, causal: bool,
                      scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    s = _scores(q, k, bias, causal, scale)
    lse = torch.logsumexp(s, -1)
    probs = _probabilities(s, lse) * keep_factor(seed, s.shape, p, s.device, s.dtype)
    return (probs @ _wide(v)).to(q.dtype), lse


@attention_dropout.register_fake
def _(q, k, v, bias, seed, p, causal, scale):
    wide = torch.float64 if q.dtype == torch.float64 else torch.float32
    return q.new_empty(*q.shape[:-1], v.shape[-1]), q.new_empty(q.shape[:-1], dtype=wide)


@torch.library.custom_op("braze::attention_dropout_backward", mutates_args=())
def attention_dropout_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                               v: torch.Tensor, bias: Optional[torch.Tensor],
                               out: torch.Tensor, lse: torch.Tensor, seed: torch.Tensor,
                               p: float, causal: bool, scale: float
                               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    s = _scores(q, k, bias, causal, scale)
    probs = _probabilities(s, lse)
    keep = keep_factor(seed, s.shape, p, s.device, s.dtype)
    g = _wide(dout)
    dv = (probs * keep).transpose(-1, -2) @ g
    dp = g @ _wide(v).transpose(-1, -2) * keep
    delta = (g * _wide(out)).sum(-1, keepdim=True)
    ds = probs * (dp - delta) * scale
    return (ds @ _wide(k)).to(q.dtype), (ds.transpose(-1, -2) @ _wide(q)).to(k.dtype), \
        dv.to(v.dtype)


@attention_dropout_backward.register_fake
def _(dout, q, k, v, bias, out, lse, seed, p, causal, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx, inputs, output):
    q, k, v, bias, seed, p, causal, scale = inputs
    ctx.save_for_backward(q, k, v, bias, output[0], output[1], seed)
    ctx.p, ctx.causal, ctx.scale = p, causal, scale


def _backward(ctx, dout, dlse):
    q, k, v, bias, out, lse, seed = ctx.saved_tensors
    dq, dk, dv = attention_dropout_backward(dout, q, k, v, bias, out, lse, seed, ctx.p,
                                            ctx.causal, ctx.scale)
    return dq, dk, dv, None, None, None, None, None


attention_dropout.register_autograd(_backward, setup_context=_setup)


def attention_with_dropout(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                           scale=None, enable_gqa=False):
    """scaled_dot_product_attention (training, dropout_p > 0) as braze::attention_dropout, with
    a seed drawn from torch's generator for each call."""
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1]) if query.shape[-1] else 1.0
    seed = torch.randint(0, 2**48, (), dtype=torch.int64, device=query.device)
    return attention_dropout(query, key, value, attn_mask, seed, float(dropout_p),
                             bool(is_causal), float(scale))[0]
