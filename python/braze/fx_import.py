"""FX (ATen) graph -> braze graph. Translation only: each supported ATen op maps to one
GraphBuilder call; type inference, checks, decomposition and everything after live in C++."""
import operator

import sympy
import torch

from braze import _C, accuracy

from braze.registry import (FLOAT_DTYPES, PARTS_OF_COMPLEX, OpKind, Unsupported,  # noqa: F401
                            aten, dtype_name, op_kind, prims, rule, rule_for, supported_targets)


def canonical_expr(d):
    """SymInt d's expression with the equalities its shape environment has learned applied
    (two inputs' sizes guarded equal become one symbol; see rules_attention.unify_lengths)."""
    env = d.node.shape_env
    return env.replace(d.node.expr) if env is not None else d.node.expr


class Translator:
    """Builds one braze graph from FX nodes."""

    def __init__(self, bindings=None):
        self.g = _C.Graph()
        # Size symbols fixed to values (a variant compiled for the layouts of one call's
        # inputs): each becomes a constant wherever it appears.
        self.bindings = bindings or {}
        self.values = {}   # fx node -> graph handle (or tuple of handles)
        self.symbols = {}  # sympy symbol name -> sym handle
        self.seed = None   # the i64 seed input, created by the first random op
        # (bool scalar handle, message) of each assertion: extra outputs the host checks after
        # each call (backend._BrazeGraph._check_assertions)
        self.assertions = []
        self.device = None  # the one device (cpu or cuda:N) every tensor of the graph is on

    def on_device(self, device, what):
        """Accepts a tensor or result on `device`: all of a graph's must share one device."""
        device = torch.device(device)
        if device.type not in ("cpu", "cuda"):
            raise Unsupported(f"{what} on {device}")
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if self.device is None:
            self.device = device
        elif device != self.device:
            raise Unsupported(f"{what} on {device} in a graph on {self.device}")

    def seed_input(self, device):
        """The graph's i64 seed input for random ops on `device`, made by the first one."""
        self.on_device(device, "random numbers")
        if self.seed is None:
            self.seed = self.g.input("seed", "i64", [], [])
        return self.seed

    # ---- symbolic sizes -------------------------------------------------------------
    def sym(self, d):
        if isinstance(d, int):
            return self.g.sym_const(d)
        if isinstance(d, torch.SymInt):
            return self.sym_expr(canonical_expr(d))
        raise Unsupported(f"size {d!r}")

    def sym_expr(self, e):
        from torch.utils._sympy.functions import FloorDiv, Mod, ModularIndexing, PythonMod
        if isinstance(e, sympy.Integer):
            return self.g.sym_const(int(e))
        if isinstance(e, sympy.Symbol):
            if e.name in self.bindings:
                return self.g.sym_const(self.bindings[e.name])
            if e.name not in self.symbols:
                self.symbols[e.name] = self.g.size_symbol(e.name)
            return self.symbols[e.name]
        if isinstance(e, (sympy.Add, sympy.Mul)):
            return self.fold("add" if isinstance(e, sympy.Add) else "mul", e.args)
        if isinstance(e, sympy.Pow) and isinstance(e.exp, sympy.Integer) and int(e.exp) > 0:
            b = self.sym_expr(e.base)
            r = b
            for _ in range(int(e.exp) - 1):
                r = self.g.sym_binary("mul", r, b)
            return r
        if isinstance(e, FloorDiv):
            return self.g.sym_binary("floordiv", self.sym_expr(e.args[0]), self.sym_expr(e.args[1]))
        if isinstance(e, (Mod, PythonMod)):
            return self.g.sym_binary("mod", self.sym_expr(e.args[0]), self.sym_expr(e.args[1]))
        if isinstance(e, ModularIndexing):
            x, d, m = (self.sym_expr(a) for a in e.args)
            return self.g.sym_binary("mod", self.g.sym_binary("floordiv", x, d), m)
        if isinstance(e, (sympy.Min, sympy.Max)):
            return self.fold("min" if isinstance(e, sympy.Min) else "max", e.args)
        raise Unsupported(f"symbolic expression {e}")

    def fold(self, op, args):
        """op applied left to right over the translated args."""
        hs = [self.sym_expr(a) for a in args]
        r = hs[0]
        for h in hs[1:]:
            r = self.g.sym_binary(op, r, h)
        return r

    def shape(self, dims):
        return [self.sym(d) for d in dims]

    # ---- nodes ------------------------------------------------------------------------
    def input(self, node, val):
        if not isinstance(val, torch.Tensor):
            raise Unsupported(f"non-tensor input {type(val).__name__}")
        self.on_device(val.device, "input")
        if val.is_complex():
            val = torch.view_as_real(val.resolve_conj())  # (re, im) pairs: see rules_complex
        h = self.g.input(node.name, dtype_name(val.dtype), self.shape(val.shape),
                         self.shape(val.stride()))
        self.values[node] = h
        return h

    def arg(self, a, like=None):
        """A translated operand: an FX node's handle, or a scalar constant."""
        if isinstance(a, torch.fx.Node):
            if a not in self.values:
                val = a.meta.get("val")
                if isinstance(val, torch.SymInt):  # a size as a tensor operand (positions + n)
                    return self.size_scalar(val)
                raise Unsupported(f"operand {a.name} is not a tensor braze holds")
            return self.values[a]
        if isinstance(a, (bool, int, float)):
            return self.g.full(float(a), self.scalar_dtype(a, like), [])
        raise Unsupported(f"operand {a!r}")

    def size_scalar(self, n):
        """SymInt n as a 0-d i64 tensor, which the kernels that read it compute from the size
        symbol (GraphBuilder::sizeScalar)."""
        return self.g.size_scalar(self.sym(n))

    def operands(self, *args):
        """The translated operands of an elementwise op. On CUDA, eager computes a half-precision
        tensor with a Python scalar in f32 (its opmath type) and rounds once, where its CPU
        kernels round the scalar to half first: there the half operands are widened to f32 and
        the scalar kept in f32 (translate() rounds the result to the node's dtype)."""
        like = self.first_tensor(*args)
        if (self.device is not None and self.device.type == "cuda" and like is not None
                and self.g.dtype(like) in ("f16", "bf16")
                and any(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args)):
            out = []
            for a in args:
                if isinstance(a, torch.fx.Node):
                    h = self.arg(a)
                    out.append(self.g.convert(h, "f32") if self.g.dtype(h) in ("f16", "bf16") else h)
                else:
                    out.append(self.arg(a) if isinstance(a, bool) else self.g.full(float(a), "f32", []))
            return out
        return [self.arg(a, like) for a in args]

    def scalar_dtype(self, a, like):
        if isinstance(a, bool):
            return "bool"
        other = self.g.dtype(like) if like is not None else None
        if isinstance(a, int):
            return other if other not in (None, "bool") else "i64"
        return other if other in FLOAT_DTYPES else "f32"

    def translate(self, node):
        fn, accepts_complex = rule_for(node.target)
        if fn is None:
            raise Unsupported(f"op {node.target}")
        if not accepts_complex:
            for a in node.all_input_nodes:
                val = a.meta.get("val")
                if isinstance(val, torch.Tensor) and val.is_complex():
                    raise Unsupported(f"complex operand {a.name} ({val.dtype})")
        self.g.set_name(node.name)
        out = fn(self, node, *node.args, **node.kwargs)
        if isinstance(out, int):
            out = accuracy.perturb(self, node, self.match_meta(node, out))
        self.values[node] = out
        return out

    def match_meta(self, node, h):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            want = dtype_name(PARTS_OF_COMPLEX.get(val.dtype, val.dtype))
            if self.g.dtype(h) != want:
                h = self.g.convert(h, want)
        return h

    def first_tensor(self, *args):
        for a in args:
            if isinstance(a, torch.fx.Node):
                return self.values.get(a)
        return None


def _elementwise(op):
    def fn(t, node, *args, **kwargs):
        return t.g.elementwise(op, t.operands(*args))
    return fn


for _op, _targets in {
    "abs": [aten.abs.default], "neg": [aten.neg.default], "exp": [aten.exp.default],
    "exp2": [aten.exp2.default], "expm1": [aten.expm1.default], "log": [aten.log.default],
    "log2": [aten.log2.default], "log10": [aten.log10.default], "log1p": [aten.log1p.default],
    "sqrt": [aten.sqrt.default], "rsqrt": [aten.rsqrt.default], "sin": [aten.sin.default],
    "cos": [aten.cos.default], "tan": [aten.tan.default], "asin": [aten.asin.default],
    "acos": [aten.acos.default], "atan": [aten.atan.default], "sinh": [aten.sinh.default],
    "cosh": [aten.cosh.default], "tanh": [aten.tanh.default], "asinh": [aten.asinh.default],
    "acosh": [aten.acosh.default], "atanh": [aten.atanh.default], "erf": [aten.erf.default],
    "erfc": [aten.erfc.default], "sigmoid": [aten.sigmoid.default], "sign": [aten.sign.default],
    "floor": [aten.floor.default], "ceil": [aten.ceil.default], "round": [aten.round.default],
    "trunc": [aten.trunc.default], "reciprocal": [aten.reciprocal.default],
    "relu": [aten.relu.default], "isnan": [aten.isnan.default], "isinf": [aten.isinf.default],
    "logical_not": [aten.logical_not.default], "bitwise_not": [aten.bitwise_not.default],
    "mul": [aten.mul.Tensor, aten.mul.Scalar],
    "remainder": [aten.remainder.Tensor, aten.remainder.Scalar],
    "fmod": [aten.fmod.Tensor, aten.fmod.Scalar], "atan2": [aten.atan2.default],
    "maximum": [aten.maximum.default], "minimum": [aten.minimum.default],
    "eq": [aten.eq.Tensor, aten.eq.Scalar], "ne": [aten.ne.Tensor, aten.ne.Scalar],
    "lt": [aten.lt.Tensor, aten.lt.Scalar], "le": [aten.le.Tensor, aten.le.Scalar],
    "gt": [aten.gt.Tensor, aten.gt.Scalar], "ge": [aten.ge.Tensor, aten.ge.Scalar],
    "logical_and": [aten.logical_and.default], "logical_or": [aten.logical_or.default],
    "logical_xor": [aten.logical_xor.default],
    "bitwise_and": [aten.bitwise_and.Tensor, aten.bitwise_and.Scalar],
    "bitwise_or": [aten.bitwise_or.Tensor, aten.bitwise_or.Scalar],
    "bitwise_xor": [aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar],
    "pow": [aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar],
    "lgamma": [aten.lgamma.default], "copysign": [aten.copysign.Tensor, aten.copysign.Scalar],
    "where": [aten.where.self],
}.items():
    rule(*_targets)(_elementwise(op_kind(_op)))


@rule(aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar)
def _add_sub(t, node, a, b, alpha=1):
    x, y = t.operands(a, b)
    subtract = node.target not in (aten.add.Tensor, aten.add.Scalar)
    return t.g.add_scaled(x, y, None if alpha == 1 else t.arg(alpha, y), subtract)


@rule(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div(t, node, a, b, rounding_mode=None):
    x, y = t.operands(a, b)
    if rounding_mode is None:
        return t.g.elementwise(OpKind.Div, [x, y])
    if rounding_mode == "floor":
        return t.g.elementwise(OpKind.FloorDiv, [x, y])
    return t.g.trunc_div(x, y)


@rule(aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default)
def _clamp(t, node, x, lo=None, hi=None):
    if node.target == aten.clamp_max.default:
        lo, hi = None, lo
    h = t.arg(x)
    return t.g.clamp(h, None if lo is None else t.arg(lo, h), None if hi is None else t.arg(hi, h))


@rule(aten.scalar_tensor.default)
def _scalar_tensor(t, node, value, dtype=None, **_):
    return t.g.full(float(value), dtype_name(dtype or torch.get_default_dtype()), [])


@rule(aten.full.default)
def _full(t, node, size, value, dtype=None, **_):
    dt = dtype or node.meta["val"].dtype
    return t.g.full(float(value), dtype_name(dt), t.shape(size))


@rule(aten._to_copy.default, prims.convert_element_type.default)
def _to_copy(t, node, x, dtype=None, **kwargs):
    device = kwargs.get("device")
    if device is not None:
        t.on_device(device, "copy")
    dt = dtype if dtype is not None else node.meta["val"].dtype
    return t.g.convert(t.arg(x), dtype_name(dt))


@rule(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default)
def _identity(t, node, x, **_):
    return t.arg(x)


def _dims(dims, rank):
    if dims is None:
        return []
    if isinstance(dims, int):
        return [dims]
    return list(dims)


@rule(aten.sum.dim_IntList, aten.sum.default)
def _sum(t, node, x, dims=None, keepdim=False, dtype=None):
    return t.g.reduce(OpKind.Sum, t.arg(x), _dims(dims, 0), keepdim,
                      dtype_name(dtype) if dtype else None)


@rule(aten.prod.dim_int, aten.prod.default)
def _prod(t, node, x, dim=None, keepdim=False, dtype=None):
    return t.g.reduce(OpKind.Prod, t.arg(x), _dims(dim, 0), keepdim,
                      dtype_name(dtype) if dtype else None)


@rule(aten.amax.default, aten.amin.default)
def _amax(t, node, x, dims=(), keepdim=False):
    op = OpKind.Amax if node.target == aten.amax.default else OpKind.Amin
    return t.g.reduce(op, t.arg(x), _dims(dims, 0), keepdim, None)


@rule(aten.any.dim, aten.any.dims, aten.any.default, aten.all.dim, aten.all.dims, aten.all.default)
def _any_all(t, node, x, dim=None, keepdim=False):
    op = OpKind.Any if "any" in str(node.target) else OpKind.All
    return t.g.reduce(op, t.arg(x), _dims(dim, 0), keepdim, None)


@rule(aten.argmax.default, aten.argmin.default)
def _argmax(t, node, x, dim=None, keepdim=False):
    op = OpKind.ArgMax if node.target == aten.argmax.default else OpKind.ArgMin
    h = t.arg(x)
    if dim is None:
        # Over the flattened tensor; keepdim keeps every dim as size 1.
        return t.g.reduce(op, h, [], keepdim, None)
    return t.g.reduce(op, h, [dim], keepdim, None)


@rule(aten.max.dim, aten.min.dim)
def _max_dim(t, node, x, dim, keepdim=False):
    h = t.arg(x)
    big = node.target == aten.max.dim
    values = t.g.reduce(OpKind.Amax if big else OpKind.Amin, h, [dim], keepdim, None)
    indices = t.g.reduce(OpKind.ArgMax if big else OpKind.ArgMin, h, [dim], keepdim, None)
    return (values, indices)


@rule(aten.mean.dim, aten.mean.default)
def _mean(t, node, x, dims=None, keepdim=False, dtype=None):
    h = t.arg(x)
    if dtype is not None:
        h = t.g.convert(h, dtype_name(dtype))
    return t.g.mean(h, _dims(dims, 0), keepdim)


@rule(aten.var.correction, aten.var_mean.correction)
def _var(t, node, x, dims=None, correction=None, keepdim=False):
    h = t.arg(x)
    c = 1.0 if correction is None else float(correction)
    v = t.g.var(h, _dims(dims, 0), c, keepdim)
    if node.target == aten.var_mean.correction:
        return (v, t.g.mean(h, _dims(dims, 0), keepdim))
    return v


@rule(aten._softmax.default, aten._log_softmax.default)
def _softmax(t, node, x, dim, half_to_float):
    if half_to_float:
        raise Unsupported("softmax with half_to_float")
    h = t.arg(x)
    return t.g.softmax(h, dim) if node.target == aten._softmax.default else t.g.log_softmax(h, dim)


@rule(aten.native_layer_norm.default)
def _layer_norm(t, node, x, normalized_shape, weight, bias, eps):
    h = t.arg(x)
    axis = len(node.meta["val"][0].shape) - len(normalized_shape)
    w = t.arg(weight) if weight is not None else None
    b = t.arg(bias) if bias is not None else None
    out = t.g.layer_norm(h, axis, w, b, float(eps))
    mean, rstd = t.g.layer_norm_stats(h, axis, float(eps))
    return (out, mean, rstd)


@rule(aten.gelu.default)
def _gelu(t, node, x, approximate="none"):
    return t.g.gelu(t.arg(x), approximate)


@rule(aten.silu.default)
def _silu(t, node, x):
    return t.g.silu(t.arg(x))


@rule(aten._assert_async.msg, aten._assert_async.default)
def _assert_async(t, node, cond, msg="Expected Tensor with single nonzero value, but got zero"):
    """An assertion on a one-element tensor (F.one_hot's range checks, say): the condition
    becomes an extra bool output, which the host checks after the call, raising eager's
    RuntimeError with its message. Only on the CPU: on CUDA the check would synchronize the
    host with the device at every call (eager's is a device-side assertion)."""
    val = cond.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.device.type != "cpu":
        raise Unsupported("an assertion on CUDA (braze checks assertions on the host, which "
                          "would wait for the device at every call)")
    if val.numel() != 1:
        raise Unsupported(f"an assertion on {val.numel()} elements (eager takes one)")
    h = t.g.reshape(t.g.convert(t.arg(cond), "bool"), [])
    t.assertions.append((h, msg))
    return None


@rule(operator.getitem)
def _getitem(t, node, x, i):
    v = t.values.get(x)
    if not isinstance(v, tuple):
        raise Unsupported("getitem of a non-tuple")
    return v[i]


@rule(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(t, node, x, shape):
    return t.g.reshape(t.arg(x), t.shape(node.meta["val"].shape))


@rule(aten.permute.default)
def _permute(t, node, x, dims):
    return t.g.permute(t.arg(x), list(dims))


@rule(aten.t.default)
def _t(t, node, x):
    h = t.arg(x)
    return t.g.permute(h, [1, 0]) if len(t.g.shape(h)) == 2 else h


@rule(aten.transpose.int)
def _transpose(t, node, x, d0, d1):
    h = t.arg(x)
    rank = len(t.g.shape(h))
    perm = list(range(rank))
    if rank:
        perm[d0 % rank], perm[d1 % rank] = perm[d1 % rank], perm[d0 % rank]
    return t.g.permute(h, perm)


@rule(aten.expand.default)
def _expand(t, node, x, size, implicit=False):
    return t.g.expand(t.arg(x), t.shape(node.meta["val"].shape))


@rule(aten.unsqueeze.default)
def _unsqueeze(t, node, x, dim):
    return t.g.unsqueeze(t.arg(x), dim)


@rule(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def _squeeze(t, node, x, dims=None):
    if dims is not None and len(_dims(dims, 0)) == 0:
        return t.arg(x)  # squeeze(()) squeezes nothing; only squeeze() squeezes every unit dim
    return t.g.squeeze(t.arg(x), _dims(dims, 0))


@rule(aten.slice.Tensor)
def _slice(t, node, x, dim=0, start=None, end=None, step=1):
    if end is not None and not isinstance(end, int) and (start is None or isinstance(start, int)):
        # A symbolic end (x[:, :n - 1]): the meta value's length, from a start that needs no
        # normalizing.
        start = 0 if start is None else start
        if start < 0 or not isinstance(step, int):
            raise Unsupported("slice with a symbolic end and a negative start")
        length = node.meta["val"].shape[dim]
        return t.g.slice_length(t.arg(x), dim, start, t.sym(length), step)
    for v in (start, end):
        if v is not None and not isinstance(v, int):
            raise Unsupported("slice with symbolic bounds")
    x_size = x.meta["val"].shape[dim] if isinstance(x, torch.fx.Node) else None
    if (isinstance(x_size, torch.SymInt) and start is not None and start < 0
            and (end is None or end >= 2**62) and step == 1):
        # The last -start elements of a dynamic dim (x[:, -1:]): the first ones of x flipped,
        # flipped back, as many as the meta value has (PyTorch guarded the size).
        d = dim % len(x.meta["val"].shape)
        length = t.sym(node.meta["val"].shape[d])
        return t.g.flip(t.g.slice_length(t.g.flip(t.arg(x), [d]), d, 0, length, 1), [d])
    start = 0 if start is None else start
    end = 2**63 - 1 if end is None else end
    return t.g.slice(t.arg(x), dim, start, end, step)


@rule(aten.select.int)
def _select(t, node, x, dim, index):
    if not isinstance(index, int):
        raise Unsupported("select with a symbolic index")
    return t.g.select(t.arg(x), dim, index)


@rule(aten.gather.default)
def _gather(t, node, x, dim, index, sparse_grad=False):
    return t.g.gather(t.arg(x), dim, t.arg(index))


@rule(aten.cat.default, prims.cat.default)
def _cat(t, node, tensors, dim=0):
    return t.g.concat([t.arg(x) for x in tensors], dim)


@rule(aten.constant_pad_nd.default)
def _constant_pad(t, node, x, pad, value=0):
    """Pads (or, for negative amounts, trims) dims from the last (GraphBuilder::constantPad)."""
    if not all(isinstance(p, int) for p in pad):
        raise Unsupported("symbolic padding")
    return t.g.constant_pad(t.arg(x), list(pad), float(value))


@rule(aten.mm.default, aten.bmm.default, aten.matmul.default)
def _mm(t, node, a, b):
    return t.g.matmul(t.arg(a), t.arg(b))


@rule(aten.addmm.default, aten.baddbmm.default)
def _addmm(t, node, bias, a, b, beta=1, alpha=1):
    return t.g.add_matmul(t.arg(bias), t.arg(a), t.arg(b), float(beta), float(alpha), False)


@rule(aten.cumsum.default, aten.cumprod.default, aten.logcumsumexp.default)
def _scan(t, node, x, dim, dtype=None):
    h = t.arg(x)
    op = {aten.cumsum.default: OpKind.CumSum, aten.cumprod.default: OpKind.CumProd,
          aten.logcumsumexp.default: OpKind.LogCumSumExp}[node.target]
    return t.g.scan(op, h, dim, dtype_name(dtype) if dtype is not None else None)


def _random(t, node, distribution):
    val = node.meta["val"]
    return t.g.random(distribution, dtype_name(val.dtype), t.shape(val.shape),
                      t.seed_input(val.device))


@rule(aten.rand.default, aten.rand_like.default)
def _rand(t, node, *args, **kwargs):
    return _random(t, node, "uniform")


@rule(aten.randn.default, aten.randn_like.default)
def _randn(t, node, *args, **kwargs):
    return _random(t, node, "normal")


@rule(aten.diagonal.default)
def _diagonal(t, node, x, offset=0, dim1=0, dim2=1):
    return t.g.diagonal(t.arg(x), offset, dim1, dim2)


@rule(aten.unfold.default)
def _unfold(t, node, x, dim, size, step):
    return t.g.unfold(t.arg(x), dim, size, step)


@rule(aten.copy.default)
def _copy(t, node, dst, src, non_blocking=False):
    """Functional copy: src converted to dst's dtype and broadcast to its shape."""
    return t.g.copy_like(t.arg(src), t.arg(dst))


@rule(aten.split_with_sizes.default, aten.split.Tensor)
def _split(t, node, x, sizes, dim=0):
    h = t.arg(x)
    dim = dim % max(len(t.g.shape(h)), 1)
    outs = node.meta["val"]
    pieces, start = [], 0
    for out in outs:
        n = out.shape[dim]
        if not isinstance(n, int):
            raise Unsupported("split of a dynamic dim")
        pieces.append(t.g.slice(h, dim, start, start + n, 1))
        start += n
    return tuple(pieces)


@rule(prims.rev.default)
def _rev(t, node, x, dims):
    return t.g.flip(t.arg(x), list(dims))


@rule(prims.iota.default)
def _iota(t, node, length, *, start, step, dtype, device, requires_grad):
    t.on_device(device, "iota")
    return t.g.arange(dtype_name(dtype), t.sym(node.meta["val"].shape[0]), float(start),
                      float(step))


@rule(aten.full_like.default)
def _full_like(t, node, x, value, dtype=None, **_):
    val = node.meta["val"]
    return t.g.full(float(value), dtype_name(val.dtype), t.shape(val.shape))
