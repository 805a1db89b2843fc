"""The decomposition table braze hands AOTAutograd: Core ATen's, plus PyTorch's own
decompositions of the ops braze compiles best written out, minus the composites braze lowers
itself (lowering/decompose)."""
import functools
import os

import torch


# Ops the Core ATen set keeps whole that braze compiles best as PyTorch's own decompositions
# (activations, their backward formulas, norms, padding, concatenation, creation ops).
_EXTRA_DECOMPOSITIONS = [
    "elu", "hardtanh", "leaky_relu", "softplus", "clamp.Tensor", "masked_fill.Scalar",
    "masked_fill.Tensor", "gelu_backward", "threshold_backward", "sigmoid_backward",
    "tanh_backward", "silu_backward", "_softmax_backward_data", "_log_softmax_backward_data",
    "native_layer_norm_backward", "logsumexp", "std.correction", "linalg_vector_norm", "tril",
    "triu", "roll", "flip", "repeat", "embedding", "embedding_dense_backward",
    "index_select", "arange.start_step", "arange.default", "eye", "new_zeros",
    "new_ones", "zeros_like", "ones_like", "empty_like", "native_dropout", "nll_loss_forward",
    "nll_loss_backward", "select_scatter", "slice_scatter", "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit", "_native_batch_norm_legit.no_stats",
    "_native_batch_norm_legit_functional", "native_batch_norm",
    # misc family: copies of views, small composites, distributions built on rand_like, and
    # index creation (each checked against eager in every dtype the op supports)
    "view_copy", "permute_copy", "narrow_copy", "unbind_copy.int", "as_strided_copy", "addmv",
    "native_group_norm", "dist", "linalg_cross", "_batch_norm_with_update_functional",
    "exponential", "cauchy", "log_normal", "tril_indices", "triu_indices",
]


def _unless(decomposition, refuse):
    """The decomposition, except for inputs where `refuse(dtype)`: then the op stays whole and
    braze leaves it to eager PyTorch."""
    def wrapper(x, *args, **kwargs):
        if isinstance(x, torch.Tensor) and refuse(x.dtype):
            return NotImplemented
        return decomposition(x, *args, **kwargs)
    return wrapper


# PyTorch's decompositions of these compute half-precision inputs in f32, while the eager
# kernels round every step (and may overflow to inf): braze would differ from eager.
_HALF_SENSITIVE = ("linalg_cross", "soft_margin_loss", "hinge_embedding_loss")


def _is_half(dtype):
    return dtype in (torch.float16, torch.bfloat16)


# The per-tensor op of each _foreach_ op whose torch function is not named as the op is.
def _maximum(a, b):
    return torch.maximum(a, b) if isinstance(b, torch.Tensor) else torch.clamp_min(a, b)


def _minimum(a, b):
    return torch.minimum(a, b) if isinstance(b, torch.Tensor) else torch.clamp_max(a, b)


_FOREACH_OPS = {
    "copy": lambda a, src, non_blocking=False: torch.ops.aten.copy.default(a, src),
    "zero": torch.zeros_like,
    "max": torch.max,
    "norm": lambda a, ord=2, dtype=None: torch.linalg.vector_norm(a, ord, dtype=dtype),
    "maximum": _maximum,
    "minimum": _minimum,
    "addcmul": lambda a, t1, t2, value=1: torch.addcmul(a, t1, t2, value=value),
    "addcdiv": lambda a, t1, t2, value=1: torch.addcdiv(a, t1, t2, value=value),
}
# Overloads whose per-tensor arguments are not lists (a tensor of one scalar per tensor).
_FOREACH_SKIPPED = {("addcmul", "Tensor"), ("addcdiv", "Tensor"), ("powsum", "Scalar")}


def _foreach(overload, op):
    """The decomposition of a _foreach_ op (optimizers' multi-tensor steps): `op` applied to
    each tensor of its lists, with the i-th entry of every list argument (tensors or scalars)
    and the other arguments as they are."""
    listed = [i for i, a in enumerate(overload._schema.arguments)
              if not a.kwarg_only and str(a.type).startswith("List[")]

    def decomposition(*args, **kwargs):
        n = len(args[listed[0]])
        if any(len(args[i]) != n for i in listed if i < len(args)):
            return NotImplemented  # eager raises its own error
        return [op(*[a[j] if i in listed else a for i, a in enumerate(args)], **kwargs)
                for j in range(n)]
    return decomposition


@functools.lru_cache(maxsize=None)
def _foreach_table():
    """{_foreach_ overload: its decomposition} for the functional overloads (AOTAutograd
    functionalizes the in-place ones into them)."""
    out = {}
    for schema in torch._C._jit_get_all_schemas():
        name, overload = schema.name, schema.overload_name or "default"
        if not name.startswith("aten::_foreach_") or name.endswith("_") or "out" in overload:
            continue
        base = name[len("aten::_foreach_"):]
        op = _FOREACH_OPS.get(base) or getattr(torch, base, None)
        if op is None or (base, overload) in _FOREACH_SKIPPED:
            continue
        packet = getattr(torch.ops.aten, name[len("aten::"):])
        fn = getattr(packet, overload)
        out[fn] = _foreach(fn, op)
    return out


def _core_aten():
    """Core ATen's decompositions of the ops that reach AOTAutograd's tracing. The public
    table (core_aten_decompositions) adds every CompositeImplicitAutograd op, mapped to that
    op's own composite kernel, which AOTAutograd runs for such ops anyway; collecting them costs
    0.04-0.14 s per call."""
    import torch._decomp as decomp
    post_autograd = getattr(decomp, "_core_aten_decompositions_post_autograd", None)
    return dict(post_autograd() if post_autograd else decomp.core_aten_decompositions())


def _grouped_mm(x, w, offs=None, bias=None, out_dtype=None):
    """A grouped product (a mixture of experts' per-expert GEMMs): row r of x, sorted by expert,
    times the weight [K, N] of the expert whose rows [offs[e-1], offs[e]) hold it; rows from
    offs[-1] on are 0 (transformers' fallback writes zeros there; aten's leaves them unset).
    Written as a product whose right operand is picked per row, which braze runs as one
    grouped GEMM (GemmCall::group): on the CPU one BLAS call per run of rows of one expert
    (f32/f64); on CUDA braze's tensor-core kernel (f16/bf16, accumulated in f32 and rounded
    once, or kept f32 for out_dtype=float32). Other inputs keep the op whole.

    On CUDA the kernel is used where it is at least as fast as eager's grouped GEMM: on sm_90
    with the weights read K-major (transformers' [experts, out, in] weights, transposed), which
    braze runs with wgmma. Elsewhere (sm_80 and sm_89's mma.sync kernel, about 0.55x of eager's
    on an H200, or weights stored [experts, in, out]) the op stays whole, in eager, counted.
    BRAZE_GROUPED_GEMM=1 takes braze's kernel on any sm_80+ GPU, =0 never."""
    if (offs is None or bias is not None or x.dim() != 2 or w.dim() != 3 or offs.dim() != 1
            or w.shape[0] == 0 or w.dtype != x.dtype):
        return NotImplemented
    if x.device.type == "cpu":
        if x.dtype not in (torch.float32, torch.float64) or out_dtype not in (None, x.dtype):
            return NotImplemented
        wide = x.dtype
    elif x.device.type == "cuda":
        mode = os.environ.get("BRAZE_GROUPED_GEMM", "")
        capability = torch.cuda.get_device_capability(x.device)
        fast = capability == (9, 0) and w.stride(-2) == 1
        if (mode == "0" or not (fast or mode == "1")
                or x.dtype not in (torch.float16, torch.bfloat16)
                or out_dtype not in (None, x.dtype, torch.float32) or capability < (8, 0)):
            return NotImplemented
        wide = torch.float32
    else:
        return NotImplemented
    rows = torch.arange(x.shape[0], device=x.device, dtype=offs.dtype)
    expert = torch.searchsorted(offs, rows, right=True).clamp(max=w.shape[0] - 1)
    routed = (rows < offs[-1]).unsqueeze(-1)
    if x.device.type == "cuda":
        # Rows past the end read as zeros (the kernel's row table masks them), so the product,
        # rounded, is the result: one kernel stores it.
        x = torch.where(routed, x, 0)
    out = (x.unsqueeze(-1).to(wide) * w[expert].to(wide)).sum(1)
    if x.device.type != "cuda":
        # The CPU's grouped calls read A's rows in place, with no mask.
        out = torch.where(routed, out, 0)
    return out.to(out_dtype or x.dtype)


def _index_add(core):
    """x.index_add(dim, index, source) as a scatter_add along dim: eager's CPU kernel sums
    half-precision values wide and rounds once there, as scatter_add does, where Core ATen's
    decomposition `core` (index_put with accumulate) rounds after every add (4096 f16 ones
    summed into one element gave 2048, bf16 256, against eager's 4096). With an alpha other
    than 1, eager rounds every add too: `core` then; and on CUDA, where eager adds halves
    atomically."""
    def decomposition(x, dim, index, source, alpha=1):
        if (alpha != 1 or x.device.type != "cpu" or x.dim() == 0 or source.dim() != x.dim()
                or index.dim() > 1):
            return core(x, dim, index, source, alpha=alpha)
        dim = dim % x.dim()
        shape = [1] * source.dim()
        shape[dim] = -1
        return x.scatter_add(dim, index.reshape(shape).expand_as(source), source)
    return decomposition


def _grouped_mm_ops():
    """aten._grouped_mm and transformers' grouped_mm_fallback, where they exist (transformers
    registers its op when its MoE integration is imported)."""
    ops = [getattr(torch.ops.aten, "_grouped_mm", None)]
    try:
        ops.append(torch.ops.transformers.grouped_mm_fallback)
    except (AttributeError, RuntimeError):
        pass
    return [op.default for op in ops if op is not None]


def table(training=False):
    """The decomposition table AOTAutograd applies (a fresh copy of one built per process). It
    keeps CPU flash attention whole: braze takes it as one attention op (rules_attention);
    PyTorch's decomposition of it returns the attention weights where the op returns the
    log-sum-exp. For `training` (grad mode on), a log-softmax is written out too, so that the
    min-cut partition saves its logits and row statistics for the backward rather than its
    whole result (a language model's loss: no second [tokens, vocabulary] tensor is stored)."""
    table = dict(_table(bool(training)))
    for op in _grouped_mm_ops():
        table[op] = _grouped_mm
    index_add = torch.ops.aten.index_add.default
    if index_add in table:
        table[index_add] = _index_add(table[index_add])
    return table


def kept_whole():
    """Ops that PyTorch's tables decompose and braze takes whole (rules_attention)."""
    return [torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default]


@functools.lru_cache(maxsize=None)
def _table(training):
    from torch._decomp import get_decompositions
    table = _core_aten()
    for op in kept_whole():
        table.pop(op, None)
    aten = torch.ops.aten
    extra = []
    for name in _EXTRA_DECOMPOSITIONS:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(aten, packet), overload or "default", None)
        if op is not None:
            extra.append(op)
    if training:
        extra.append(aten._log_softmax.default)
    table.update(get_decompositions(extra))
    table.update(_foreach_table())
    # braze decomposes these itself (lowering/decompose), keeping the composite op visible.
    for op, fn in list(table.items()):
        if any(name in str(op) for name in _HALF_SENSITIVE):
            table[op] = _unless(fn, _is_half)
    for op in (torch.ops.aten.silu.default, torch.ops.aten.gelu.default,
               torch.ops.aten.var_mean.correction, torch.ops.aten.native_layer_norm.default):
        table.pop(op, None)
    return table
