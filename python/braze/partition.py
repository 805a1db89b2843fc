"""Which FX nodes braze compiles together when some run in eager PyTorch, and the calling
convention of the graph module that strings the partitions and the eager nodes together.

Partitions follow the graph's order. AOTAutograd orders a backward as autograd runs it: a layer's
weight gradients right after the gradient they read, then the eager op (an attention backward)
that the next layer waits for. A partition is the run of supported nodes between two eager nodes;
two neighbouring runs are one partition when no path leads from the first through an eager node
into the second. Merging every pair that forms no cycle (fx's CapabilityBasedPartitioner) put
each layer's weight-gradient products into the last partition, which kept the gradients and
activations they read alive across the whole backward. The other way round, a large product of
a backward that only a late node reads moves down to it (sink_large_products)."""
import operator

import torch

from braze import _C
from braze.layouts import match_layout


def propose(gm, unsupported):
    """The partitions of gm (lists of nodes): runs of call_function nodes not in `unsupported`,
    in graph order, cut at each unsupported node, with neighbours merged where that forms no
    cycle. A getitem joins the partition of the node whose result it picks; a getitem of an
    unsupported node does not cut a run (it names a result of an eager node that ran before)."""
    runs, where, cut = [], {}, True
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        picks = node.args[0] if node.target is operator.getitem else None
        if node not in unsupported:
            if picks in where:
                runs[where[picks]].append(node)
                where[node] = where[picks]
                continue
            if cut:
                runs.append([])
                cut = False
            runs[-1].append(node)
            where[node] = len(runs) - 1
        elif picks not in unsupported:
            cut = True
    merged = []
    for run in runs:
        if merged and not _cycle(set(merged[-1]) | set(run)):
            merged[-1] = merged[-1] + run
        else:
            merged.append(run)
    return merged


def _cycle(members):
    """Whether a node outside `members` both reads from them and feeds them (directly or
    through other nodes), so that they cannot run as one call."""
    seen, stack = set(), [u for n in members for u in n.users if u not in members]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for user in node.users:
            if user in members:
                return True
            stack.append(user)
    return False


aten = torch.ops.aten
# Products whose results may move; the views that may follow them.
_PRODUCTS = (aten.mm.default, aten.bmm.default, aten.addmm.default)
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default,
          aten.permute.default, aten.t.default, aten.transpose.int, aten.expand.default,
          aten.squeeze.dim, aten.unsqueeze.default)
_SINK_MIN_BYTES = 1 << 20


def _bytes(node):
    val = node.meta.get("val")
    return val.numel() * val.element_size() if isinstance(val, torch.Tensor) else 0


def sink_large_products(gm, unsupported):
    """In a backward graph, moves a matrix product (with the views of it that follow) down to
    just before the first node that reads it, when an eager node lies between, so that it runs
    in a later partition. It moves when its result is larger than twice what the move keeps
    alive longer: its operands that nothing reads at or after that point, except the incoming
    gradients, which the autograd call holds to its end. A tied embedding's output-layer
    gradient (GPT-2's wte: [vocab, hidden], read only by the sum with the embedding's gradient
    at the end of the backward) was computed in the first partition of the backward, so its
    147 MiB were live beside every layer's saved activations. Returns whether it moved
    anything."""
    def base(n):
        while n.op == "call_function" and n.target in _VIEWS:
            n = n.args[0]
        return n

    def held(n):
        b = base(n)
        return b.op == "placeholder" and b.name.startswith("tangents")

    moved = False
    order = {n: i for i, n in enumerate(gm.graph.nodes)}  # renumbered after each move
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _PRODUCTS:
            continue
        if _bytes(node) < _SINK_MIN_BYTES:
            continue
        members, stack = {node}, [node]  # node and the views of it, in graph order below
        while stack:
            for u in stack.pop().users:
                if u.op == "call_function" and u.target in _VIEWS and u.args[0] in members:
                    members.add(u)
                    stack.append(u)
        chain = sorted(members, key=order.get)
        readers = [u for c in chain for u in c.users if u not in members]
        if not readers:
            continue
        first = min(readers, key=order.get)
        if not any(order[node] < order[e] < order[first] for e in unsupported):
            continue
        kept = 0  # the operands' bytes that the move keeps alive longer
        for a in node.all_input_nodes:
            later = [u for u in a.users if u is not node and order[u] >= order[first]]
            kept += 0 if held(a) or later else _bytes(a)
        if _bytes(node) <= 2 * kept:
            continue
        for c in chain:
            first.prepend(c)
        moved = True
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
    if moved:
        gm.graph.lint()
        gm.recompile()
    return moved


def fuse(gm, partitions):
    """gm, changed in place, with each partition replaced by a call of a submodule fused_<i>:
    its arguments are the values it reads from outside, in the order of first use; it returns
    the values read outside it (one, or a tuple), each picked by a getitem. The submodules are
    lazy graph modules: braze reads their graphs, and their Python code is generated only if
    a partition runs in eager PyTorch."""
    from torch.fx._lazy_graph_module import _LazyGraphModule
    from torch.fx.passes.tools_common import stable_topological_sort
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    for index, nodes in enumerate(partitions):
        members = sorted(nodes, key=position.__getitem__)
        inside = set(members)
        sub, copied, inputs = torch.fx.Graph(), {}, []

        def value(x):
            if x not in copied:  # read from outside: a placeholder
                copied[x] = sub.placeholder(x.name, type_expr=x.type)
                copied[x].meta = dict(x.meta)
                inputs.append(x)
            return copied[x]
        for n in members:
            copied[n] = sub.node_copy(n, value)
        results = [n for n in members if any(u not in inside for u in n.users)]
        sub.output(copied[results[0]] if len(results) == 1
                   else tuple(copied[n] for n in results))
        name = f"fused_{index}"
        gm.add_submodule(name, _LazyGraphModule(gm, sub, class_name=name))
        with gm.graph.inserting_after(members[-1]):
            call = gm.graph.call_module(name, tuple(inputs))
        if len(results) == 1:
            call.meta = dict(results[0].meta)
            results[0].replace_all_uses_with(call, delete_user_cb=lambda u: u not in inside)
        else:
            at = call
            for i, n in enumerate(results):
                with gm.graph.inserting_after(at):
                    at = gm.graph.call_function(operator.getitem, (call, i))
                at.meta = dict(n.meta)
                n.replace_all_uses_with(at, delete_user_cb=lambda u: u not in inside)
        for n in reversed(members):
            gm.graph.erase_node(n)
    # An outside node placed between a partition's members that reads one of them now comes
    # before the call that computes it.
    stable_topological_sort(gm)
    gm.graph.lint()
    return gm


def unguarded_arguments(node, calls, forward):
    """Positions of a partition's arguments whose layouts nothing fixes: results of eager ops
    and, in a backward graph, the graph's own arguments (Dynamo's guards fix a forward's).
    Results of braze's partitions (`calls`) and of layout guards have the layouts their meta
    values say."""
    def fixed(a):
        if a.op == "placeholder":
            return forward
        if a.target is match_layout:
            return True
        return a.target is operator.getitem and a.args[0] in calls
    return frozenset(i for i, a in enumerate(node.args)
                     if isinstance(a, torch.fx.Node) and not fixed(a))


def lean_call(graph, unguarded):
    """What a partitioned module calls for the compiled partition `graph` (a backend graph
    callable): its lean call (graph.fast()) while the arguments at positions `unguarded` have
    the layouts it was compiled for; a call whose do not, or whose lean call fails, goes through
    graph itself, which compiles a variant for them or runs the partition in eager."""
    fast = graph.fast()
    if fast is graph:
        return graph
    run = graph.run
    expect = [(i, run.shapes[k], run.strides[k])
              for k, i in enumerate(graph.tensor_positions) if i in unguarded]

    def call(*args):
        for i, shape, stride in expect:
            a = args[i]
            if a.shape != shape or a.stride() != stride:
                return graph(*args)
        try:
            return fast(*args)
        except _C.RunError:  # graph's own call path runs it again, or in eager, with a warning
            return graph(*args)
    return call


def partition_call(fn, tuple_out, name):
    """A compiled partition as the function the partitioned module's code calls."""
    if tuple_out:
        def call(*args):
            return tuple(fn(*args))
    else:
        def call(*args):
            return fn(*args)[0]
    call.__name__ = call.__qualname__ = name
    return call


class ArgumentList(torch.fx.graph.CodeGen):
    """A graph module's code that takes its arguments as one list and empties it, as
    AOTAutograd's boxed calls pass them: FX's code drops each argument after its last use, so
    with the caller's list emptied the argument's memory is freed there."""

    def gen_fn_def(self, free_vars, maybe_return_annotation, **kwargs):
        names = [v.split(":")[0].split("=")[0].strip() for v in free_vars if v != "self"]
        lines = [f"def {getattr(self, '_func_name', 'forward')}(self, args_list)"
                 f"{maybe_return_annotation}:"]
        if names:
            lines.append(f"    {', '.join(names)}, = args_list")
            lines.append("    args_list.clear()")
        return "\n".join(lines)
