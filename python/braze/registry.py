"""The FX rule registry, a leaf module (it imports only torch and braze._C): each ATen target
maps to the rule that translates it into braze graph ops. Rule modules register with @rule
(real-valued operands) or @complex_rule (complex operands, held as pairs of reals; see
rules_complex), and import what they share from here; fx_import's Translator looks rules up at
translation time, so no module reads or copies another's rules while they are being registered.
Rules name graph ops by their kind (OpKind, Ops.def's enum; op_kind resolves an Ops.def text
name), not by strings."""
import torch

from braze._C import OpKind, op_kind, op_name  # noqa: F401

aten = torch.ops.aten
prims = torch.ops.prims

DTYPES = {
    torch.bool: "bool", torch.uint8: "u8", torch.int8: "i8", torch.int16: "i16",
    torch.int32: "i32", torch.int64: "i64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.float32: "f32", torch.float64: "f64",
}

# A complex value is held as (re, im) pairs of its parts' dtype (see rules_complex).
PARTS_OF_COMPLEX = {torch.complex32: torch.float16, torch.complex64: torch.float32,
                    torch.complex128: torch.float64}

# Names of the floating-point dtypes in the braze graph.
FLOAT_DTYPES = ("f16", "bf16", "f32", "f64")


def bound_args(node):
    """An FX call_function node's arguments by schema name: {name: value}, defaults filled in."""
    out = {}
    for i, arg in enumerate(node.target._schema.arguments):
        if i < len(node.args) and not arg.kwarg_only:
            out[arg.name] = node.args[i]
        else:
            out[arg.name] = node.kwargs.get(arg.name, arg.default_value)
    return out


class Unsupported(Exception):
    """The node cannot be translated; the partitioner leaves it to eager PyTorch."""


def dtype_name(dt):
    if dt not in DTYPES:
        raise Unsupported(f"dtype {dt}")
    return DTYPES[dt]


_REAL_RULES = {}
_COMPLEX_RULES = {}


def _register(table, targets, fn):
    for t in targets:
        if t in table:  # one rule per target: which module loads last must not matter
            raise ValueError(f"two braze rules for {t}: {table[t].__module__}.{table[t].__name__} "
                             f"and {fn.__module__}.{fn.__name__}")
        table[t] = fn


def rule(*targets):
    """Registers fn as the rule of `targets` for real-valued operands."""
    def wrap(fn):
        _register(_REAL_RULES, targets, fn)
        return fn
    return wrap


def complex_rule(*targets):
    """Registers fn as the rule of `targets` that also takes complex operands: it handles
    every node of those targets, and may delegate real-valued ones to real_rule(target)."""
    def wrap(fn):
        _register(_COMPLEX_RULES, targets, fn)
        return fn
    return wrap


def real_rule(target):
    """The real-valued rule of `target`, or None (a complex rule may delegate to it)."""
    return _REAL_RULES.get(target)


def rule_for(target):
    """(rule, whether it takes complex operands) for `target`, or (None, False)."""
    if target in _COMPLEX_RULES:
        return _COMPLEX_RULES[target], True
    return _REAL_RULES.get(target), False


def supported_targets():
    return set(_REAL_RULES) | set(_COMPLEX_RULES)
