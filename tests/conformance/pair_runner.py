"""Checks one (OpInfo, dtype) pair of op_db through torch.compile(backend="braze") against eager.
Runs inside a worker process of op_db_sweep.py; each call returns a JSON-able record.

Steps of `check_pair`:
  1. Take up to N sample inputs that eager runs (samples eager raises on are skipped); eager runs
     each twice, seeded 0 and 1, and a sample whose two eager results differ (random, e.g.
     scaled_dot_product_attention with dropout_p > 0, or uninitialized memory) is compared by
     shape and dtype only, as are all samples of the ops named as random in RANDOM_MARKERS.
     The compiled call is seeded 0 too.
  2. Compile a closure over the sample's non-tensor arguments whose parameters are its tensors
     (so they are graph inputs, not constants), on fresh copies of the inputs.
  3. Classify: crashed (the compiled call raised) > wrong (a result mismatched) > fell back
     (braze's fallback counters moved, or no braze graph was compiled) > compiled; "views" is a
     pair whose graphs braze took whole with nothing to compute (every output a view of an
     input, made at each call), so neither compiled code nor eager ran.
  4. For a crashed or wrong pair, rerun the failing sample through AOTAutograd with braze's
     decomposition table and an eager compiler: if that fails too, the fault is upstream of braze's
     translation and code generation (Dynamo, AOTAutograd or a decomposition).
"""
import io
import itertools
import logging
import os
import re
import sys
import time
import traceback
import warnings

import torch
import torch._dynamo
import torch.utils._pytree as pytree
import torch.testing._internal.common_methods_invocations as _cmi
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_device_type import toleranceOverride

import braze

# OpInfo names containing one of these make random (or uninitialized) outputs: shape/dtype only.
RANDOM_MARKERS = ("rand", "normal", "bernoulli", "dropout", "multinomial", "uniform", "exponential",
                  "geometric", "cauchy", "log_normal",
                  # not in the list, but random or uninitialized as well
                  "empty", "resize_", "fractional_max_pool", "lowrank")
# ... except these, deterministic despite their names (the eager seed check still applies).
NOT_RANDOM = frozenset(("__rand__", "nn.functional.normalize", "masked.normalize",
                        "signal.windows.exponential", "native_dropout_backward",
                        "nn.functional.feature_alpha_dropout.without_train"))
FALLBACK_HEADER = "===== braze: fallback ====="
FALLBACK_LINE = re.compile(r"^(?P<node>\S+) \((?P<target>[^()]*)\): (?P<reason>.*)$")
MAX_SAMPLES_SCANNED = 24  # samples tried per pair while looking for N that eager runs



def _call_without_seed(op, *args, **kwargs):
    return op(*args, **kwargs)


# OpInfos of random ops wrap the call in wrapper_set_seed, whose freeze_rng_state Dynamo cannot
# trace (a graph break before the op). The harness seeds before each eager and compiled call
# instead, as PyTorch's Inductor OpInfo tests do.
_cmi.wrapper_set_seed = _call_without_seed

OPS = {(op.name + ("." + op.variant_test_name if op.variant_test_name else "")): op for op in op_db}


def variant_name(op):
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def is_random(name):
    return name not in NOT_RANDOM and any(m in name for m in RANDOM_MARKERS)


def setup_worker():
    """Called once in each worker process."""
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)
    cfg = torch._dynamo.config
    for key in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                "accumulated_recompile_limit"):
        if hasattr(cfg, key):
            setattr(cfg, key, 4096)


# ---------------------------------------------------------------------------------------------
# Inputs


def _copy_tensor(t, memo):
    """An exact copy: same sizes, strides and storage offset (expanded and non-contiguous
    inputs stay so); tensors sharing one object stay shared."""
    if id(t) in memo:
        return memo[id(t)]
    c = torch.empty(0, dtype=t.dtype, device=t.device)
    c.set_(t.untyped_storage().clone(), t.storage_offset(), t.size(), t.stride())
    memo[id(t)] = c
    return c


def copy_tree(tree):
    memo = {}
    return pytree.tree_map_only(torch.Tensor, lambda t: _copy_tensor(t, memo), tree)


def describe(x, limit=120):
    """A short description of an argument: tensors by dtype, shape and layout."""
    if isinstance(x, torch.Tensor):
        s = f"T{list(x.shape)}:{str(x.dtype).replace('torch.', '')}"
        if x.numel() > 1 and not x.is_contiguous():
            s += f" strides={list(x.stride())}"
        return s
    if isinstance(x, (list, tuple)):
        inner = ", ".join(describe(v, limit) for v in x)
        return ("[" + inner + "]") if isinstance(x, list) else ("(" + inner + ("," if len(x) == 1 else "") + ")")
    r = repr(x)
    return r if len(r) <= limit else r[:limit] + "..."


def describe_sample(s):
    parts = [describe(s.input)] + [describe(a) for a in s.args]
    parts += [f"{k}={describe(v)}" for k, v in s.kwargs.items()]
    return ", ".join(parts)


def make_compiled_callable(fn, inp, args, kwargs, backend):
    """torch.compile of a closure over the non-tensor leaves, taking the tensor leaves."""
    leaves, spec = pytree.tree_flatten((inp, args, kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

    def closure(*tensors):
        filled = list(leaves)
        for i, t in zip(positions, tensors):
            filled[i] = t
        a, b, c = pytree.tree_unflatten(filled, spec)
        return fn(a, *b, **c)

    compiled = torch.compile(closure, backend=backend, dynamic=False)
    return compiled, [leaves[i] for i in positions]


# ---------------------------------------------------------------------------------------------
# Comparison


def tolerances(op, dtype, out_dtype):
    """(atol, rtol) for a result of dtype out_dtype of the pair (op, dtype): exact for integer
    and bool results; else assert_close's defaults for out_dtype, at least 1e-2 for a float16 or
    bfloat16 result, widened to the OpInfo's own toleranceOverride for dtype on CPU if any."""
    from torch.testing._comparison import default_tolerances
    if not (out_dtype.is_floating_point or out_dtype.is_complex):
        return 0.0, 0.0
    rtol, atol = default_tolerances(out_dtype)
    if out_dtype in (torch.float16, torch.bfloat16):
        atol, rtol = max(atol, 1e-2), max(rtol, 1e-2)
    for dec in op.decorators:
        if getattr(dec, "device_type", None) not in (None, "cpu"):
            continue
        for d in getattr(dec, "decorators", [dec]):
            if isinstance(d, toleranceOverride) and dtype in d.d:
                atol, rtol = max(atol, d.d[dtype].atol), max(rtol, d.d[dtype].rtol)
    return atol, rtol


def _max_abs_diff(actual, expected):
    if actual.shape != expected.shape:
        return None
    if actual.numel() == 0:
        return 0.0
    a, e = actual.detach().double(), expected.detach().double()
    both_nan = torch.isnan(a) & torch.isnan(e)
    diff = (a - e).abs().masked_fill(both_nan, 0.0)
    diff = diff.masked_fill(torch.isnan(diff), float("inf"))  # nan against a number
    same_inf = (a == e)
    diff = diff.masked_fill(same_inf, 0.0)
    return float(diff.max())


def _mismatch(actual, expected, atol, rtol):
    """'k/n elements mismatch; worst at index i: compiled x, eager y; max abs diff d (allowed
    atol, rtol)', the worst being the element furthest past its allowed difference."""
    a, e = actual.detach().double().reshape(-1), expected.detach().double().reshape(-1)
    bad = ~torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    excess = ((a - e).abs() - (atol + rtol * e.abs())).nan_to_num(float("inf"))
    worst = int(torch.where(bad, excess, torch.full_like(excess, -float("inf"))).argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), expected.shape)) \
        if expected.dim() else ()
    return (f"{int(bad.sum())}/{e.numel()} elements mismatch; worst at index {index}: compiled "
            f"{a[worst].item():.6g}, eager {e[worst].item():.6g}; max abs diff "
            f"{_max_abs_diff(actual, expected):.4g} (allowed atol {atol:g}, rtol {rtol:g})")


def compare(actual, expected, tol, shape_only):
    """(None, None) when they match, else (a one-line description of the first mismatch, its
    max abs difference or None). tol(dtype) gives (atol, rtol) for a result of that dtype."""
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    if len(a_leaves) != len(e_leaves):
        return f"output structure differs: compiled {a_spec}, eager {e_spec}", None
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        where = f"output[{i}]" if len(e_leaves) > 1 else "output"
        if isinstance(e, torch.Tensor) or isinstance(a, torch.Tensor):
            if not (isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor)):
                return f"{where}: compiled {type(a).__name__}, eager {type(e).__name__}", None
            if a.shape != e.shape or a.dtype != e.dtype:
                return (f"{where}: compiled {describe(a)}, eager {describe(e)}", None)
            if shape_only:
                continue
            atol, rtol = tol(e.dtype)
            try:
                torch.testing.assert_close(a, e, atol=atol, rtol=rtol, equal_nan=True,
                                           check_stride=False)
            except AssertionError:
                diff = _max_abs_diff(a, e)
                return f"{where} {describe(e)}: {_mismatch(a, e, atol, rtol)}", diff
        elif isinstance(e, (bool, int, float, complex)) and isinstance(a, (bool, int, float, complex)):
            if shape_only:
                continue
            atol, rtol = tol(torch.float64 if isinstance(e, (float, complex)) else torch.int64)
            try:
                torch.testing.assert_close(a, e, atol=atol, rtol=rtol, equal_nan=True)
            except (AssertionError, TypeError, ValueError):
                return f"{where}: compiled {a!r}, eager {e!r}", None
        elif a != e:
            return f"{where}: compiled {a!r}, eager {e!r}", None
    return None, None


# Ops whose indices among tied values PyTorch does not guarantee (torch.topk: "the indices of
# tied elements are not guaranteed to be stable and may vary across different invocations";
# torch.sort and argsort without stable=True): their values are compared, and their indices
# must pick those values from the input along the op's dim. {name: the position of dim among
# the sample's args}.
_TIES_UNSPECIFIED = {"topk": 1, "sort": 0, "argsort": 0}


def _picks(x, dim, indices, values):
    """Whether x's elements at `indices` along dim are `values` (NaN picking NaN)."""
    picked = x.gather(dim, indices)
    same = (picked == values) | ((picked != picked) & (values != values))
    return picked.shape == values.shape and bool(same.all())


def _ties_as_eager(name, sample, actual, expected):
    """For an op of _TIES_UNSPECIFIED: `actual` with eager's indices in place of its own where
    its own pick the values (eager's, for argsort) from the input along the op's dim, so that
    only the values are compared; `actual` unchanged otherwise (and for a stable sort)."""
    x = sample.input
    if (name not in _TIES_UNSPECIFIED or sample.kwargs.get("stable")
            or not isinstance(x, torch.Tensor) or x.dim() == 0):
        return actual
    at = _TIES_UNSPECIFIED[name]
    dim = sample.args[at] if len(sample.args) > at else sample.kwargs.get("dim", -1)
    if isinstance(actual, torch.Tensor):  # argsort: the indices alone
        ok = isinstance(expected, torch.Tensor) and _picks(x, dim, actual,
                                                           x.gather(dim, expected))
        return expected if ok else actual
    if not isinstance(actual, (tuple, list)) or len(actual) != 2:
        return actual
    values, indices = actual
    if not _picks(x, dim, indices, values):
        return actual
    return type(actual)((values, expected[1])) if isinstance(actual, tuple) else [values, expected[1]]


# ---------------------------------------------------------------------------------------------
# One pair


def _first_line(e):
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def _fault_site(tb):
    """The innermost frame of the traceback in braze, torch or elsewhere, as 'file:line'."""
    frames = traceback.extract_tb(tb)
    for f in reversed(frames):
        if "/braze/" in f.filename:
            return f"{f.filename.split('/braze/')[-1]}:{f.lineno} (braze)"
    if frames:
        f = frames[-1]
        return f"{f.filename.split('site-packages/')[-1]}:{f.lineno}"
    return ""


def _decomp_eager_backend():
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from braze.decompositions import table as _decompositions

    def compiler(gm, example_inputs):
        return make_boxed_func(gm.forward)
    return aot_autograd(fw_compiler=compiler, bw_compiler=compiler,
                        decompositions=_decompositions())


def _run_compiled(fn, sample, backend):
    inp, args, kwargs = copy_tree((sample.input, sample.args, sample.kwargs))
    compiled, tensors = make_compiled_callable(fn, inp, args, kwargs, backend)
    torch.manual_seed(0)
    return compiled(*tensors)


def _eager(fn, sample, seed=0):
    inp, args, kwargs = copy_tree((sample.input, sample.args, sample.kwargs))
    torch.manual_seed(seed)
    return fn(inp, *args, **kwargs)


def _is_deterministic(first, second):
    return compare(first, second, lambda dtype: (0.0, 0.0), False)[0] is None


def _diagnose(fn, sample, expected, tol, shape_only):
    """Reruns a failing sample with braze's decompositions and no braze code generation."""
    torch._dynamo.reset()
    try:
        out = _run_compiled(fn, sample, _decomp_eager_backend())
    except Exception as e:
        return f"also fails without braze codegen: {_first_line(e)}"
    why, _ = compare(out, expected, tol, shape_only)
    if why is not None:
        return f"also wrong without braze codegen: {why}"
    return "passes with braze's decompositions and eager kernels (fault in braze)"


def _save_repro(name, dtype_name, sample, expected):
    """Saves the failing sample and eager's result under $CONFORMANCE_REPRO_DIR; returns the path.
    Replay: d = torch.load(path, weights_only=False); inp, args, kwargs = d["sample"];
    OPS[d["op"]].op(inp, *args, **kwargs) is eager's d["expected"]."""
    folder = os.environ.get("CONFORMANCE_REPRO_DIR")
    if not folder:
        return ""
    path = os.path.join(folder, f"{name}-{dtype_name}.pt")
    try:
        os.makedirs(folder, exist_ok=True)
        torch.save({"op": name, "dtype": dtype_name,
                    "sample": copy_tree((sample.input, sample.args, sample.kwargs)),
                    "expected": expected}, path)
        return path
    except Exception as e:  # a sample torch.save cannot write; the description stays
        return f"not saved ({_first_line(e)})"


def replay(path):
    """Reruns a saved failing sample eagerly and through braze; returns a report line."""
    d = torch.load(path, weights_only=False)
    op, dtype = OPS[d["op"]], getattr(torch, d["dtype"])
    inp, args, kwargs = d["sample"]
    sample = type("Sample", (), {"input": inp, "args": args, "kwargs": kwargs})()
    expected = _eager(op.op, sample)
    torch._dynamo.reset()
    try:
        actual = _run_compiled(op.op, sample, "braze")
    except Exception as e:
        return f"{d['op']} {d['dtype']} ({describe_sample(sample)}): compiled raised {_first_line(e)}"
    why, _ = compare(actual, expected, lambda out: tolerances(op, dtype, out), is_random(d["op"]))
    return f"{d['op']} {d['dtype']} ({describe_sample(sample)}): {why or 'matches eager now'}"


def parse_fallbacks(text):
    """The lines following each fallback header: 'node (target): reason' or a graph reason."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.strip() == FALLBACK_HEADER and i + 1 < len(lines):
            out.append(lines[i + 1].strip())
    return out


def check_pair(name, dtype_name, nsamples, progress=lambda msg: None):
    op = OPS[name]
    dtype = getattr(torch, dtype_name)
    fn = op.op
    shape_only = is_random(name)
    tol = lambda out_dtype: tolerances(op, dtype, out_dtype)  # noqa: E731
    atol, rtol = tol(dtype) if dtype.is_floating_point else tol(torch.float64)
    rec = {"op": name, "dtype": dtype_name, "status": None, "reason": "", "sample": "",
           "samples_run": 0, "shape_only_samples": 0, "eager_failures": 0, "fallbacks": [],
           "graph_breaks": [], "shape_only": shape_only, "atol": atol, "rtol": rtol,
           "diagnosis": "", "max_abs_diff": None}
    t0 = time.time()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    before = braze.counters()
    captured = io.StringIO()
    old_stderr = sys.stderr
    sys.stderr = captured
    failure = None  # (status, reason, sample, expected, shape_only)
    try:
        torch.manual_seed(0)
        try:
            samples = op.sample_inputs("cpu", dtype, requires_grad=False)
            for k, sample in enumerate(itertools.islice(samples, MAX_SAMPLES_SCANNED)):
                if rec["samples_run"] >= nsamples:
                    break
                progress(f"eager, sample {k}: {describe_sample(sample)}")
                try:
                    expected = _eager(fn, sample)
                    again = _eager(fn, sample, seed=1)
                except Exception:
                    rec["eager_failures"] += 1
                    continue
                sample_shape_only = shape_only or not _is_deterministic(expected, again)
                rec["shape_only_samples"] += sample_shape_only
                rec["samples_run"] += 1
                progress(f"compiled, sample {k}: {describe_sample(sample)}")
                try:
                    actual = _run_compiled(fn, sample, "braze")
                except Exception as e:
                    failure = ("crashed", f"{_first_line(e)} [at {_fault_site(e.__traceback__)}]",
                               sample, expected, sample_shape_only)
                    break
                actual = _ties_as_eager(name, sample, actual, expected)
                why, diff = compare(actual, expected, tol, sample_shape_only)
                if why is not None and failure is None:
                    rec["max_abs_diff"] = diff
                    failure = ("wrong", why, sample, expected, sample_shape_only)
        except Exception as e:  # the sample generator itself raised
            if rec["samples_run"] == 0:
                rec["status"] = "eager_fails"
                rec["reason"] = f"sample_inputs raised {_first_line(e)}"
    finally:
        sys.stderr = old_stderr
    after = braze.counters()
    rec["fallbacks"] = sorted(set(parse_fallbacks(captured.getvalue())))
    rec["graph_breaks"] = sorted(str(k)[:200] for k in torch._dynamo.utils.counters["graph_break"])
    if failure is not None:
        status, reason, sample, expected, sample_shape_only = failure
        rec.update(status=status, reason=reason, sample=describe_sample(sample))
        rec["diagnosis"] = _diagnose(fn, sample, expected, tol, sample_shape_only)
        rec["repro"] = _save_repro(name, dtype_name, sample, expected)
    elif rec["status"] is None and rec["samples_run"] == 0:
        rec["status"] = "eager_fails"
        rec["reason"] = rec["reason"] or "eager raised on every sample (or there were none)"
    elif rec["status"] is None:
        d = {k: after[k] - before[k] for k in after}
        if d["fallback_ops"] or d["fallback_graphs"]:
            rec["status"] = "fell_back"
        elif (d["graphs_compiled"] == 0 and d["cache_hits"] == 0 and d["graphs"] > 0
              and not rec["graph_breaks"]):
            # braze took every graph and found nothing to compute: each output is a view of an
            # input, which it makes at each call (or AOTAutograd regenerates). No eager op ran.
            rec["status"] = "views"
        elif d["graphs_compiled"] == 0 and d["cache_hits"] == 0:
            rec["status"] = "fell_back"
            rec["reason"] = "no braze graph compiled" + (
                " (Dynamo graph break)" if rec["graph_breaks"] else " (braze received no graph)")
        else:
            rec["status"] = "compiled"
        rec["counters"] = d
    rec["seconds"] = round(time.time() - t0, 3)
    torch._dynamo.reset()
    return rec


def worker_main(conn, max_tasks):
    """A worker: receives (name, dtype, nsamples) tasks, sends ('progress', text) messages and
    one ('done', record) per task; exits after max_tasks tasks or on None."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # C++, Dynamo and logging noise; records travel through conn
    os.dup2(devnull, 2)
    setup_worker()
    for _ in range(max_tasks):
        task = conn.recv()
        if task is None:
            break
        name, dtype_name, nsamples = task
        try:
            rec = check_pair(name, dtype_name, nsamples,
                             progress=lambda msg: conn.send(("progress", msg)))
        except Exception as e:  # a defect of this harness, not of braze: report it as such
            rec = {"op": name, "dtype": dtype_name, "status": "crashed",
                   "reason": f"harness error {_first_line(e)}", "sample": "", "fallbacks": [],
                   "graph_breaks": [], "diagnosis": traceback.format_exc()[-1000:]}
        conn.send(("done", rec))
    conn.close()
