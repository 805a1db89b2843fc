"""Which FX nodes braze takes. A graph is translated whole, once: when every node passes the
checks that need no translation and braze::supports accepts the whole graph, that translation
is what compiles. Otherwise each node alone is translated into a braze graph, whose builder
checks what its op takes, and braze::supports answers for the target without lowering it; nodes
that repeat (every layer of a transformer) are asked about once per process. When supported
nodes fail to compile together, the lowering trial finds the ones that fail alone."""
import operator

import torch

from braze import _C
from braze import cpu as cpu_support
from braze import devices, signature, sizes
from braze.fx_import import Translator
from braze.registry import Unsupported, aten, bound_args, supported_targets

# (key, device) -> (supported, reason)
_cache = {}


def fetch_attr(gm, target):
    """The value of a get_attr node's dotted `target` in the graph module."""
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _key(node):
    """What decides whether braze compiles `node` alone: its op, its non-tensor arguments, the
    dtype, sizes and strides of its operands and results, and which of a tuple's results are
    read (an attention whose log-sum-exp is read stays in eager). None where a value has no
    stable text (then the node is tried)."""
    def describe(x):
        if isinstance(x, torch.fx.Node):
            x = x.meta.get("val") if x.op != "get_attr" else fetch_attr(x.graph.owning_module,
                                                                          x.target)
            leaves = torch.utils._pytree.tree_leaves(x)
            return tuple((str(v.dtype), str(v.device), str(tuple(v.shape)), str(v.stride()))
                         if isinstance(v, torch.Tensor) else repr(v) for v in leaves)
        if isinstance(x, (list, tuple)):
            return tuple(describe(v) for v in x)
        if isinstance(x, dict):
            return tuple((k, describe(v)) for k, v in sorted(x.items()))
        if isinstance(x, torch.Tensor):
            raise TypeError("a tensor argument")
        return repr(x)
    try:
        read = tuple(sorted(repr(u.args[1]) for u in node.users
                            if u.target is operator.getitem and u.users))
        return (node.target, describe(node.args), describe(node.kwargs), describe(node), read)
    except Exception:
        return None


def _numel(x):
    val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    return val.numel() if isinstance(val, torch.Tensor) else 0


_ORDER_DEPENDENT_TARGETS = {aten.index_put.default, aten._unsafe_index_put.default,
                             aten.index_add.default, aten.scatter_add.default,
                             aten.scatter_reduce.two, aten.index_reduce.default, aten.put.default}


def _order_dependent_scatter(node):
    """(self, sources) of a float scatter that sums, multiplies or averages, whose result
    depends on the order of its additions; None for any other node."""
    t = node.target
    if t not in _ORDER_DEPENDENT_TARGETS:
        return None
    a = bound_args(node)
    if t in (aten.index_put.default, aten._unsafe_index_put.default) and a.get("accumulate"):
        first = next((i for i in a["indices"] if i is not None), None)
        return a["self"], max(_numel(a["values"]), _numel(first))
    if t is aten.index_add.default:
        return a["self"], _numel(a["source"])
    if t is aten.scatter_add.default:
        return a["self"], _numel(a["index"])
    if t is aten.scatter_reduce.two and a["reduce"] in ("sum", "prod", "mean"):
        return a["self"], _numel(a["index"])
    if t is aten.index_reduce.default and a["reduce"] in ("prod", "mean"):
        return a["self"], _numel(a["source"])
    if t is aten.put.default and a.get("accumulate"):
        return a["self"], _numel(a["index"])
    return None


def nondeterministic_on_cuda(node):
    """Why braze's CUDA code for `node` is not deterministic (None where it is): a float scatter
    that adds or multiplies beyond braze's pair limit runs as atomics in no fixed order. Under
    torch.use_deterministic_algorithms(True) such a node runs in eager, whose deterministic
    kernel (or error) applies, as TorchInductor does."""
    found = _order_dependent_scatter(node)
    if found is None:
        return None
    self, sources = found
    val = self.meta.get("val") if isinstance(self, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or not val.dtype.is_floating_point:
        return None
    if val.numel() * sources <= _C.MAX_SCATTER_PAIRS:
        return None
    return ("torch.use_deterministic_algorithms(True): beyond braze's scatter pair limit "
            f"({val.numel()} x {sources} element pairs) its CUDA code adds atomically, in no "
            "fixed order; eager's deterministic kernel runs")


def refusal(node, device=None):
    """Why braze cannot take call_function `node` in a graph on `device` (None: the CPU), known
    without translating it: no rule for its op, an operand on another device, or a CUDA scatter
    that is not deterministic where determinism is asked for. None when translation decides."""
    if node.target not in supported_targets():
        return f"no braze rule for {node.target}"
    if device is not None:
        for n in [node, *node.all_input_nodes]:
            for d in devices.tensor_devices(n):
                if d != device:
                    return f"{n.name} is on {d} in a graph on {device}"
        if device.type == "cuda" and torch.are_deterministic_algorithms_enabled():
            return nondeterministic_on_cuda(node)
    return None


def node_support(node, device=None):
    """(True, "") if braze can compile this call_function node alone in a graph on `device`
    (None: the CPU), else (False, reason)."""
    why = refusal(node, device)
    if why is not None:
        return False, why
    key = _key(node)
    if key is not None and (key, device) in _cache:
        return _cache[key, device]
    result = try_node(node, device)
    if key is not None:
        _cache[key, device] = result
    return result


def unsupported_nodes(gm, device=None, skip=()):
    """{node: reason} of gm's call_function nodes braze cannot compile for `device` (None: the
    CPU), nodes in `skip` aside. A getitem, which picks one result of a multi-output op, is
    supported exactly when that op is."""
    out = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
            src = node.args[0]
            if src in out:
                out[node] = f"result of unsupported {src.name}"
            continue
        if node in skip:
            continue
        ok, why = node_support(node, device)
        if not ok:
            out[node] = why
    return out


def try_node(node, device=None, trial=False):
    """Translates `node` alone into a braze graph, whose builder checks what each op takes,
    and asks braze whether it compiles that graph for `device` (braze::supports, which does
    not lower it); with `trial`, lowers it instead. (True, "") or (False, reason)."""
    t = Translator()
    try:
        for a in node.all_input_nodes:
            if a.op == "get_attr":
                val = fetch_attr(node.graph.owning_module, a.target)
            else:
                val = a.meta.get("val")
            if isinstance(val, tuple):
                return False, "operand is a tuple"
            if isinstance(val, (torch.SymInt, int)):
                continue  # a size: the rules read sizes from the nodes' meta values
            t.input(a, val)
        out = t.translate(node)
        outs = list(out) if isinstance(out, tuple) else [out]
        # None: a result no node reads; an assertion's condition is an output of its own
        t.g.output([o for o in outs if o is not None] + [h for h, _ in t.assertions])
        if trial:
            t.g.check_supported()
            return True, ""
        return _supports(t.g, device)
    except (Unsupported, _C.CompileError) as e:
        return False, str(e)


def _supports(g, device):
    """braze::supports of braze graph g for `device` (None: the CPU): (ok, reason)."""
    if device is not None and device.type == "cuda":
        return g.supports(cuda=True)
    return g.supports(one_dnn_half=cpu_support.one_dnn_half())


def translate_whole(gm, args=None):
    """gm translated into one braze graph: its tensor placeholders (laid out as `args`, one
    call's arguments, when given: a variant for their layouts), its carried sizes and its
    attributes as inputs, then each op (sizes aside: rules read them from the meta values).
    Returns the Translator, gm's GraphSignature and the handles of the braze graph's outputs
    (none when the signature computes nothing)."""
    t = Translator(sizes.bindings(gm, args) if args is not None else None)
    ins = signature.inputs(gm)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i in ins:
        if i.kind == "tensor":
            node = placeholders[i.position]
            t.input(node, args[i.position] if args is not None else node.meta["val"])
    for i in ins:  # sizes that no tensor's dims bind come in as carriers (sizes.SizeCarrier)
        if i.kind == "carried":
            node = placeholders[i.position]
            t.g.input(node.name, "u8", [t.sym(node.meta["val"])], [t.g.sym_const(0)])
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = fetch_attr(gm, node.target)
            if not isinstance(value, torch.Tensor):
                raise Unsupported(f"attribute {node.target} is not a tensor")
            t.input(node, value)
    for node in gm.graph.nodes:
        if node.op == "call_function" and not sizes.is_size(node):
            t.translate(node)
    sig = signature.graph_signature(gm, t.values, [msg for _, msg in t.assertions])
    handles = []
    if sig.computes:
        for slot in sig.outputs:
            if isinstance(slot, signature.NotTensor):
                raise Unsupported(f"output {slot.text} is not a tensor")
        nodes = {n.name: n for n in gm.graph.nodes}
        parts = sig.computed + list(sig.bases)
        handles = [t.values[nodes[p.name]] for p in parts] + [h for h, _ in t.assertions]
        # an assertion's condition is checked on the host after each call, then dropped
        t.g.output(handles, [t.shape(p.strides) if p.strides is not None else [] for p in parts]
                   + [[] for _ in t.assertions])
    return t, sig, handles


def whole_graph(gm, device=None, skip=()):
    """translate_whole(gm) when braze takes the whole graph on `device` (None: the CPU): every
    call_function node (those in `skip` aside) passes the checks that need no translation, the
    graph translates, computes something, and braze::supports accepts it. None otherwise, and
    unsupported_nodes finds which nodes braze refuses."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or node in skip or (
                node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node)):
            continue  # a getitem is supported exactly when its op is
        if refusal(node, device) is not None:
            return None
    try:
        whole = translate_whole(gm)
        ok, _ = _supports(whole[0].g, device)
    except Exception:  # the search node by node meets it again, and says which node it is
        return None
    return whole if ok and whole[1].computes else None


def refused_by_trial(gm, device):
    """The nodes of `gm` that fail to lower alone, after braze::supports accepted each of them
    but the whole graph failed to compile: {node: reason}."""
    refused = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
            if node.args[0] in refused:
                refused[node] = f"result of unsupported {node.args[0].name}"
            continue
        ok, why = try_node(node, device, trial=True)
        if not ok:
            refused[node] = why
    return refused


def integer_interpolation(gm):
    """PyTorch decomposes bilinear/bicubic interpolation (before any backend sees it) into float
    math that truncates integer results, where its kernels round: such graphs stay in eager."""
    import torch.nn.functional as F
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (F.interpolate, F.upsample,
                                                          F.upsample_bilinear):
            x = node.args[0].meta.get("example_value") if node.args else None
            mode = node.kwargs.get("mode", node.args[3] if len(node.args) > 3 else "nearest")
            if (isinstance(x, torch.Tensor) and not x.dtype.is_floating_point
                    and (node.target is F.upsample_bilinear or mode in ("bilinear", "bicubic"))):
                return True
    return False
