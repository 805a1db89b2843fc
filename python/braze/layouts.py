"""Layouts at partition boundaries. Every tensor a compiled partition hands to PyTorch, and every
tensor an eager op hands to another eager op, has the sizes and strides of its FX node's
meta["val"]: eager kernels (attention among them) may return another layout than their meta
functions promise, and the ops after them (a `view`) were traced against the meta. How a compiled
graph's own outputs are made (views of arguments among them) is its signature (signature.py)."""
import operator

import torch


def concrete_layout(val):
    """(sizes, strides) of a tensor value when both are plain integers, else None (symbolic)."""
    if not isinstance(val, torch.Tensor):
        return None
    try:
        shape, stride = tuple(val.shape), tuple(val.stride())
    except (RuntimeError, NotImplementedError):  # sparse or otherwise strideless
        return None
    if all(type(d) is int for d in shape + stride):
        return shape, stride
    return None


def same_layout(t, shape, stride):
    """True when tensor t has `shape` and, on every dim of more than one element, `stride`."""
    if tuple(t.shape) != shape:
        return False
    ts = t.stride()
    return ts == stride or all(n <= 1 or a == b for n, a, b in zip(shape, ts, stride))


def as_layout(t, shape, stride):
    """t's values with exactly `shape` and `stride` (a copy unless t has them already). Dims of
    stride 0 (an expanded result) share one element in the copy, as in the expanded original."""
    if same_layout(t, shape, stride):
        return t
    if any(s == 0 and n > 1 for n, s in zip(shape, stride)):
        # Materialize one slice along each broadcast dim, then view it with the wanted strides.
        base_shape = tuple(1 if s == 0 else n for n, s in zip(shape, stride))
        base_src = t[tuple(slice(0, 1) if s == 0 else slice(None) for s in stride)]
        base = torch.empty_strided(base_shape, stride, dtype=t.dtype, device=t.device)
        base.copy_(base_src)
        return base.as_strided(shape, stride)
    out = torch.empty_strided(shape, stride, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def match_layout(t, shape, stride):
    """The boundary after an eager op: its result with the layout of its meta value."""
    return as_layout(t, shape, stride) if isinstance(t, torch.Tensor) else t


def guard_eager_layouts(gm, compiled_names):
    """Inserts match_layout after every eager call in the partitioned module `gm` whose result
    reaches another eager op (results that only compiled partitions read
    need no copy: a partition compiles a variant for the layout it receives). Returns how many
    boundaries were inserted."""
    graph = gm.graph

    def compiled(n):
        return n.op == "call_module" and n.target in compiled_names

    inserted = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is match_layout:
            continue
        if node.target is operator.getitem and compiled(node.args[0]):
            continue  # a compiled partition's result: laid out as its meta already
        layout = concrete_layout(node.meta.get("val"))
        if layout is None:
            continue
        users = [u for u in node.users if not compiled(u) and u.op != "output"]
        if not users:
            continue
        with graph.inserting_after(node):
            guard = graph.call_function(match_layout, (node, *layout))
        guard.meta = dict(node.meta)
        for u in users:
            u.replace_input_with(node, guard)
        inserted += 1
    if inserted:
        gm.recompile()
    return inserted
