"""Layouts at partition boundaries. Every tensor a compiled partition hands to PyTorch, and every
tensor an eager op hands to another eager op, has the sizes and strides of its FX node's
meta["val"]: eager kernels (attention among them) may return another layout than their meta
functions promise, and the ops after them (a `view`) were traced against the meta. An output
that is a view of a graph argument is made as that view, not computed into new memory."""
import operator

import torch

aten = torch.ops.aten


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


# Ops that view their first operand (or, for reshape, may copy it): an output that is a chain
# of them over a graph argument is made by running the chain on the argument.
VIEW_OPS = {aten.t.default, aten.permute.default, aten.transpose.int, aten.view.default,
             aten._unsafe_view.default, aten.reshape.default, aten.expand.default,
             aten.slice.Tensor, aten.select.int, aten.unsqueeze.default, aten.squeeze.dim,
             aten.squeeze.default, aten.squeeze.dims, aten.alias.default, aten.detach.default}


def _piece(node):
    """A getitem of unbind, split or split_with_sizes as one view step: (the split node's input,
    (op, args, kwargs)); None otherwise."""
    if node.target is not operator.getitem or not isinstance(node.args[0], torch.fx.Node):
        return None
    whole, i = node.args
    if whole.op != "call_function" or any(
            isinstance(a, torch.fx.Node) for a in list(whole.args[1:]) + list(whole.kwargs.values())):
        return None
    x, val = whole.args[0], whole.args[0].meta.get("val")
    if not isinstance(val, torch.Tensor) or not isinstance(i, int):
        return None
    if whole.target is aten.unbind.int:
        dim = whole.args[1] if len(whole.args) > 1 else whole.kwargs.get("dim", 0)
        return x, (aten.select.int, (dim, i), {})
    if whole.target in (aten.split.Tensor, aten.split_with_sizes.default):
        dim = whole.args[2] if len(whole.args) > 2 else whole.kwargs.get("dim", 0)
        size, n = whole.args[1], val.shape[dim]
        starts = list(range(0, n, size)) if isinstance(size, int) else \
            [sum(size[:k]) for k in range(len(size))]
        ends = starts[1:] + [n]
        if i >= len(starts):
            return None
        return x, (aten.slice.Tensor, (dim, starts[i], ends[i]), {})
    return None


def _view_chain(out, sizes=False):
    """(base, steps) for a chain of view ops (a piece of an unbind or a split among them) whose
    only node operand is the previous one: the node they view and the ops that make `out` from
    it; (out, []) when out is no view. With `sizes`, a view may also read sizes (SymInt nodes,
    an expand's symbolic length), which stay nodes in its step for _apply to evaluate."""
    steps, node = [], out
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        if node.target in VIEW_OPS:
            if any(a is not node.args[0] and not (sizes and _is_size_node(a))
                   for a in node.all_input_nodes):
                return None, None
            steps.append((node.target, tuple(node.args[1:]), dict(node.kwargs)))
            node = node.args[0]
            continue
        piece = _piece(node)
        if piece is None:
            break
        node, step = piece
        steps.append(step)
    return node, steps[::-1]


def _is_size_node(a):
    return isinstance(a.meta.get("val"), (torch.SymInt, int)) and a.op in ("placeholder",
                                                                            "call_function")


def _apply(x, steps, size=None):
    """The steps applied to x; `size` gives the value of a size node among their arguments."""
    for op, rest, kwargs in steps:
        if size is not None:
            rest, kwargs = torch.fx.node.map_arg((rest, kwargs), size)
        x = op(x, *rest, **kwargs)
    return x


def _size_reader(gm):
    """(node, args) -> the value of size node `node` at a call with arguments `args`: a size
    argument, or SymInt arithmetic (sym_size of a tensor argument, say) evaluated over them."""
    placeholders = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}

    def read(node, args):
        if node.op == "placeholder":
            return args[placeholders[node]]
        inner, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: read(a, args))
        return node.target(*inner, **kwargs)
    return read


def computed_view(out):
    """For an output that views a computed value without being a dense tensor itself (a K/V
    cache sliced from a fused projection, an expanded bias): (base node, base -> that view).
    The base, dense, is computed as an output of its own and the view is made of it at each
    call, as eager returns it, instead of a copy. None otherwise."""
    val = out.meta.get("val") if isinstance(out, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.is_complex():
        return None
    base, steps = _view_chain(out)
    if not steps or not isinstance(base, torch.fx.Node) or base.op != "call_function":
        return None
    base_val = base.meta.get("val")
    if not isinstance(base_val, torch.Tensor) or base_val.is_complex():
        return None
    from torch._prims_common import is_non_overlapping_and_dense_or_false
    try:
        if is_non_overlapping_and_dense_or_false(val) or \
                not is_non_overlapping_and_dense_or_false(base_val):
            return None
    except Exception:  # symbolic strides that cannot be decided
        return None
    static = _static_view(val, base_val)
    if static is not None:  # one call in place of the chain
        size, stride, offset = static
        return base, lambda b: b.as_strided(size, stride, b.storage_offset() + offset)
    return base, lambda b: _apply(b, steps)


def _static_view(val, base_val):
    """(size, stride, offset in base_val) of val, a view of base_val's memory with sizes that
    are all numbers; None when a size is symbolic or val has memory of its own (a reshape that
    copied)."""
    from torch.multiprocessing.reductions import StorageWeakRef
    layout = (*val.shape, *val.stride(), val.storage_offset(), base_val.storage_offset())
    if any(isinstance(d, torch.SymInt) for d in layout) or val.dtype != base_val.dtype:
        return None
    if StorageWeakRef(val.untyped_storage()) != StorageWeakRef(base_val.untyped_storage()):
        return None
    return tuple(val.shape), tuple(val.stride()), val.storage_offset() - base_val.storage_offset()


def shared_outputs(flat, skip):
    """Groups of outputs (positions in `flat`, not in `skip`) that share memory in eager: a
    saved activation returned twice, or with its reshape or transpose beside it. For each group
    whose memory one member covers densely from its start (the base): (base node,
    [(position, size, stride, storage offset)] of every member). braze computes the base once
    and makes each member of it, as eager's views are, in place of a copy per output."""
    from torch._prims_common import is_non_overlapping_and_dense_or_false
    from torch.multiprocessing.reductions import StorageWeakRef
    groups = {}
    for j, o in enumerate(flat):
        val = o.meta.get("val") if isinstance(o, torch.fx.Node) and j not in skip else None
        if not isinstance(val, torch.Tensor) or val.is_complex():
            continue
        layout = (tuple(val.shape), tuple(val.stride()), val.storage_offset(),
                  val.untyped_storage().nbytes())
        if any(isinstance(d, torch.SymInt) for d in (*layout[0], *layout[1], *layout[2:])):
            continue  # symbolic: reading it would specialize the graph to this size
        groups.setdefault(StorageWeakRef(val.untyped_storage()), []).append((j, o, val, layout))
    out = []
    for members in groups.values():
        if len(members) < 2 or len({v.dtype for _, _, v, _ in members}) != 1:
            continue
        base = next((o for _, o, v, (_, _, offset, nbytes) in members
                     if offset == 0 and v.numel() * v.element_size() == nbytes
                     and is_non_overlapping_and_dense_or_false(v)), None)
        if base is not None:
            out.append((base, [(j, *layout[:3]) for j, _, _, layout in members]))
    return out


def input_view(gm, out):
    """For an output that is a tensor argument the graph does not mutate, or a chain of view
    ops over one with no other node among their operands: args -> that argument or view of it
    (a saved weight, or its transpose, for the backward); None otherwise. CUDA graphs return a
    view of the caller's own argument for one they copy per call (cudagraphs._Capture)."""
    node, steps = _view_chain(out, sizes=True)
    if not isinstance(node, torch.fx.Node) or node.op != "placeholder":
        return None
    if any(u.op == "call_function" and "copy_" in str(u.target) for u in node.users):
        return None
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    position = placeholders.index(node)
    found = []
    for _, rest, kwargs in steps:
        torch.fx.node.map_arg((rest, kwargs), found.append)
    if not found:
        return lambda args: _apply(args[position], steps)
    read = _size_reader(gm)
    return lambda args: _apply(args[position], steps, lambda a: read(a, args))
