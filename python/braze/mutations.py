"""Inputs that an inference graph writes into (a KV cache's index_copy_, a counter's add_).
AOTAutograd keeps such writes in the graph for braze (keep_inference_input_mutations) as
`copy_(input, value)` at its end. braze takes each copy_ out of the graph and returns its value
as one more output, and the call writes that output into the input's own memory:

  - in place, where it is safe: the input is read by nothing but the op that makes the value,
    an overwrite of some of its elements (index_put without accumulate, index_copy, a
    slice or select scatter, a scatter that overwrites). Such an op is idempotent (applied to
    its own result it gives that result again), so any kernel that reads the input after the
    output has overwritten it computes the same value, and the graph's kernels write the new
    value straight into the input: no copy, no eager op. Or the value is an elementwise
    function of the input that alone reads it and that nothing else reads (_pointwise_update:
    a parameter's optimizer update);
  - otherwise the output is its own buffer and is copied into the input after the call, as
    AOTAutograd's runtime would (one copy_, the input's address kept)."""
import torch

aten = torch.ops.aten

def _puts(n):
    """Whether index_put node n overwrites (does not accumulate)."""
    return not (n.args[3] if len(n.args) > 3 else n.kwargs.get("accumulate", False))


# The ops that overwrite some of their first operand's elements, and whether node n does.
_OVERWRITES = {
    aten.index_put.default: _puts,
    aten._unsafe_index_put.default: _puts,
    aten.index_copy.default: lambda n: True,
    aten.slice_scatter.default: lambda n: True,
    aten.select_scatter.default: lambda n: True,
    aten.scatter.src: lambda n: "reduce" not in n.kwargs,
    aten.scatter.value: lambda n: "reduce" not in n.kwargs,
}


# Per call and written input: computed in the input's memory, or copied into it after the call.
counts = {"inputs_written_in_place": 0, "inputs_copied_back": 0}


class Mutation:
    """Placeholder number `position` of the graph gets output number `output` written into
    it; `in_place` when the graph may compute that output in the input's memory."""

    def __init__(self, position, output, in_place):
        self.position, self.output, self.in_place = position, output, in_place


def take(gm):
    """Removes the copy_(placeholder, value) nodes of gm, appends each value to its outputs and
    returns the Mutations (empty when there are none; gm is then unchanged)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    copies = [n for n in gm.graph.nodes if n.op == "call_function"
              and n.target is aten.copy_.default and n.args[0] in placeholders]
    if not copies or not _writes_last(gm, copies):
        return []
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    for c in copies:
        # copy_ returns its input, written: the graph returns the input itself (which holds
        # the value by the time the call returns), and a node reads the value.
        c.replace_all_uses_with(c.args[0], delete_user_cb=lambda u: u.op == "output")
        c.replace_all_uses_with(c.args[1])
    outputs = list(out_node.args[0]) if isinstance(out_node.args[0], (tuple, list)) \
        else [out_node.args[0]]
    pairs = [(c.args[0], c.args[1]) for c in copies]
    written = [dst for dst, _ in pairs]
    for c in copies:
        gm.graph.erase_node(c)
    first = len(outputs)
    outputs += [value for _, value in pairs]
    out_node.args = (tuple(outputs),)
    mutations = []
    for k, (dst, value) in enumerate(pairs):
        # In place: one write into dst, by an overwrite whose only read of dst is its self,
        # or by an elementwise update that alone reads dst.
        safe = (isinstance(value, torch.fx.Node) and value.op == "call_function"
                and written.count(dst) == 1 and _same_layout(dst, value)
                and ((value.target in _OVERWRITES and _OVERWRITES[value.target](value)
                      and value.args and value.args[0] is dst and _reads(value, dst) == 1
                      and set(dst.users) == {value})
                     or _pointwise_update(dst, value)))
        mutations.append(Mutation(placeholders.index(dst), first + k, safe))
    gm.recompile()
    return mutations


def _pointwise(n, shape):
    """Whether n computes each element of its result (of `shape`) from the same element of its
    operands: an elementwise op, or an alias (the same tensor)."""
    val = n.meta.get("val")
    return (n.op == "call_function" and isinstance(val, torch.Tensor) and val.shape == shape
            and (torch.Tag.pointwise in getattr(n.target, "tags", ())
                 or n.target is aten.alias.default))


# Ops that read only their operand's sizes and dtype, never its values.
_METADATA_ONLY = {aten.full_like.default, aten.empty_like.default, aten.zeros_like.default,
                  aten.ones_like.default}


def _pointwise_update(dst, value):
    """Whether `value` is an elementwise function of dst that is the only thing reading dst: dst
    is read only by elementwise ops of its shape, each of which feeds value and nothing that
    does not feed value. A kernel computing value then reads dst[i] for value[i] alone, and
    nothing reads dst after value is written there. Other nodes may read value: the graph
    returns it, and braze stores a graph output and has its readers load it (Realize.h), here
    from dst's memory, after it is written. An optimizer's updates (p - lr * m / denom; Adam's
    m and v, which the parameter's update reads) or a decayed buffer (r * 0.9 + x). A node
    between dst and value may be returned too."""
    shape = dst.meta["val"].shape
    if not _pointwise(value, shape):
        return False
    feeds = _ancestors(value)
    if dst not in feeds:
        return False
    seen, stack = set(), [dst]
    while stack:
        n = stack.pop()
        for u in n.users:
            if u is value or u in seen or u.target in _METADATA_ONLY:
                continue
            if u.op == "output" and n is not dst:
                # n is returned (Adam's m, from a gradient with the parameter's weight decay
                # added, is written into m): braze stores it once, and since it feeds value,
                # no later than value is written.
                continue
            if u not in feeds or not _pointwise(u, shape):
                return False
            seen.add(u)
            stack.append(u)
    return True


def _ancestors(n):
    """The nodes n reads, directly or through others."""
    seen, stack = set(), [n]
    while stack:
        for a in stack.pop().all_input_nodes:
            if a not in seen:
                seen.add(a)
                stack.append(a)
    return seen


def _writes_last(gm, copies):
    """Whether each copy_ is the last that reads or writes its input: no later node reads it,
    and no node with effects (another in-place op) follows. AOTAutograd puts them at the end;
    a graph otherwise keeps its copy_ nodes (which run in eager)."""
    seen, inputs = False, {c.args[0] for c in copies}
    for n in gm.graph.nodes:
        if n in copies:
            seen = True
        elif seen and n.op == "call_function" and (
                getattr(getattr(n.target, "_schema", None), "is_mutable", False)
                or any(a in inputs for a in n.all_input_nodes)):
            return False
    return True


def _reads(node, x):
    """How many of node's operands (nested in lists) are x."""
    count = 0

    def visit(a):
        nonlocal count
        if a is x:
            count += 1
        elif isinstance(a, (list, tuple)):
            for b in a:
                visit(b)
    for a in (*node.args, *node.kwargs.values()):
        visit(a)
    return count


def _same_layout(dst, value):
    a, b = dst.meta.get("val"), value.meta.get("val")
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
            and a.shape == b.shape and a.is_contiguous() and b.is_contiguous())


def apply(boxed, mutations, outputs):
    """The boxed callable that calls `boxed` (which returns the graph's `outputs` results and
    then one per mutation) and writes each mutation's result into its input, where the graph
    did not already compute it there."""
    def call(args):
        targets = [args[m.position] for m in mutations]  # boxed may empty args
        results = boxed(args)
        for t, m in zip(targets, mutations):
            value = results[m.output]
            if value is t or (value.data_ptr() == t.data_ptr() and value.dtype == t.dtype
                              and value.shape == t.shape and value.stride() == t.stride()):
                counts["inputs_written_in_place"] += 1
            else:
                t.copy_(value)
                counts["inputs_copied_back"] += 1
        return list(results[:outputs])
    call._boxed_call = True
    return call
