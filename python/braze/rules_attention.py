"""FX rules for attention: the fused attention ops that AOTAutograd emits (PyTorch's CPU flash
attention, CUDA flash, memory-efficient and cuDNN attention, and scaled_dot_product_attention
itself) become one braze attention op. In training, a fused op's log-sum-exp becomes an
attention_lse op and its backward one attention_grad op per gradient: on the CPU (fused
kernels), on CUDA in f16 and bf16 with head dims up to 128 (fused kernels, sm_80 and newer),
and in other CUDA cases when COMPILE_CUDA_TRAINING_ATTENTION is on (decomposed, up to
MATH_TRAINING_MAX_SCORES scores per call; off by default, where eager's fused kernels are
faster). CUDA training calls those fused kernels do not take (f32 among them) are traced as
PyTorch's math path instead, products and a softmax that compile whole
(trace_as_math_for_training), and so are CUDA training calls with dropout. CPU training
with attention dropout is traced as braze::attention_dropout (attention_dropout.py), whose
forward and backward compile as the fused CPU kernels with their dropout, or where those do not
take it as PyTorch's math path."""
import math
import operator

import torch
import torch.nn.functional as F

from braze.attention_dropout import additive_mask, attention_with_dropout
from braze.registry import rule, Unsupported, aten, dtype_name


def _read_outputs(node):
    """The positions of node's tuple results that some node reads."""
    read = set()
    for user in node.users:
        if user.op != "call_function" or user.target is not operator.getitem:
            raise Unsupported("an attention's result tuple is used whole")
        if user.users:
            read.add(user.args[1])
    return read


def _scale_of(q, scale):
    """The attention scale: `scale`, or 1/sqrt(head dim) as PyTorch's default."""
    if scale is not None:
        return float(scale)
    head_dim = q.meta["val"].shape[-1]
    if not isinstance(head_dim, int):
        raise Unsupported("attention with a symbolic head dim and no scale")
    return 1.0 / math.sqrt(head_dim) if head_dim else 1.0


def _operands(t, q, k, v, bias):
    """The braze values of q, k, v and the bias (GraphBuilder::attention repeats the key and
    value heads of grouped-query attention)."""
    return t.arg(q), t.arg(k), t.arg(v), (t.arg(bias) if bias is not None else None)


# Whether CUDA training graphs compile the fused attention ops' log-sum-exp and backward where
# braze's fused CUDA kernels do not take them (f32, f64, head dims over
# FUSED_CUDA_BACKWARD_MAX_HEAD_DIM, before sm_80): decomposed, they compute their scores.
# Off: the H100 GPT-2 6-layer f32 train step of benchmarks/gpu_models.py took 23.37 ms
# compiled against 18.99 ms with the fused ops and their backward in eager (TorchInductor,
# which keeps them in eager too: 17.29 and 16.03 ms in those runs), and the decomposed
# backward holds its scores.
COMPILE_CUDA_TRAINING_ATTENTION = False


# The widest head braze's fused CUDA log-sum-exp and gradient kernels take (the driver's
# DecomposeOptions::fusedAttentionBackwardMaxHeadDim).
FUSED_CUDA_BACKWARD_MAX_HEAD_DIM = 128


def _fused_on_cuda(qv, vv):
    """Whether braze's fused CUDA kernels compute this attention's log-sum-exp and gradients:
    f16 or bf16 operands, static head dims up to FUSED_CUDA_BACKWARD_MAX_HEAD_DIM, sm_80+."""
    dims = [qv.shape[-1]] + ([vv.shape[-1]] if vv is not None else [])
    return qv.dtype in (torch.float16, torch.bfloat16) and \
        all(isinstance(d, int) and 1 <= d <= FUSED_CUDA_BACKWARD_MAX_HEAD_DIM for d in dims) and \
        torch.cuda.get_device_capability(qv.device) >= (8, 0)


def _check_training(q, k, v):
    """On CUDA, attention's log-sum-exp and backward run braze's fused kernels where they take
    them (_fused_on_cuda). Elsewhere they compute their batch x heads x Sq x Sk scores, which
    are bounded as the math path's are (eager's fused kernels, whose memory grows with S, take
    larger ones)."""
    qv, kv = q.meta["val"], k.meta["val"]
    if qv.device.type != "cuda" or _fused_on_cuda(qv, v.meta["val"] if v is not None else None):
        return
    if not COMPILE_CUDA_TRAINING_ATTENTION:
        raise Unsupported("attention training on CUDA (COMPILE_CUDA_TRAINING_ATTENTION is off)")
    scores = _score_count(qv, kv)
    if scores is None:
        raise Unsupported("attention training with symbolic sizes on CUDA")
    if scores > MATH_TRAINING_MAX_SCORES:
        raise Unsupported(f"attention training on CUDA with {scores} scores per call (over "
                          f"{MATH_TRAINING_MAX_SCORES})")


_FORWARD_OPS = (aten._scaled_dot_product_flash_attention_for_cpu.default,
                aten._scaled_dot_product_flash_attention.default,
                aten._scaled_dot_product_efficient_attention.default,
                aten._scaled_dot_product_cudnn_attention.default,
                aten.scaled_dot_product_attention.default)


def unify_lengths(gm):
    """An attention's keys and values have one length. A cache that grows (transformers'
    DynamicCache) gives the key and the value tensors a size symbol each, which PyTorch's
    attention kernels do not relate: braze guards that they are equal (as the kernels require,
    so the guard holds wherever eager runs), and the shape environment makes them one symbol."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in _FORWARD_OPS or len(node.args) < 3:
            continue
        k, v = (a.meta.get("val") if isinstance(a, torch.fx.Node) else None
                for a in node.args[1:3])
        if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor) or k.dim() < 2:
            continue
        kn, vn = k.shape[-2], v.shape[-2]
        if isinstance(kn, torch.SymInt) and isinstance(vn, torch.SymInt) \
                and kn.node.expr != vn.node.expr:
            bool(kn == vn)  # a guard; an equality of two symbols becomes a replacement


def attention(t, node, q, k, v, bias, dropout_p, is_causal, scale, tuple_size, lse=False):
    """The attention op; with `lse`, result 1 (the log-sum-exp a training graph saves for the
    backward) may be read too, and becomes an attention_lse op. The fused CUDA ops' other
    results (random seeds and offsets, unused without dropout) are zeros of their meta shape."""
    if dropout_p:
        raise Unsupported("attention with dropout")
    read = _read_outputs(node) if tuple_size else {0}
    if not lse and read - {0}:
        raise Unsupported("attention whose log-sum-exp or seeds are read")
    scale = _scale_of(q, scale)
    qh, kh, vh, bh = _operands(t, q, k, v, bias)
    out = t.g.attention(qh, kh, vh, bh, scale, bool(is_causal))
    if not tuple_size:
        return out
    vals = node.meta["val"]
    if read - {0}:
        _check_training(q, k, v)
    results = [out] + [None] * (tuple_size - 1)
    for i in sorted(read - {0}):
        if i == 1:
            log_sum_exp = t.g.attention_lse(qh, kh, bh, scale, bool(is_causal))
            results[1] = t.g.lse_in_layout(log_sum_exp, t.shape(list(vals[1].shape)))
        elif isinstance(vals[i], torch.Tensor):
            results[i] = t.g.full(0.0, dtype_name(vals[i].dtype), t.shape(list(vals[i].shape)))
        else:
            raise Unsupported(f"attention result {i} ({type(vals[i]).__name__}) is read")
    return tuple(results)


@rule(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _cpu_flash(t, node, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    return attention(t, node, q, k, v, attn_mask, dropout_p, is_causal, scale, 2, lse=True)


def attention_backward(t, node, grad_out, q, k, v, out, logsumexp, bias, dropout_p, is_causal,
                       scale, tuple_size=3):
    """The gradients of a fused attention: one attention_grad op per gradient read (of q, k and
    v; a bias's gradient is not taken; under grouped-query attention GraphBuilder::attentionGrad
    sums a key head's gradient over the query heads that read it)."""
    if dropout_p:
        raise Unsupported("attention backward with dropout")
    read = _read_outputs(node)
    if read - {0, 1, 2}:
        raise Unsupported("the gradient of an attention bias")
    _check_training(q, k, v)
    scale = _scale_of(q, scale)
    qh, kh, vh, bh = _operands(t, q, k, v, bias)
    lse = t.g.lse_from_layout(t.arg(logsumexp), qh)
    args = (t.arg(grad_out), qh, kh, vh, t.arg(out), lse, bh, scale, bool(is_causal))
    grads = tuple(t.g.attention_grad(wrt, *args) if i in read else None
                  for i, wrt in enumerate("qkv"))
    return grads + (None,) * (tuple_size - 3)


@rule(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def _cpu_flash_backward(t, node, grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, *,
                        attn_mask=None, scale=None):
    return attention_backward(t, node, grad_out, q, k, v, out, logsumexp, attn_mask, dropout_p,
                              is_causal, scale)


@rule(aten._scaled_dot_product_efficient_attention_backward.default)
def _efficient_backward(t, node, grad_out, q, k, v, attn_bias, out, logsumexp, philox_seed,
                        philox_offset, dropout_p, grad_input_mask, is_causal=False, *,
                        scale=None):
    return attention_backward(t, node, grad_out, q, k, v, out, logsumexp, attn_bias, dropout_p,
                              is_causal, scale, tuple_size=4)


@rule(aten._scaled_dot_product_flash_attention_backward.default)
def _flash_backward(t, node, grad_out, q, k, v, out, logsumexp, cum_seq_q, cum_seq_k, max_q,
                    max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    return attention_backward(t, node, grad_out, q, k, v, out, logsumexp, None, dropout_p,
                              is_causal, scale)


@rule(aten._scaled_dot_product_cudnn_attention_backward.default)
def _cudnn_backward(t, node, grad_out, q, k, v, out, logsumexp, philox_seed, philox_offset,
                    attn_bias, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, *,
                    scale=None):
    return attention_backward(t, node, grad_out, q, k, v, out, logsumexp, attn_bias, dropout_p,
                              is_causal, scale)


@rule(aten._scaled_dot_product_flash_attention.default)
def _flash(t, node, q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *,
           scale=None):
    return attention(t, node, q, k, v, None, dropout_p, is_causal, scale, len(node.meta["val"]),
                     lse=True)


@rule(aten._scaled_dot_product_efficient_attention.default,
      aten._scaled_dot_product_cudnn_attention.default)
def _efficient(t, node, q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
               return_debug_mask=False, *, scale=None):
    return attention(t, node, q, k, v, attn_bias, dropout_p, is_causal, scale,
                     len(node.meta["val"]), lse=True)


@rule(aten.scaled_dot_product_attention.default)
def _sdpa(t, node, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    return attention(t, node, q, k, v, attn_mask, dropout_p, is_causal, scale, 0)


# ---- training -------------------------------------------------------------------------------

def _check_dropout_device(q):
    """braze's attention dropout is its CPU kernels' (and their decomposition's)."""
    if q.meta["val"].device.type != "cpu":
        raise Unsupported("attention dropout on CUDA (braze's CUDA kernels have none)")


@rule(torch.ops.braze.attention_dropout.default)
def _attention_dropout(t, node, q, k, v, bias, seed, p, causal, scale):
    """braze::attention_dropout: the attention with its dropout, and its log-sum-exp."""
    _check_dropout_device(q)
    qh, kh, vh, bh = _operands(t, q, k, v, bias)
    out = t.g.attention(qh, kh, vh, bh, float(scale), bool(causal), dropout=float(p),
                        seed=t.arg(seed))
    return out, t.g.attention_lse(qh, kh, bh, float(scale), bool(causal))


@rule(torch.ops.braze.attention_dropout_backward.default)
def _attention_dropout_backward(t, node, dout, q, k, v, bias, out, lse, seed, p, causal, scale):
    """braze::attention_dropout_backward: one attention_grad op per gradient read."""
    _check_dropout_device(q)
    read = _read_outputs(node)
    qh, kh, vh, bh = _operands(t, q, k, v, bias)
    args = (t.arg(dout), qh, kh, vh, t.arg(out), t.arg(lse), bh, float(scale), bool(causal))
    return tuple(t.g.attention_grad(wrt, *args, dropout=float(p), seed=t.arg(seed))
                 if i in read else None for i, wrt in enumerate("qkv"))


def _math_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None, enable_gqa=False):
    """scaled_dot_product_attention as PyTorch's math path: products, softmax and dropout,
    which autograd differentiates op by op. The math op adds its mask to the scores, so a bool
    mask becomes 0 where True and -inf where False first, as scaled_dot_product_attention
    converts it before choosing a kernel (added as it is, True would add 1)."""
    if attn_mask is not None:
        attn_mask = additive_mask(attn_mask, query.dtype)
    return torch.ops.aten._scaled_dot_product_attention_math(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)[0]


# The math path keeps the probabilities for the backward: batch x heads x Sq x Sk of them. Above
# this many scores per call, attention with dropout keeps PyTorch's fused kernels (and their
# eager backward), whose memory grows with S rather than S^2.
MATH_TRAINING_MAX_SCORES = 1 << 26


_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
              "enable_gqa")


def _sdpa_args(node):
    """A scaled_dot_product_attention call's arguments by name (those it was given)."""
    args = dict(zip(_SDPA_ARGS, node.args))
    args.update(node.kwargs)
    return args


def _example(a):
    """Dynamo's example value of FX argument `a`; None for anything but a node."""
    return a.meta.get("example_value") if isinstance(a, torch.fx.Node) else None


def _scores(node):
    """How many scores attention `node` computes, from Dynamo's example values; None when a
    size is symbolic."""
    args = _sdpa_args(node)
    q, k = _example(args.get("query")), _example(args.get("key"))
    if not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor):
        return None
    return _score_count(q, k)


def _score_count(q, k):
    """How many scores attention of query `q` over keys `k` computes: batch x heads x Sq x Sk;
    None when a size is symbolic."""
    try:
        return math.prod(int(d) for d in q.shape[:-1]) * int(k.shape[-2])
    except (TypeError, RuntimeError):
        return None


def _has_dropout(node):
    """Whether attention `node` may drop (a dropout_p that is not the constant 0)."""
    p = _sdpa_args(node).get("dropout_p", 0.0)
    return not (isinstance(p, (int, float)) and p == 0)


def _fused_dropout(node):
    """Whether CPU attention `node` with dropout can be braze::attention_dropout: a constant p
    in (0, 1), query, key and value of one floating dtype and head count (grouped heads take
    the math path), and a mask (if any) that needs no gradient."""
    args = _sdpa_args(node)
    val = [_example(args.get(name)) for name in ("query", "key", "value")]
    mask = args.get("attn_mask")
    mask = _example(mask) if isinstance(mask, torch.fx.Node) else mask
    p = args.get("dropout_p", 0.0)
    if not all(isinstance(x, torch.Tensor) for x in val) or not isinstance(p, (int, float)):
        return False
    q, k, v = val
    return (0 < p < 1 and q.dtype.is_floating_point and k.dtype == q.dtype == v.dtype
            and q.dim() == k.dim() == v.dim() and q.dim() >= 2
            and (q.dim() < 3 or k.shape[-3] == q.shape[-3] == v.shape[-3])
            and (mask is None or (isinstance(mask, torch.Tensor) and not mask.requires_grad
                                  and mask.dim() <= q.dim())))


# Whether CUDA training graphs take the math path for every call (MATH_TRAINING_ON_CUDA), or
# only for calls braze's fused CUDA kernels do not take (MATH_TRAINING_UNFUSED_ON_CUDA), and
# whether CPU calls without dropout take it too (see trace_as_math_for_training;
# benchmarks/cpu_attention_training.py compares the two on the CPU).
MATH_TRAINING_ON_CUDA = False
MATH_TRAINING_UNFUSED_ON_CUDA = True
# Whether CUDA training calls with dropout take the math path (braze's CUDA kernels have no
# dropout), up to MATH_TRAINING_MAX_SCORES scores per call; else they stay in eager, counted.
MATH_TRAINING_DROPOUT_ON_CUDA = True
MATH_TRAINING_WITHOUT_DROPOUT = False
# Whether CPU training calls with dropout become braze::attention_dropout (the fused kernels'
# dropout) rather than the math path.
FUSED_CPU_DROPOUT = True


def _under_autocast(gm):
    """Whether CUDA autocast is on around graph `gm` or entered in it."""
    return torch.is_autocast_enabled("cuda") or any(
        n.op == "call_function" and n.target is torch.amp.autocast_mode._enter_autocast
        for n in gm.graph.nodes)


def _unfused_on_cuda(node):
    """Whether braze's fused CUDA kernels would not take the training form of attention `node`
    (_fused_on_cuda), as far as its example values tell (outside autocast, which may run the
    call in a narrower type than its operands')."""
    args = _sdpa_args(node)
    q, v = _example(args.get("query")), _example(args.get("value"))
    if not isinstance(q, torch.Tensor) or q.device.type != "cuda":
        return False
    return not _fused_on_cuda(q, v if isinstance(v, torch.Tensor) else None)


def trace_as_math_for_training(gm, example_inputs):
    """In a training graph (grad mode on, an input that requires grad), rewrites Dynamo's
    scaled_dot_product_attention calls before AOTAutograd where braze could not compile the
    fused kernel's training form:
      - on the CPU, calls with dropout: as braze::attention_dropout (_fused_dropout), whose
        forward saves the output and its log-sum-exp and whose backward draws the dropped
        probabilities again; other calls with dropout, up to MATH_TRAINING_MAX_SCORES scores,
        as the math path, which saves its probabilities, Sq x Sk per head (PyTorch's CPU
        flash attention takes no dropout). Without dropout the fused form holds no scores and
        is faster (benchmarks/cpu_attention_training.py: causal 2x6xSx64 f32 steps at 2
        threads, 13.78 / 48.14 ms fused against 22.85 / 88.04 ms as the math path for
        S = 512 / 1024; with dropout 0.1, 21.24 / 74.45 against 33.81 / 133.48);
      - on CUDA, calls without dropout that braze's fused kernels do not take (f32 and f64,
        head dims over FUSED_CUDA_BACKWARD_MAX_HEAD_DIM, before sm_80) when
        MATH_TRAINING_UNFUSED_ON_CUDA, outside autocast (which may narrow f32 operands to
        the fused kernels' types); calls with dropout when MATH_TRAINING_DROPOUT_ON_CUDA, which
        then save their probabilities and dropout mask; every call when MATH_TRAINING_ON_CUDA
        (off). Other calls keep PyTorch's fused attention and its backward in eager, counted.
        The H200 GPT-2 6-layer f32 train step of benchmarks/gpu_models.py, at 1.02x Inductor
        reduce-overhead both ways, became 4 partitions and 0 ops in eager instead of 16
        partitions and 12 eager attention ops, at the same peak memory; with attention dropout
        0.1 it took 14.71 ms against Inductor's 14.93 and eager's 16.56."""
    tensors = [a for a in example_inputs if isinstance(a, torch.Tensor)]
    if not torch.is_grad_enabled() or not any(t.requires_grad for t in tensors):
        return
    cuda = any(t.device.type != "cpu" for t in tensors)
    if cuda and not (MATH_TRAINING_ON_CUDA or MATH_TRAINING_UNFUSED_ON_CUDA
                     or MATH_TRAINING_DROPOUT_ON_CUDA):
        return
    changed, autocast = False, cuda and _under_autocast(gm)
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (
                torch._C._nn.scaled_dot_product_attention, F.scaled_dot_product_attention):
            scores = _scores(node)
            dropout = _has_dropout(node)
            if dropout and not cuda and FUSED_CPU_DROPOUT and _fused_dropout(node):
                node.target = attention_with_dropout
                changed = True
                continue
            if cuda:
                math_path = MATH_TRAINING_ON_CUDA or (
                    MATH_TRAINING_DROPOUT_ON_CUDA if dropout
                    else MATH_TRAINING_UNFUSED_ON_CUDA and not autocast
                    and _unfused_on_cuda(node))
            else:
                math_path = MATH_TRAINING_WITHOUT_DROPOUT or dropout
            if math_path and scores is not None \
                    and scores <= MATH_TRAINING_MAX_SCORES:
                node.target = _math_attention
                changed = True
    if changed:
        gm.recompile()
