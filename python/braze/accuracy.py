"""The accuracy checker: BRAZE_ACCURACY=1, or Options(accuracy=True).

Every call of a compiled partition also runs the partition's FX graph in eager PyTorch twice on
the same inputs: in float64 (floating tensors upcast), the reference, and as traced, whose own
error against the reference sets the bound. An output whose error exceeds

    3 * (eager's error) + tolerance(dtype) * (largest reference magnitude, at least 1)

diverges. The first divergence in a partition is then located: the partition is compiled again
with every FX node's value as an output, and the first node (in the graph's order) whose value
diverges is named with its op, its source line, the worst element (braze's value, the float64
reference, eager's value), and the kernel of that compile that computes it with its generated
code; also the kernel of the partition's own compile that computes it (partition_kernel), or
where no buffer holds the value there, the kernel of the first reader it is fused into
(partition_kernel_via names that reader). The report is a warning, is kept in
braze.accuracy_reports(), is printed under BRAZE_LOG=accuracy, and is counted in
counters()["accuracy_divergences"].

Only floating-point outputs are compared (integer results are exact or order-dependent, as
ties). CUDA graphs are not captured while the checker is on (it runs eager work at each call).

With BRAZE_ACCURACY=minify (or Options(accuracy="minify")), the checker also writes a
standalone reproducer for the diverging node: a braze text graph (graph.txt) and a safetensors
file of its inputs (eager's values there) and its float64 reference (`expected:0`), with the
bound as the file's `atol`, so that `braze-opt graph.txt --run=tensors.safetensors` runs it
(exit status 3: it still diverges). It is shrunk: the node alone first, then with its
producers one level at a time, until a graph diverges; its folder is in the report
("reproducer") under BRAZE_REPRO_DIR (default ./braze_repro).

BRAZE_TEST_PERTURB=<FX node name> is a test hook: braze adds 1/64 to that node's value, a
planted wrong answer for the checker's tests."""
import os
import sys
import threading
import warnings

import torch

_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-5, torch.float16: 2e-3,
              torch.bfloat16: 1.6e-2}
_reports = []
_lock = threading.Lock()


def enabled(opts):
    return bool(getattr(opts, "accuracy", False)) or \
        os.environ.get("BRAZE_ACCURACY", "") not in ("", "0")


def _minifying(opts):
    return getattr(opts, "accuracy", False) == "minify" or \
        os.environ.get("BRAZE_ACCURACY") == "minify"


def perturbed_node():
    """The FX node name BRAZE_TEST_PERTURB plants a wrong value in, or None."""
    return os.environ.get("BRAZE_TEST_PERTURB") or None


def perturb(t, node, handle):
    """The braze value of FX `node` (handle), shifted by 1/64 when BRAZE_TEST_PERTURB names it."""
    if node.name != perturbed_node() or not isinstance(handle, int):
        return handle
    if t.g.dtype(handle) not in ("f16", "bf16", "f32", "f64"):
        return handle
    shift = t.g.full(1.0 / 64, t.g.dtype(handle), [])
    return t.g.elementwise(_add_kind(), [handle, shift])


def _add_kind():
    from braze import _C
    return _C.op_kind("add")


def reports():
    """The divergences found so far in this process (dicts; see the module docstring)."""
    with _lock:
        return list(_reports)


def _upcast(x):
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.detach().to(torch.float64)
    return x


class _Recorder(torch.fx.Interpreter):
    """Runs a graph module, keeping every node's value; with `upcast`, floating tensors (the
    inputs and the module's constants) are float64."""

    def __init__(self, gm, upcast):
        super().__init__(gm)
        self.upcast = upcast
        self.values = {}

    def run_node(self, n):
        out = super().run_node(n)
        if self.upcast and n.op in ("placeholder", "get_attr"):
            out = _upcast(out)
        self.values[n] = out
        return out


def _bound(ref, eager, dtype):
    scale = max(1.0, float(ref.abs().max())) if ref.numel() else 1.0
    eager_err = float((eager.double() - ref).abs().max()) if ref.numel() else 0.0
    return 3 * eager_err + _TOLERANCE.get(dtype, 1e-5) * scale, eager_err


def _diverges(got, ref, eager):
    """(error, bound, eager's error) when `got` diverges from `ref`, else None."""
    if not (isinstance(got, torch.Tensor) and isinstance(ref, torch.Tensor)
            and isinstance(eager, torch.Tensor) and got.is_floating_point()
            and ref.is_floating_point() and got.shape == ref.shape):
        return None
    diff = (got.detach().double().cpu() - ref.detach().cpu()).abs()
    finite_ref = torch.isfinite(ref.cpu())
    # Matching infinities and nans are not errors; a value that should be finite and is not is.
    same_nonfinite = (~finite_ref) & ((got.detach().double().cpu() == ref.cpu())
                                      | (got.detach().isnan().cpu() & ref.isnan().cpu()))
    diff = torch.where(same_nonfinite, torch.zeros_like(diff), diff)
    diff = torch.nan_to_num(diff, nan=float("inf"))
    err = float(diff.max()) if diff.numel() else 0.0
    ref_f = torch.where(finite_ref, ref.cpu(), torch.zeros_like(ref.cpu()))
    eager_f = torch.where(finite_ref, eager.detach().cpu().double(), torch.zeros_like(ref_f))
    bound, eager_err = _bound(ref_f, eager_f, got.dtype)
    return (err, bound, eager_err, diff) if err > bound else None


class Checker:
    """Checks each call of one compiled partition (see the module docstring)."""

    def __init__(self, gm, compile_all_nodes, schedule=None, minify=None):
        self.gm = gm
        # args -> (run(args) -> values, nodes, source, schedule): see _compile_all_nodes
        self.compile_all_nodes = compile_all_nodes
        # the partition's own printed schedule and value_names, or None
        self.schedule, self.names = schedule if schedule is not None else ("", {})
        self.minify = minify  # (args, node name) -> the reproducer's folder, or None
        self.reported = False

    def check(self, args, outs):
        if self.reported:
            return
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return
        try:
            ref = _Recorder(self.gm, True).run(*args)
            eager = self.gm.forward(*args)
        except Exception:  # a graph eager cannot run in float64 (a dtype-specific kernel)
            return
        ref = ref if isinstance(ref, (tuple, list)) else [ref]
        eager = eager if isinstance(eager, (tuple, list)) else [eager]
        bad = [(i, found) for i, (o, r, e) in enumerate(zip(outs, ref, eager))
               if (found := _diverges(o, r, e)) is not None]
        if not bad:
            return
        self.reported = True
        output, (err, bound, eager_err, _) = bad[0]
        report = {"output": output, "error": err, "bound": bound, "eager_error": eager_err}
        report.update(self._locate(args))
        if self.minify is not None and report.get("node"):
            try:
                report["reproducer"] = self.minify(args, report["node"])
            except Exception as e:
                report["reproducer"] = None
                report["reproducer_error"] = f"{type(e).__name__}: {e}"
        _record(report)

    def _locate(self, args):
        """The first FX node whose value diverges when every node is stored."""
        try:
            run, nodes, source, schedule = self.compile_all_nodes(args)
            values = run(args)
        except Exception as e:
            return {"node": None, "why": f"the checking compile failed: {type(e).__name__}: {e}"}
        ref = _Recorder(self.gm, True)
        ref.run(*args)
        eager = _Recorder(self.gm, False)
        eager.run(*args)
        for k, (node, got) in enumerate(zip(nodes, values)):
            found = _diverges(got, ref.values.get(node), eager.values.get(node))
            if found is None:
                continue
            err, bound, eager_err, diff = found
            at = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
            kernel = _kernel_of(schedule, f"out{k}")
            from braze.package import _where
            from braze.report import kernel_code
            return {
                "node": node.name, "op": str(node.target), "source": _where(node),
                "node_error": err, "node_bound": bound, "node_eager_error": eager_err,
                "element": at, "braze": float(got[at]), "float64": float(ref.values[node][at]),
                "eager": float(eager.values[node][at]),
                "kernel": kernel, "code": kernel_code(source, kernel) if kernel else "",
                # In the partition's own compile: the kernel that computes the node's value,
                # and the reader it is fused into where no buffer of its own holds it.
                **_partition_kernel(self.schedule, self.names, node),
            }
        return {"node": None, "why": "no single node diverges when every node is stored: the "
                                     "divergence comes from how the partition's nodes fuse"}


def value_names(t, outputs):
    """{FX node name: the names its braze value may have in the partition's schedule}: the
    value's own name (decomposition names its parts after it, with suffixes) and, for the k-th
    of `outputs` (handles), `outk`."""
    names = {}
    for node, handle in t.values.items():
        if isinstance(handle, int) and hasattr(node, "name"):
            names[node.name] = [t.g.node_name(handle)] + \
                [f"out{k}" for k, h in enumerate(outputs) if h == handle]
    return names


def _owner(buffer, names):
    """The FX node whose value a schedule buffer holds: the one with the longest value name that
    is the buffer's name, or its stem before `_<digits>` suffixes (names derived from it)."""
    best, length = None, -1
    for node, candidates in names.items():
        for c in candidates:
            derived = buffer.startswith(c + "_") and \
                all(p.isdigit() for p in buffer[len(c) + 1:].split("_"))
            if (buffer == c or derived) and len(c) > length:
                best, length = node, len(c)
    return best


def _partition_kernel(schedule, names, node):
    """{"partition_kernel": the kernel of the partition's own schedule that computes FX `node`
    (the last that writes a buffer of its value), or where no buffer holds it (the value is
    computed inside each reader) the kernel of its first reader that has one, named in
    "partition_kernel_via"; None when neither is found}."""
    from braze.report import schedule_kernels
    last = {}  # FX node name -> the last kernel that writes a buffer of its value
    for k, written in schedule_kernels(schedule):
        for b in written:
            last[_owner(b, names)] = k

    def kernel(n):
        return last.get(n.name)
    own = kernel(node)
    if own is not None:
        return {"partition_kernel": own, "partition_kernel_via": None}
    seen, frontier = {node}, list(node.users)
    while frontier:
        reader = frontier.pop(0)
        if reader in seen or reader.op != "call_function":
            continue
        seen.add(reader)
        k = kernel(reader)
        if k is not None:
            return {"partition_kernel": k, "partition_kernel_via": reader.name}
        frontier.extend(reader.users)
    return {"partition_kernel": None, "partition_kernel_via": None}


def schedule_of(t, outputs, opts, device):
    """When the checker is on, the printed schedule of translator `t`'s braze graph, whose
    outputs are the handles `outputs` (call before compile consumes it), with its value_names:
    which of the partition's own kernels computes each value. Else None."""
    if not enabled(opts):
        return None
    try:
        return t.g.print_stage("schedule", device is not None), value_names(t, outputs)
    except Exception:
        return None


def checker(gm, opts, device, schedule=None):
    """A Checker for partition `gm` compiled for `device` (None: the CPU); `schedule` is the
    partition's own printed schedule (schedule_of) with its value_names, or None."""
    minify = None
    if _minifying(opts) and device is None:
        minify = lambda args, name: _write_reproducer(gm, args, name, opts)  # noqa: E731
    return Checker(gm, lambda args: _compile_all_nodes(gm, opts, device, args), schedule, minify)


def _subgraph(gm, node, depth):
    """A graph module of `node` and its producers up to `depth` levels (call_function nodes),
    whose inputs are the values they read from outside; with the list of those outside nodes."""
    from braze import sizes
    members, frontier = {node}, [node]
    for _ in range(depth):
        nxt = []
        for n in frontier:
            for a in n.all_input_nodes:
                if a.op == "call_function" and not sizes.is_size(a) and a not in members:
                    members.add(a)
                    nxt.append(a)
        frontier = nxt
    ordered = [n for n in gm.graph.nodes if n in members]
    outside = []
    for n in ordered:
        for a in n.all_input_nodes:
            if a not in members and a not in outside:
                outside.append(a)
    g = torch.fx.Graph()
    env = {}
    for a in outside:
        env[a] = g.placeholder(a.name)
        env[a].meta = dict(a.meta)
    for n in ordered:
        env[n] = g.node_copy(n, lambda a: env[a])
    g.output(env[node])
    return torch.fx.GraphModule(gm, g), outside, len(ordered) == len(
        [n for n in gm.graph.nodes if n.op == "call_function" and not sizes.is_size(n)])


def _write_reproducer(gm, args, name, opts):
    """The smallest subgraph around node `name` that still diverges, written as a braze text
    graph and its tensors (see the module docstring): the folder."""
    from braze import cpu as cpu_support
    from braze.fx_import import Translator
    node = next(n for n in gm.graph.nodes if n.name == name)
    eager = _Recorder(gm, False)
    eager.run(*args)
    for depth in range(0, 64):
        sub, outside, whole = _subgraph(gm, node, depth)
        inputs = [eager.values[a] for a in outside]
        if not all(isinstance(x, torch.Tensor) for x in inputs):
            break  # a size or a non-tensor operand: the repro needs the larger graph
        t = Translator()
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        for p, x in zip(placeholders, inputs):
            t.input(p, x)
        for n in sub.graph.nodes:
            if n.op == "call_function":
                t.translate(n)
        out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
        t.g.output([t.values[out]], [[]])
        text = t.g.print()
        compiled = cpu_support.compile_graph(t.g, opts)
        got = compiled.run([x.contiguous() for x in inputs])[0]
        ref = sub(*[_upcast(x) for x in inputs])
        want_eager = sub(*inputs)
        found = _diverges(torch.as_tensor(got), ref, want_eager)
        if found is None and not whole:
            continue
        folder = os.path.join(os.environ.get("BRAZE_REPRO_DIR", "braze_repro"),
                              f"{name}-{os.getpid()}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "graph.txt"), "w") as f:
            f.write(f"# braze accuracy reproducer: node {name} ({node.target}); run with\n"
                    f"#   braze-opt graph.txt --run=tensors.safetensors\n{text}")
        bound = found[1] if found is not None else 0.0
        from braze.package import _write_safetensors
        tensors = [(p.name, x.contiguous()) for p, x in zip(placeholders, inputs)]
        tensors.append(("expected:0", ref.contiguous()))
        _write_safetensors(os.path.join(folder, "tensors.safetensors"), tensors,
                           {"atol": repr(bound), "rtol": "0", "node": name})
        return folder
    return None


def _compile_all_nodes(gm, opts, device, args):
    """gm compiled with every FX node's tensor value as an output: (run(args) -> values, the
    nodes, the generated source, the printed schedule)."""
    from braze import cpu as cpu_support
    from braze import cuda as cuda_support
    from braze import sizes
    from braze.fx_import import Translator
    from braze.registry import Unsupported
    from braze.support import fetch_attr
    t = Translator()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    positions = []
    for i, node in enumerate(placeholders):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            t.input(node, val)
            positions.append(i)
        elif not isinstance(val, (torch.SymInt, int)):
            raise Unsupported(f"placeholder {node.name}")
    if sizes.carried(placeholders):
        raise Unsupported("a size passed as an argument")
    constants = []
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            constants.append(fetch_attr(gm, node.target))
            t.input(node, constants[-1])
    nodes = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and not sizes.is_size(node):
            t.translate(node)
            val = node.meta.get("val")
            if (isinstance(t.values.get(node), int) and isinstance(val, torch.Tensor)
                    and not val.is_complex()):
                nodes.append(node)
    if t.seed is not None:
        raise Unsupported("random ops")
    t.g.output([t.values[n] for n in nodes], [[] for _ in nodes])
    schedule = t.g.print_stage("schedule", device is not None)
    specs = [(tuple(v.shape), tuple(v.stride())) for v in
             [args[i] for i in positions] + constants]
    dtypes = [n.meta["val"].dtype for n in nodes]
    if device is None:
        compiled = cpu_support.compile_graph(t.g, opts)
        graph = cpu_support.CpuGraph(compiled, specs, dtypes)
    else:
        compiled = cuda_support.compile_graph(t.g, opts, device)
        graph = cuda_support.CudaGraph(compiled, device, specs, dtypes, True)

    def run(call_args):
        return graph([call_args[i] for i in positions] + constants)
    return run, nodes, compiled.source, schedule


def _kernel_of(schedule, buffer):
    """The kernel of a printed schedule that writes `%buffer[`, or None."""
    from braze.report import schedule_kernels
    return next((k for k, stored in schedule_kernels(schedule) if buffer in stored), None)


def _own_kernel_text(report):
    k, via = report.get("partition_kernel"), report.get("partition_kernel_via")
    if k is None:
        return "not found in its schedule"
    return f"{k}, fused into its reader {via} there" if via else k


def _record(report):
    from braze import backend
    with _lock:
        _reports.append(report)
    with backend._state.lock:
        backend._state.counts["accuracy_divergences"] += 1
    if report.get("node"):
        text = (f"braze accuracy: output {report['output']} diverges (error "
                f"{report['error']:.3g}, bound {report['bound']:.3g}); first diverging node "
                f"{report['node']} ({report['op']}) at {report['source']}: element "
                f"{report['element']} is {report['braze']!r}, float64 {report['float64']!r}, "
                f"eager {report['eager']!r}; computed by {report['kernel']} of the checking "
                f"compile (in the partition's own: {_own_kernel_text(report)})")
    else:
        text = (f"braze accuracy: output {report['output']} diverges (error "
                f"{report['error']:.3g}, bound {report['bound']:.3g}); {report.get('why')}")
    warnings.warn(text)
    from braze import _C
    if _C.log_accuracy_from_environment():
        print(f"===== braze: accuracy =====\n{text}\n{report.get('code', '')}", file=sys.stderr)
