"""The compile report: BRAZE_REPORT=<dir>, or Options(report=<dir>).

One self-contained HTML page per process (<dir>/braze-report-<pid>.html; no script, nothing
fetched from the network), written at exit and by braze.write_report(). For each FX graph braze
received: its code and the source line of each node; the ops left to eager, with the reasons;
each partition braze compiled, with its calling convention (signature.GraphSignature: how
each output is made), its graph after each pipeline stage (graph, decomposed, loops,
schedule), a picture of its fusion (one box per kernel, naming the values it stores), the
generated code per kernel, and whether the cache had it; the graph's compile split;
recompiles, with the guard that failed; and what the CUDA-graph layer decided. A summary links
to every section."""
import atexit
import contextvars
import html
import os
import re
import threading
import time

import torch

_lock = threading.Lock()
_graphs = []  # one dict per FX graph, in the order braze received them
_current = contextvars.ContextVar("braze_report_graph", default=None)
_process_notes = []  # notes made outside any graph's compile
_registered = False
_STAGES = ("graph", "decomposed", "loops", "schedule")


def directory(opts=None):
    """The report's folder, or None when no report is asked for."""
    return getattr(opts, "report", None) or os.environ.get("BRAZE_REPORT") or None


def graph_started(number, gm, forward, opts):
    """Begins the record of FX graph `number` (in this context: its partitions' compiles
    attach to it)."""
    folder = directory(opts)
    if folder is None:
        return None
    record = {"number": number, "kind": "forward" if forward else "backward",
              "code": gm.code, "nodes": _node_lines(gm), "partitions": [],
              "notes": [("recompile", r) for r in _new_guard_failures()],
              "times": {}, "folder": folder, "started": time.time()}
    with _lock:
        _graphs.append(record)
        _register(folder)
    return _current.set(record)


_failures_seen = {}  # code object -> guard failures of it already reported


def _new_guard_failures():
    """Dynamo's reasons for recompiling (the guard that failed, per frame) recorded since the
    last graph: a graph compiled after a guard failed is that recompile."""
    try:
        from torch._dynamo.utils import guard_failures
    except ImportError:  # a PyTorch without the record
        return []
    out = []
    with _lock:
        for code, reasons in list(guard_failures.items()):
            seen = _failures_seen.get(code, 0)
            name = getattr(code, "co_name", str(code))
            out += [f"Dynamo recompiled {name}: guard failed: {r}" for r in reasons[seen:]]
            _failures_seen[code] = len(reasons)
    return out


def graph_finished(token, times):
    if token is None:
        return
    record = _current.get()
    if record is not None:
        record["times"] = dict(times)
    _current.reset(token)


def stages(graph, cuda):
    """The braze graph `graph` printed after each pipeline stage (from copies), when a report
    is being written for the graph being compiled: call before compile consumes it."""
    if _current.get() is None:
        return None
    out = {}
    for stage in _STAGES:
        try:
            out[stage] = graph.print_stage(stage, cuda)
        except Exception as e:  # a stage that fails to print is shown as such
            out[stage] = f"(cannot print: {type(e).__name__}: {e})"
    return out


def partition(staged, compiled, signature=None):
    """Records a partition: its stages (from stages()), its calling convention (a
    GraphSignature: how each output is made) and what compiling it produced. Its
    generated source also goes to PyTorch's structured trace (TORCH_TRACE, read by tlparse)
    as an artifact named braze_output_code, report or not."""
    try:
        from torch._logging import trace_structured
        trace_structured("artifact", metadata_fn=lambda: {"name": "braze_output_code",
                                                          "encoding": "string"},
                         payload_fn=lambda: compiled.source)
    except Exception:  # an older torch without it, or a trace that cannot be written
        pass
    record = _current.get()
    if record is None or staged is None:
        return
    entry = {"stages": staged, "source": compiled.source, "cache_hit": compiled.cache_hit,
             "kernels": compiled.num_kernels,
             "signature": str(signature) if signature is not None else None}
    with _lock:
        record["partitions"].append(entry)


def note(kind, text):
    """A fallback, recompile or CUDA-graph decision, filed under the graph being compiled."""
    record = _current.get()
    if record is None and directory() is None:
        return  # no report is being written: nothing is kept
    with _lock:
        (record["notes"] if record is not None else _process_notes).append((kind, text))


def _node_lines(gm):
    out = []
    for node in gm.graph.nodes:
        trace = node.meta.get("stack_trace")
        if node.op == "call_function" and trace:
            from braze.package import _where
            out.append((node.name, str(node.target), _where(node)))
    return out


def _register(folder):
    global _registered
    if not _registered:
        _registered = True
        atexit.register(lambda: write(os.path.join(folder, f"braze-report-{os.getpid()}.html")))


# ---- the page ------------------------------------------------------------------------------

_CSS = """body{font-family:sans-serif;margin:1.5em;max-width:110em}pre{background:#f6f6f6;
padding:.6em;overflow:auto;font-size:85%}nav li{margin:.1em 0}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left}h2{border-top:2px solid #333;
padding-top:.5em}.fallback{color:#a00}details{margin:.3em 0}summary{cursor:pointer}"""


def _esc(x):
    return html.escape(str(x))


def schedule_kernels(schedule):
    """(kernel name, [values it stores]) of a printed schedule, in launch order."""
    out = []
    for line in schedule.splitlines():
        m = re.match(r"(kernel\d+)\b", line)
        if m:
            out.append((m.group(1), []))
        elif out:
            w = re.search(r"%([\w.]+)\[[^\]]*\] = ", line)
            if w and w.group(1) not in out[-1][1]:
                out[-1][1].append(w.group(1))
    return out


def _fusion_svg(kernels):
    """One box per kernel, in launch order, naming the values it writes."""
    width, gap, line = 190, 20, 15
    height = 40 + line * max([len(v) for _, v in kernels] + [1])
    total = max(1, len(kernels)) * (width + gap)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{total}" height="{height + 10}" '
             f'role="img" aria-label="fusion">']
    for i, (name, values) in enumerate(kernels):
        x = i * (width + gap)
        parts.append(f'<rect x="{x}" y="5" width="{width}" height="{height}" rx="6" '
                     f'fill="#e8f0fe" stroke="#3367d6"/>')
        parts.append(f'<text x="{x + 8}" y="24" font-weight="bold">{_esc(name)}</text>')
        for j, v in enumerate(values):
            parts.append(f'<text x="{x + 8}" y="{42 + j * line}" font-size="12">%{_esc(v)}</text>')
        if i:
            parts.append(f'<line x1="{x - gap}" y1="{height // 2}" x2="{x}" y2="{height // 2}" '
                         f'stroke="#333" marker-end="none"/>')
    parts.append("</svg>")
    return "".join(parts)


def kernel_code(source, name):
    """The function of kernel `name` in a generated source (CPU or CUDA), or ""."""
    m = re.search(rf"^(static void|extern \"C\" __global__ void[^\n]*?) ?{name}\(.*?^}}\n",
                  source, re.S | re.M)
    return m.group(0) if m else ""


def render():
    """The report page as text."""
    from braze import backend
    with _lock:
        graphs = list(_graphs)
        process_notes = list(_process_notes)
    counters = backend.counters()
    times = backend.compile_times()
    out = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>braze compile report"
           f"</title><style>{_CSS}</style></head><body>",
           f"<h1>braze compile report</h1><p>process {os.getpid()}, torch {_esc(torch.__version__)}"
           f", {len(graphs)} FX graphs</p>", "<nav><h2 id='contents'>Contents</h2><ul>"]
    for g in graphs:
        n = g["number"]
        out.append(f"<li><a href='#graph-{n}'>graph {n} ({g['kind']})</a>: "
                   f"<a href='#graph-{n}-fx'>FX graph</a>, <a href='#graph-{n}-eager'>ops in "
                   f"eager</a>, <a href='#graph-{n}-partitions'>partitions</a> "
                   f"({len(g['partitions'])}), <a href='#graph-{n}-times'>compile split</a>, "
                   f"<a href='#graph-{n}-notes'>recompiles and CUDA graphs</a></li>")
    out.append("<li><a href='#summary'>counters and compile times</a></li></ul></nav>")
    for g in graphs:
        n = g["number"]
        out.append(f"<h2 id='graph-{n}'>Graph {n} ({g['kind']})</h2>")
        out.append(f"<h3 id='graph-{n}-fx'>FX graph</h3><pre>{_esc(g['code'])}</pre>")
        if g["nodes"]:
            out.append("<details><summary>source lines</summary><table><tr><th>node</th>"
                       "<th>op</th><th>source</th></tr>")
            for name, op, where in g["nodes"]:
                out.append(f"<tr><td>{_esc(name)}</td><td>{_esc(op)}</td><td>{_esc(where)}"
                           "</td></tr>")
            out.append("</table></details>")
        fallbacks = [t for k, t in g["notes"] if k == "fallback"]
        out.append(f"<h3 id='graph-{n}-eager'>Ops left to eager</h3>")
        out.append("<ul>" + "".join(f"<li class='fallback'>{_esc(t)}</li>" for t in fallbacks)
                   + "</ul>" if fallbacks else "<p>none: braze compiled every op.</p>")
        out.append(f"<h3 id='graph-{n}-partitions'>Partitions</h3>")
        for p, part in enumerate(g["partitions"]):
            anchor = f"graph-{n}-p{p}"
            kernels = schedule_kernels(part["stages"].get("schedule", ""))
            out.append(f"<h4 id='{anchor}'>partition {p}: {part['kernels']} kernels, cache "
                       f"{'hit' if part['cache_hit'] else 'miss'}</h4>")
            out.append(f"<div id='{anchor}-fusion'>{_fusion_svg(kernels)}</div>")
            if part.get("signature"):
                out.append(f"<details id='{anchor}-signature'><summary>its calling convention: "
                           f"how each output is made</summary><pre>{_esc(part['signature'])}"
                           "</pre></details>")
            for stage in _STAGES:
                out.append(f"<details id='{anchor}-{stage}'><summary>after the {stage} stage"
                           f"</summary><pre>{_esc(part['stages'].get(stage, ''))}</pre></details>")
            for name, values in kernels:
                code = kernel_code(part["source"], name)
                out.append(f"<details id='{anchor}-{name}'><summary>{name}: "
                           f"{_esc(', '.join('%' + v for v in values))}</summary>"
                           f"<pre>{_esc(code or '(deferred or a library call)')}</pre></details>")
            out.append(f"<details id='{anchor}-source'><summary>the whole generated source"
                       f"</summary><pre>{_esc(part['source'])}</pre></details>")
        if not g["partitions"]:
            out.append("<p>no partition (the graph ran in eager, or nothing to compute).</p>")
        out.append(f"<h3 id='graph-{n}-times'>Compile split</h3><table>")
        for k, v in sorted(g["times"].items()):
            out.append(f"<tr><td>{_esc(k)}</td><td>{v:.4f} s</td></tr>")
        out.append("</table>")
        other = [(k, t) for k, t in g["notes"] if k != "fallback"]
        out.append(f"<h3 id='graph-{n}-notes'>Recompiles and CUDA graphs</h3>")
        out.append("<ul>" + "".join(f"<li>{_esc(k)}: {_esc(t)}</li>" for k, t in other)
                   + "</ul>" if other else "<p>none.</p>")
    out.append("<h2 id='summary'>Counters and compile times</h2><table>")
    for k, v in counters.items():
        out.append(f"<tr><td>{_esc(k)}</td><td>{_esc(v)}</td></tr>")
    out.append("</table><table>")
    for k, v in sorted(times.items()):
        out.append(f"<tr><td>{_esc(k)}</td><td>{v:.4f} s</td></tr>")
    out.append("</table>")
    if process_notes:
        out.append("<h3>Other notes</h3><ul>" + "".join(
            f"<li>{_esc(k)}: {_esc(t)}</li>" for k, t in process_notes) + "</ul>")
    out.append("</body></html>\n")
    return "\n".join(out)


def write(path=None):
    """Writes the report (to `path`, or to the report folder's page for this process); returns
    the path, or None when there is nothing to write there."""
    if path is None:
        folder = directory()
        if folder is None:
            return None
        path = os.path.join(folder, f"braze-report-{os.getpid()}.html")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(render())
    os.replace(tmp, path)
    return path
