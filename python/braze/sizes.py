"""Sizes on the host. SymInt arithmetic in an FX graph (sym_size, sym_sum, operator.mul on
sizes) runs in Python, not as a tensor op: braze hoists it out of the way of its partitions and
does not count it as a fallback. A size that a graph reads but no input tensor's dims carry
comes in as a SizeCarrier, whose one dim binds it as a tensor's dims bind theirs."""
import sympy
import torch

from braze.fx_import import canonical_expr


def is_size(node):
    """Whether call_function `node` computes a host scalar (a size: SymInt arithmetic,
    sym_size, sym_sum), which runs in Python, not as a tensor op."""
    val = node.meta.get("val")
    return node.op == "call_function" and isinstance(val, (torch.SymInt, torch.SymBool,
                                                           torch.SymFloat, int, bool, float))


def hoist(gm):
    """Moves the size computations of gm that read only its placeholders (directly or through
    other such sizes) to just after the placeholders, where they cut no run of braze's
    partitions. Returns every size node of gm (hoisted or not)."""
    sizes, hoistable = [], set()
    last = None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            last = node
        elif is_size(node):
            sizes.append(node)
            if all(a.op == "placeholder" or a in hoistable for a in node.all_input_nodes):
                hoistable.add(node)
    if last is not None:
        for node in sizes:
            if node in hoistable:
                last.append(node)
                last = node
    return set(sizes)


def carried(placeholders):
    """The positions of the SymInt placeholders whose size symbol is no dim of a tensor
    placeholder: the graph takes each as a carrier input (SizeCarrier)."""
    dims = set()
    for node in placeholders:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            dims.update(canonical_expr(d) for d in val.shape if isinstance(d, torch.SymInt))
    out = []
    for i, node in enumerate(placeholders):
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt):
            e = canonical_expr(val)
            if isinstance(e, sympy.Symbol) and e not in dims:
                dims.add(e)
                out.append(i)
    return out


class SizeCarrier:
    """A size argument n as a graph input: a [n] tensor of stride 0 over one byte, whose first
    dim binds n's symbol as an input tensor's dims bind theirs."""
    _bytes = {}

    @classmethod
    def of(cls, n, device):
        key = device or torch.device("cpu")
        one = cls._bytes.get(key)
        if one is None:
            one = cls._bytes[key] = torch.zeros(1, dtype=torch.uint8, device=key)
        return one.expand(int(n))

    def __init__(self, n):  # an example value: the shape and strides the graph is compiled for
        self.shape, self._stride = (n,), (0,)

    def stride(self):
        return self._stride

    def is_complex(self):
        return False


def bindings(gm, args):
    """Size symbols -> values, read from the arguments of one call (a variant for their
    layouts is compiled with every size fixed)."""
    out = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, arg in zip(placeholders, args):
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and isinstance(val.node.expr, sympy.Symbol):
            out[val.node.expr.name] = int(arg)
        elif isinstance(val, torch.Tensor) and isinstance(arg, torch.Tensor):
            for d, n in zip(val.shape, arg.shape):
                if isinstance(d, torch.SymInt) and isinstance(d.node.expr, sympy.Symbol):
                    out[d.node.expr.name] = int(n)
    return out
