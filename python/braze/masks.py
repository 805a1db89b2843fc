"""Attention masks that are constants of the graph. A model may build its mask inside the
forward from positions alone (transformers does, under torch.compile: a causal comparison of
aranges, ANDed with a packed-sequence test over position ids that are themselves an arange).
Such a mask depends on no input of the graph, so it has one value for every call: braze
evaluates it once, with PyTorch's own kernels, when it compiles the graph, and where that value
is the causal mask (or keeps every key), the attention takes `is_causal` (or no mask) instead.
Then the attention runs as a causal kernel that skips the masked half of the scores, and no
mask is read. A mask that reads an input (a padding mask, a cache position) is left as it is,
and so is every other value: the C++ pass fuse-attention folds masks it can read from their
construction; this covers any construction, because it looks at the value."""
import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from braze.registry import bound_args

aten = torch.ops.aten

# op -> (name of its mask operand, name of its causal flag)
_MASKED_OPS = {
    aten._scaled_dot_product_cudnn_attention.default: ("attn_bias", "is_causal"),
    aten._scaled_dot_product_efficient_attention.default: ("attn_bias", "is_causal"),
    aten._scaled_dot_product_flash_attention_for_cpu.default: ("attn_mask", "is_causal"),
    aten.scaled_dot_product_attention.default: ("attn_mask", "is_causal"),
}
# Masks of more elements are not evaluated (the compile would hold a copy of it).
MAX_ELEMENTS = 1 << 26


def _set(node, name, value):
    for i, arg in enumerate(node.target._schema.arguments):
        if arg.name != name:
            continue
        if i < len(node.args) and not arg.kwarg_only:
            args = list(node.args)
            args[i] = value
            node.args = tuple(args)
        else:
            node.kwargs = {**node.kwargs, name: value}
        return


def _static(val):
    return isinstance(val, torch.Tensor) and all(isinstance(d, int) for d in val.shape)


def constant_value(gm, node):
    """The value of FX node `node` of graph module gm when it reads no input of the graph
    and no random op: evaluated by PyTorch, on the device it names; else None."""
    needed, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n in needed:
            continue
        needed.add(n)
        if n.op == "placeholder":
            return None
        if n.op == "call_function":
            tags = getattr(n.target, "tags", ())
            if torch.Tag.nondeterministic_seeded in tags:
                return None
            val = n.meta.get("val")
            if isinstance(val, torch.Tensor) and (not _static(val) or val.numel() > MAX_ELEMENTS):
                return None
        elif n.op != "get_attr":
            return None
        stack.extend(n.all_input_nodes)
    g = torch.fx.Graph()
    env = {}
    for n in gm.graph.nodes:
        if n in needed:
            env[n] = g.node_copy(n, lambda a: env[a])
    g.output(env[node])
    with unset_fake_temporarily(), torch.no_grad():
        value = torch.fx.GraphModule(gm, g)()
    return value if isinstance(value, torch.Tensor) else None


def _kept(mask):
    """Where a mask keeps a score: True of a bool mask; 0 of an additive one whose other
    values all mask (at most f16's lowest, -65504, as fuse-attention reads them); None for an
    additive mask with other values (a real bias)."""
    if mask.dtype == torch.bool:
        return mask
    if not mask.is_floating_point():
        return None
    kept = mask == 0
    if not bool((kept | (mask <= -65504.0)).all()):
        return None
    return kept


def fold_constant_masks(gm):
    """Replaces the constant masks of gm's attentions that are causal, or keep every key, by
    is_causal or no mask (see the module's docstring); True if it changed gm."""
    with unset_fake_temporarily(), torch.no_grad():
        return _fold(gm)


def _fold(gm):
    changed = False
    values = {}  # mask node -> its value (the layers of a model share one mask)
    for node in gm.graph.nodes:
        names = _MASKED_OPS.get(node.target) if node.op == "call_function" else None
        if names is None:
            continue
        bound = bound_args(node)
        mask_node, causal = bound[names[0]], bool(bound[names[1]])
        if not isinstance(mask_node, torch.fx.Node):
            continue
        q = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        k = node.args[1].meta.get("val") if isinstance(node.args[1], torch.fx.Node) else None
        if not _static(q) or not _static(k):
            continue
        if mask_node not in values:
            values[mask_node] = constant_value(gm, mask_node)
        value = values[mask_node]
        kept = _kept(value) if value is not None else None
        if kept is None:
            continue
        sq, sk = q.shape[-2], k.shape[-2]
        tril = torch.ones(sq, sk, dtype=torch.bool, device=kept.device).tril()
        if causal:
            kept = kept & tril
        if bool(kept.all()) and not causal:
            _set(node, names[0], None)
        elif bool((kept == tril).all()):
            _set(node, names[0], None)
            _set(node, names[1], True)
        else:
            continue
        changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return changed
