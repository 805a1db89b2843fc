"""An FX graph's calling convention as data: what each placeholder is, which outputs braze
computes, and how each other output is made at each call (None, a view of an argument, a view
of a computed base, a member of a group sharing storage). graph_signature computes it once from
the graph and the translator's values; torch.compile's call path runs it (GraphSignature.fill)
and braze.export reads it to refuse what a package cannot hold. It prints, so a log or a
report can show it.

An output that is a view in eager is made as that view, not computed into new memory:
AOTAutograd regenerates an output aliasing an input from its strides, and a saved activation
returned beside its transpose must share its storage, as eager's does."""
import dataclasses
import functools
import operator

import torch

from braze import sizes
from braze.layouts import as_layout, concrete_layout
from braze.registry import Unsupported

aten = torch.ops.aten


# ---- parts -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Input:
    """Placeholder `position`: a tensor (laid out as `layout`, (sizes, strides), when both are
    numbers), a size the tensors' dims bind, or a size passed as a SizeCarrier ("carried")."""
    position: int
    name: str
    kind: str  # "tensor", "size" or "carried"
    layout: tuple = None

    def __str__(self):
        if self.kind != "tensor":
            return f"{self.position} {self.name}: {'carried ' * (self.kind == 'carried')}size"
        where = f" {_dims(self.layout[0])} strides {_dims(self.layout[1])}" if self.layout else ""
        return f"{self.position} {self.name}: tensor{where}"


@dataclasses.dataclass(frozen=True)
class Size:
    """A size read at each call: argument `position` when `target` is None, else `target`
    applied to `args` (sizes and constants), as sym_size(x, 0) of tensor argument x."""
    name: str
    position: int = None
    target: object = None
    args: tuple = ()
    kwargs: tuple = ()  # (name, value) pairs

    def value(self, call_args):
        if self.target is None:
            return call_args[self.position]
        return self.target(*_resolve(self.args, call_args),
                           **dict(_resolve(self.kwargs, call_args)))

    def __str__(self):
        if self.target is None:
            return f"arg{self.position}"
        return _call_text(self.target, self.args, self.kwargs)


@dataclasses.dataclass(frozen=True)
class ViewStep:
    """One view op: op(x, *args, **dict(kwargs)), with each Size among its arguments read at
    the call."""
    op: object
    args: tuple
    kwargs: tuple = ()  # (name, value) pairs

    def apply(self, x, call_args):
        return self.op(x, *_resolve(self.args, call_args),
                       **dict(_resolve(self.kwargs, call_args)))

    def __str__(self):
        return "." + _call_text(self.op, self.args, self.kwargs)


# ---- output slots: how each returned output is made ------------------------------------
@dataclasses.dataclass(frozen=True)
class Computed:
    """Braze output `index`, of `dtype` (a complex value comes as pairs of that real dtype and
    is returned as complex). braze computes it with `strides` (a dense permutation: a transposed
    or channels-last result; None: row-major), and lays it out as `layout` (sizes, strides:
    a strided or expanded result) after."""
    index: int
    name: str
    dtype: torch.dtype
    complex: bool = False
    strides: tuple = None
    layout: tuple = None

    def make(self, args, outs, bases):
        x = outs[self.index]
        if self.complex:
            x = torch.view_as_complex(x)
        return as_layout(x, *self.layout) if self.layout is not None else x

    def __str__(self):
        text = f"#{self.index} {self.name} {_dtype(self.dtype)}"
        if self.complex:
            text += " pairs, returned complex"
        if self.strides is not None:
            text += f", computed with strides {_dims(self.strides)}"
        if self.layout is not None:
            text += f", laid out as {_dims(self.layout[0])} strides {_dims(self.layout[1])}"
        return text


@dataclasses.dataclass(frozen=True)
class NoOutput:
    """None (no gradient for an input, say)."""

    def make(self, args, outs, bases):
        return None

    def __str__(self):
        return "None"


@dataclasses.dataclass(frozen=True)
class NotTensor:
    """An output braze does not compute as a tensor (`text`: its repr), which no caller takes."""
    text: str

    def __str__(self):
        return f"not a tensor: {self.text}"


@dataclasses.dataclass(frozen=True)
class InputView:
    """Argument `position` (named `name`), or the view `steps` make of it: a weight, or its
    transpose, saved for the backward."""
    position: int
    name: str
    steps: tuple = ()

    def make(self, args, outs, bases):
        x = args[self.position]
        for step in self.steps:
            x = step.apply(x, args)
        return x

    def __str__(self):
        return f"input {self.position} ({self.name}){''.join(map(str, self.steps))}"


@dataclasses.dataclass(frozen=True)
class BaseView:
    """A view of computed base `base` that is not dense itself (a K/V cache sliced from a fused
    projection): as_strided `strided` (size, stride, offset from the base's start) when its
    sizes are numbers, else the view `steps`."""
    base: int
    strided: tuple = None
    steps: tuple = ()

    def make(self, args, outs, bases):
        b = bases[self.base]
        if self.strided is not None:
            return _as_strided(b, *self.strided)
        for step in self.steps:
            b = step.apply(b, args)
        return b

    def __str__(self):
        if self.strided is not None:
            return f"base {self.base} as {_strided_text(*self.strided)}"
        return f"base {self.base}{''.join(map(str, self.steps))}"


@dataclasses.dataclass(frozen=True)
class SharedStorage:
    """A member of a group of outputs that share storage in eager (a saved activation beside
    its transpose): `size`, `stride` and `offset` over computed base `base`, which covers the
    group's memory densely from its start."""
    base: int
    size: tuple
    stride: tuple
    offset: int

    def make(self, args, outs, bases):
        return _as_strided(bases[self.base], self.size, self.stride, self.offset)

    def __str__(self):
        return f"base {self.base} shared as {_strided_text(self.size, self.stride, self.offset)}"


@dataclasses.dataclass(frozen=True)
class Base:
    """A value computed as braze output `index`, not returned itself: outputs are made of it."""
    index: int
    name: str
    dtype: torch.dtype
    strides: tuple = None  # as Computed.strides

    def __str__(self):
        text = f"#{self.index} {self.name} {_dtype(self.dtype)}"
        return text + (f", computed with strides {_dims(self.strides)}"
                       if self.strides is not None else "")


@dataclasses.dataclass(frozen=True)
class GraphSignature:
    """An FX graph's calling convention. braze's outputs are the Computed slots' values (in
    slot order), then the bases, then each assertion's condition."""
    inputs: tuple
    constants: tuple  # get_attr targets, passed after the arguments
    outputs: tuple    # one slot per returned output
    bases: tuple = ()
    assertions: tuple = ()  # the message of each assertion
    returns_tuple: bool = True

    @functools.cached_property
    def computed(self):
        return [s for s in self.outputs if isinstance(s, Computed)]

    @functools.cached_property
    def computes(self):
        """Whether braze computes anything (else every output is made at the call)."""
        return bool(self.computed or self.bases)

    @functools.cached_property
    def direct(self):
        """Whether the outputs are braze's as they come."""
        return not self.bases and all(isinstance(s, Computed) and not s.complex
                                      and s.layout is None for s in self.outputs)

    @functools.cached_property
    def tensor_positions(self):
        """The argument position of each tensor input of the braze graph (placeholders' tensors,
        then carried sizes)."""
        return ([i.position for i in self.inputs if i.kind == "tensor"]
                + [i.position for i in self.inputs if i.kind == "carried"])

    @functools.cached_property
    def carried(self):
        """(input number, argument position) of each carried size."""
        return [(k, i) for k, i in enumerate(self.tensor_positions)
                if self.inputs[i].kind == "carried"]

    def fill(self, args, outs):
        """The outputs the graph returns for call arguments `args`, from braze's outputs `outs`
        (assertions' conditions dropped already)."""
        if self.direct:
            return outs
        bases = outs[len(self.computed):]
        return [slot.make(args, outs, bases) for slot in self.outputs]

    def __str__(self):
        lines = ["inputs:"] + [f"  {i}" for i in self.inputs]
        if self.constants:
            lines.append(f"constants: {', '.join(self.constants)}")
        lines.append("outputs:")
        lines += [f"  {j}: {slot}" for j, slot in enumerate(self.outputs)]
        if self.bases:
            lines.append("bases:")
            lines += [f"  {k}: {b}" for k, b in enumerate(self.bases)]
        first = len(self.computed) + len(self.bases)
        lines += [f"assertion #{first + k}: {msg!r}" for k, msg in enumerate(self.assertions)]
        return "\n".join(lines)


# ---- computing it ----------------------------------------------------------------------
def inputs(gm):
    """The Input of each placeholder of gm; Unsupported for one that is neither a tensor nor a
    size."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    carried = set(sizes.carried(placeholders))
    out = []
    for i, node in enumerate(placeholders):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            out.append(Input(i, node.name, "tensor", concrete_layout(val)))
        elif isinstance(val, (torch.SymInt, int)):
            out.append(Input(i, node.name, "carried" if i in carried else "size"))
        else:
            raise Unsupported(f"placeholder {node.name} of type {type(val).__name__}")
    return tuple(out)


def graph_signature(gm, values, assertions=(), *, views=True):
    """The GraphSignature of gm, whose nodes translate to `values` (FX node -> braze handle, an
    int for a tensor), with the messages of its `assertions`. With `views` False (a package,
    which computes every output itself) no output is made as a view: each is None, the input
    itself, computed, or not a tensor."""
    ins = inputs(gm)
    position = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    constants = tuple(n.target for n in gm.graph.nodes if n.op == "get_attr")
    returned = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
    flat = list(returned) if isinstance(returned, (tuple, list)) else [returned]
    made = [NoOutput() if o is None else
            _input_view(o, position) if views else
            InputView(position[o], o.name) if o in position else None for o in flat]
    signature = functools.partial(GraphSignature, ins, constants,
                                  returns_tuple=isinstance(returned, (tuple, list)))
    if all(m is not None for m in made):  # nothing to compute (nor to assert)
        return signature(tuple(made))
    bases = []

    def base_of(node):
        """node's number among the bases (added once)."""
        if node not in bases:
            bases.append(node)
        return bases.index(node)

    for j, o in enumerate(flat):
        found = _base_view(o) if views and made[j] is None else None
        if found is not None and isinstance(values.get(found[0]), int):
            made[j] = BaseView(base_of(found[0]), *found[1:])
    for base, members in (_shared_storage(flat, made) if views else ()):
        k = base_of(base)
        for j, size, stride, offset in members:
            made[j] = SharedStorage(k, size, stride, offset)
    index = 0
    for j, o in enumerate(flat):
        if made[j] is not None:
            continue
        if not isinstance(o, torch.fx.Node) or not isinstance(values.get(o), int):
            made[j] = NotTensor(repr(o))
            continue
        val = o.meta.get("val")
        is_complex = isinstance(val, torch.Tensor) and val.is_complex()
        real = torch.view_as_real(val.resolve_conj()) if is_complex else val
        strides, declared = _dense_strides(real), concrete_layout(val)
        layout = declared if declared is not None and strides is None and \
            not real.is_contiguous() else None
        made[j] = Computed(index, o.name, real.dtype if isinstance(real, torch.Tensor) else None,
                           is_complex, strides, layout)
        index += 1
    based = tuple(Base(index + k, b.name, b.meta["val"].dtype, _dense_strides(b.meta["val"]))
                  for k, b in enumerate(bases))
    return signature(tuple(made), based, tuple(assertions))


def _dense_strides(val):
    """val's strides when they are a dense permutation other than row-major (a transposed or
    channels-last result), which braze computes directly; None otherwise."""
    if not isinstance(val, torch.Tensor):
        return None
    from torch._prims_common import is_non_overlapping_and_dense_or_false
    try:
        dense = bool(is_non_overlapping_and_dense_or_false(val))
    except Exception:  # symbolic strides that cannot be decided: keep row-major
        return None
    if not dense or val.is_contiguous():
        return None
    return tuple(val.stride())


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
    if whole.op != "call_function" or any(isinstance(a, torch.fx.Node) for a in
                                          list(whole.args[1:]) + list(whole.kwargs.values())):
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
    only node operand is the previous one: the node they view and the (op, args, kwargs) that
    make `out` from it; (out, []) when out is no view. With `sizes`, a view may also read sizes
    (SymInt nodes, an expand's symbolic length), which stay nodes in its step."""
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


def _input_view(out, position):
    """InputView for an output that is a tensor argument the graph does not mutate, or a chain
    of view ops over one with no other node among their operands; None otherwise. CUDA graphs
    return a view of the caller's own argument for one they copy per call
    (cudagraphs._Capture)."""
    node, steps = _view_chain(out, sizes=True)
    if not isinstance(node, torch.fx.Node) or node not in position:
        return None
    if any(u.op == "call_function" and "copy_" in str(u.target) for u in node.users):
        return None

    def size(a):
        if a.op == "placeholder":
            return Size(a.name, position[a])
        args, kwargs = torch.fx.node.map_arg((a.args, a.kwargs), size)
        return Size(a.name, target=a.target, args=tuple(args), kwargs=tuple(kwargs.items()))
    return InputView(position[node], node.name, tuple(_step(step, size) for step in steps))


def _step(step, size=None):
    """(op, args, kwargs) as a ViewStep, each size node among its arguments as a Size."""
    op, args, kwargs = step
    if size is not None:
        args, kwargs = torch.fx.node.map_arg((args, kwargs), size)
    return ViewStep(op, tuple(args), tuple(kwargs.items()))


def _base_view(out):
    """For an output that views a computed value without being a dense tensor itself (a K/V
    cache sliced from a fused projection, an expanded bias): (base node, as_strided (size,
    stride, offset) or None, view steps). The base, dense, is computed as an output of its own
    and the view made of it at each call, as eager returns it, instead of a copy. None
    otherwise."""
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
        return base, static, ()
    return base, None, tuple(_step(step) for step in steps)


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


def _shared_storage(flat, made):
    """Groups of outputs (positions in `flat` whose `made` slot is None) that share memory in
    eager: a saved activation returned twice, or with its reshape or transpose beside it. For
    each group whose memory one member covers densely from its start (the base): (base node,
    [(position, size, stride, storage offset)] of every member). braze computes the base once
    and makes each member of it, as eager's views are, in place of a copy per output."""
    from torch._prims_common import is_non_overlapping_and_dense_or_false
    from torch.multiprocessing.reductions import StorageWeakRef
    groups = {}
    for j, o in enumerate(flat):
        val = o.meta.get("val") if isinstance(o, torch.fx.Node) and made[j] is None else None
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


# ---- helpers ---------------------------------------------------------------------------
def _as_strided(b, size, stride, offset):
    return b.as_strided(size, stride, b.storage_offset() + offset)


def _resolve(a, call_args):
    """a with each Size in it (nested in tuples and lists) read from the call's arguments."""
    if isinstance(a, Size):
        return a.value(call_args)
    if isinstance(a, tuple):
        return tuple(_resolve(v, call_args) for v in a)
    if isinstance(a, list):
        return [_resolve(v, call_args) for v in a]
    return a


def _call_text(op, args, kwargs):
    """op(args, kwargs) as text: aten.transpose.int as transpose.int, a Python function
    (operator.mul) by its name."""
    args = [_text(a) for a in args] + [f"{k}={_text(v)}" for k, v in kwargs]
    return f"{getattr(op, '__name__', None) or op}({', '.join(args)})"


def _text(a):
    if isinstance(a, (tuple, list)):
        return "[" + ", ".join(_text(v) for v in a) + "]"
    return str(a)


def _dims(dims):
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _strided_text(size, stride, offset):
    return f"{_dims(size)} strides {_dims(stride)} offset {offset}"


def _dtype(dtype):
    return str(dtype).replace("torch.", "")
