"""FX rules for attention: the fused attention ops that AOTAutograd emits (PyTorch's CPU flash
attention, CUDA flash, memory-efficient and cuDNN attention, and scaled_dot_product_attention
itself) become one braze attention op. Only the attention output may be read: a graph that reads
the log-sum-exp or the random seeds (a training graph whose backward is an eager kernel) keeps
the op in eager PyTorch, as does dropout. CPU training graphs trace attention as PyTorch's math
path instead (trace_as_math_for_training), so that their backward compiles too."""
import math
import operator

import torch
import torch.nn.functional as F

from braze.fx_import import rule, Unsupported, aten


def _read_outputs(node):
    """The positions of node's tuple results that some node reads."""
    read = set()
    for user in node.users:
        if user.op != "call_function" or user.target is not operator.getitem:
            raise Unsupported("an attention's result tuple is used whole")
        if user.users:
            read.add(user.args[1])
    return read


def _heads_to(t, x, val, heads):
    """x (of meta value `val`, [.., Hk, S, D]) with its heads repeated in place to `heads`
    (grouped-query attention: query head h reads key head h // (heads / Hk)); a view."""
    hk = val.shape[-3]
    if not isinstance(hk, int) or hk == 0 or heads % hk:
        raise Unsupported(f"grouped-query attention of {heads} query heads over {hk} key heads")
    if hk == heads:
        return x
    dims = list(val.shape)
    grouped = dims[:-2] + [heads // hk] + dims[-2:]
    x = t.g.expand(t.g.unsqueeze(x, len(dims) - 2), t.shape(grouped))
    return t.g.reshape(x, t.shape(dims[:-3] + [heads] + dims[-2:]))


def attention(t, node, q, k, v, bias, dropout_p, is_causal, scale, tuple_size):
    if dropout_p:
        raise Unsupported("attention with dropout")
    if tuple_size and _read_outputs(node) - {0}:
        raise Unsupported("attention whose log-sum-exp or seeds are read")
    head_dim = q.meta["val"].shape[-1]
    if scale is None:
        if not isinstance(head_dim, int):
            raise Unsupported("attention with a symbolic head dim and no scale")
        scale = 1.0 / math.sqrt(head_dim) if head_dim else 1.0
    qh = t.arg(q)
    heads = q.meta["val"].shape[-3] if q.meta["val"].dim() >= 3 else None
    kh, vh = t.arg(k), t.arg(v)
    if heads is not None and k.meta["val"].shape[-3] != heads:
        if not isinstance(heads, int):
            raise Unsupported("grouped-query attention with a symbolic head count")
        kh = _heads_to(t, kh, k.meta["val"], heads)
        vh = _heads_to(t, vh, v.meta["val"], heads)
    bh = t.arg(bias) if bias is not None else None
    out = t.g.attention(qh, kh, vh, bh, float(scale), bool(is_causal))
    return (out,) + (None,) * (tuple_size - 1) if tuple_size else out


@rule(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _cpu_flash(t, node, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    return attention(t, node, q, k, v, attn_mask, dropout_p, is_causal, scale, 2)


@rule(aten._scaled_dot_product_flash_attention.default)
def _flash(t, node, q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *,
           scale=None):
    return attention(t, node, q, k, v, None, dropout_p, is_causal, scale, len(node.meta["val"]))


@rule(aten._scaled_dot_product_efficient_attention.default,
      aten._scaled_dot_product_cudnn_attention.default)
def _efficient(t, node, q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
               return_debug_mask=False, *, scale=None):
    return attention(t, node, q, k, v, attn_bias, dropout_p, is_causal, scale,
                     len(node.meta["val"]))


@rule(aten.scaled_dot_product_attention.default)
def _sdpa(t, node, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    return attention(t, node, q, k, v, attn_mask, dropout_p, is_causal, scale, 0)


# ---- training -------------------------------------------------------------------------------

def _math_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None, enable_gqa=False):
    """scaled_dot_product_attention as PyTorch's math path: products, softmax and dropout,
    which autograd differentiates op by op. The math op adds its mask to the scores, so a bool
    mask becomes 0 where True and -inf where False first, as scaled_dot_product_attention
    converts it before choosing a kernel (added as it is, True would add 1)."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(
            attn_mask.logical_not(), float("-inf"))
    return torch.ops.aten._scaled_dot_product_attention_math(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)[0]


# The math path keeps the probabilities for the backward: batch x heads x Sq x Sk of them. Above
# this many scores per call, attention keeps PyTorch's fused kernels (and their eager backward),
# whose memory grows with S rather than S^2.
MATH_TRAINING_MAX_SCORES = 1 << 26


def _scores(node):
    """How many scores attention `node` computes, from Dynamo's example values; None when a
    size is symbolic."""
    args = list(node.args[:2]) + [node.kwargs.get(n) for n in ("query", "key")[len(node.args):]]
    q, k = (a.meta.get("example_value") if isinstance(a, torch.fx.Node) else None for a in args)
    if not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor):
        return None
    try:
        return math.prod(int(d) for d in q.shape[:-1]) * int(k.shape[-2])
    except (TypeError, RuntimeError):
        return None


# Whether CUDA training graphs take the math path too (see trace_as_math_for_training).
MATH_TRAINING_ON_CUDA = False


def trace_as_math_for_training(gm, example_inputs):
    """In a CPU training graph (grad mode on, an input that requires grad), rewrites Dynamo's
    scaled_dot_product_attention calls to the math path before AOTAutograd, so that it does not
    pick a fused kernel whose backward is an eager kernel reading the forward's log-sum-exp: the
    forward and backward graphs then hold only products, softmax and pointwise ops, all of which
    braze compiles. The saved probabilities cost Sq x Sk per head, so a call with more than
    MATH_TRAINING_MAX_SCORES scores (or symbolic sizes) keeps PyTorch's fused attention.
    CUDA graphs keep PyTorch's fused attention and its backward (in eager) unless
    MATH_TRAINING_ON_CUDA: traced as the math path, the H100 GPT-2 6-layer f32 train step of
    benchmarks/gpu_models.py took 25.3 ms (0.82x eager), against 22.6 ms (0.93x eager, another
    run) with the fused kernels; after the padded logits and the min-cut partition, 22.64 ms
    against 22.58 ms (one process, CUDA events around each step, median of 10)."""
    tensors = [a for a in example_inputs if isinstance(a, torch.Tensor)]
    if (not torch.is_grad_enabled() or not any(t.requires_grad for t in tensors)
            or (any(t.device.type != "cpu" for t in tensors) and not MATH_TRAINING_ON_CUDA)):
        return
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (
                torch._C._nn.scaled_dot_product_attention, F.scaled_dot_product_attention):
            scores = _scores(node)
            if scores is not None and scores <= MATH_TRAINING_MAX_SCORES:
                node.target = _math_attention
                changed = True
    if changed:
        gm.recompile()
