"""Conformance sweep over PyTorch's OpInfo database (`make conformance`).

For each OpInfo of torch.testing._internal.common_methods_invocations.op_db and each dtype it
supports on CPU (of float64, float32, float16, bfloat16, int8, int16, int32, int64, uint8, bool),
up to N sample inputs run through torch.compile(op, backend="braze", dynamic=False) and are
compared with eager. Every (op, dtype) pair is classified:

  crashed    the compiled call raised where eager did not (or the worker died / timed out)
  wrong      a compiled result differs from eager beyond the dtype's tolerance
  fell back  braze's fallback counters moved, or no braze graph was compiled
  compiled   otherwise

(precedence in that order). Pairs whose samples eager cannot run are counted apart. The output is
a table per dtype, the list of wrong and crashed pairs with their reasons (and whether the fault
reproduces with braze's decompositions and eager kernels), and the commonest fallback reasons.

    python tests/conformance/op_db_sweep.py                 # the whole op_db (long)
    python tests/conformance/op_db_sweep.py --subset        # the fixed quick subset
    python tests/conformance/op_db_sweep.py --ops add,sum --dtypes float32 --samples 5
    python tests/conformance/op_db_sweep.py --json build/conformance.json --no-fail
    python tests/conformance/op_db_sweep.py --replay build/conformance-repro/cross-bfloat16.pt

Exit status 1 when any pair is wrong or crashed (0 with --no-fail).
"""
import argparse
import collections
import json
import multiprocessing
import multiprocessing.connection
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

DTYPES = ("float64", "float32", "float16", "bfloat16", "int8", "int16", "int32", "int64",
          "uint8", "bool")
STATUSES = ("compiled", "views", "fell_back", "wrong", "crashed")

# A fixed quick subset: the foundation ops, topk (indices among ties unspecified), and representatives
# of each family added since.
SUBSET = (
    "abs", "neg", "exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "sin",
    "add", "sub", "mul", "div.no_rounding_mode", "maximum", "pow",
    "eq", "lt", "where", "clamp", "nn.functional.relu",
    "sum", "mean", "amax", "var",
    "softmax", "log_softmax", "nn.functional.layer_norm", "nn.functional.gelu", "nn.functional.silu",
    "reshape", "permute", "expand", "squeeze", "unsqueeze", "transpose", "__getitem__", "narrow",
    "gather",
    "sort", "topk", "mm",
    # one or two of each later family: Fourier transforms (complex pairs), order statistics,
    # scatter and multi-index gather, special functions, transposed convolution and sampling,
    # and the pointwise/creation tail
    "fft.rfft", "fft.ifft2", "argsort", "median",
    "scatter_add", "index_put", "scatter_reduce.sum",
    "digamma", "special.i0e", "special.chebyshev_polynomial_t",
    "nn.functional.conv_transpose2d", "nn.functional.grid_sample",
    "fmax", "bucketize", "new_empty",
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", help="comma-separated OpInfo names; a name matches its variants too")
    p.add_argument("--subset", action="store_true",
                   help="the fixed quick subset (%d OpInfos, exact variant names)" % len(SUBSET))
    p.add_argument("--dtypes", help="comma-separated dtypes (default: all ten)")
    p.add_argument("--samples", type=int, default=3, help="sample inputs per pair (default 3)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--tasks-per-worker", type=int, default=50,
                   help="pairs a worker runs before it is replaced (default 50)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per pair (default 60)")
    p.add_argument("--cache-dir", default=os.path.join(ROOT, "build", "conformance-cache"),
                   help="BRAZE_CACHE_DIR for the workers (default build/conformance-cache)")
    p.add_argument("--json", metavar="PATH", help="write every pair's record and the summary")
    p.add_argument("--repro-dir", default=os.path.join(ROOT, "build", "conformance-repro"),
                   help="where each wrong or crashed pair's sample is saved with torch.save "
                        "(default build/conformance-repro)")
    p.add_argument("--no-fail", action="store_true", help="exit 0 even with wrong or crashed pairs")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--replay", metavar="PT", nargs="+",
                   help="rerun saved failing samples (files of --repro-dir) in this process")
    return p.parse_args(argv)


def select_pairs(args):
    import torch
    from torch.testing._internal.common_methods_invocations import op_db
    from pair_runner import variant_name

    wanted = None  # names that match an OpInfo's variant name or its base name
    exact = set(SUBSET) if args.subset else set()  # names that match a variant name only
    if args.ops:
        wanted = {s.strip() for s in args.ops.split(",") if s.strip()}
    dtypes = DTYPES if not args.dtypes else tuple(d.strip() for d in args.dtypes.split(","))
    for d in dtypes:
        if d not in DTYPES:
            sys.exit(f"op_db_sweep: unknown dtype {d!r}; expected one of {', '.join(DTYPES)}")
    pairs, seen = [], set()
    for op in op_db:
        name = variant_name(op)
        if (wanted is not None or exact) and name not in exact and not (
                wanted and (name in wanted or op.name in wanted)):
            continue
        seen.update((name, op.name))
        supported = op.supported_dtypes("cpu")
        pairs += [(name, d) for d in dtypes if getattr(torch, d) in supported]
    missing = ((wanted or set()) | exact) - seen
    if missing:
        sys.exit(f"op_db_sweep: no OpInfo named {', '.join(sorted(missing))}")
    return pairs


class Pool:
    """Worker processes, each replaced after `tasks_per_worker` pairs, when a pair outlives the
    timeout (killed) or when it dies (a crash in a kernel): the pair is then 'crashed'."""

    def __init__(self, ctx, nworkers, tasks_per_worker, timeout):
        self.ctx, self.n, self.per, self.timeout = ctx, nworkers, tasks_per_worker, timeout
        self.slots = [None] * nworkers  # dict(proc, conn, done, task, start, progress)

    def _start(self, i):
        from pair_runner import worker_main
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=worker_main, args=(child, self.per), daemon=True)
        proc.start()
        child.close()
        self.slots[i] = {"proc": proc, "conn": parent, "done": 0, "task": None, "start": 0.0,
                         "progress": ""}

    def _retire(self, i, kill=False):
        s = self.slots[i]
        if kill:
            s["proc"].kill()
        s["proc"].join(timeout=10)
        s["conn"].close()
        self.slots[i] = None

    def _failed(self, s, reason):
        name, dtype, _ = s["task"]
        phase, _, sample = s["progress"].partition(": ")
        if phase:
            reason += f" during the {phase}"
        return {"op": name, "dtype": dtype, "status": "crashed", "reason": reason,
                "sample": sample, "fallbacks": [], "graph_breaks": [],
                "diagnosis": "", "seconds": round(time.time() - s["start"], 3)}

    def run(self, tasks, on_result):
        queue = collections.deque(tasks)
        while queue or any(s and s["task"] for s in self.slots):
            for i in range(self.n):
                s = self.slots[i]
                if s is not None and s["task"] is None and s["done"] >= self.per:
                    self._retire(i)
                    s = None
                if queue and s is None:
                    self._start(i)
                    s = self.slots[i]
                if queue and s["task"] is None:
                    task = queue.popleft()
                    try:
                        s["conn"].send(task)
                    except (BrokenPipeError, OSError):  # died between tasks: a fresh one next pass
                        queue.appendleft(task)
                        self._retire(i, kill=True)
                        continue
                    s["task"], s["start"], s["progress"] = task, time.time(), ""
            busy = [s for s in self.slots if s and s["task"]]
            now = time.time()
            wait = min(s["start"] + self.timeout for s in busy) - now
            ready = multiprocessing.connection.wait([s["conn"] for s in busy], max(0.0, wait))
            for i, s in enumerate(self.slots):
                if not s or not s["task"]:
                    continue
                if s["conn"] in ready:
                    try:
                        kind, payload = s["conn"].recv()
                    except (EOFError, OSError):
                        s["proc"].join(5)
                        code = s["proc"].exitcode
                        on_result(self._failed(s, f"worker died (exit code {code})"))
                        self._retire(i, kill=True)
                        continue
                    if kind == "progress":
                        s["progress"] = payload
                        continue
                    on_result(payload)
                    s["task"] = None
                    s["done"] += 1
                elif time.time() - s["start"] > self.timeout:
                    on_result(self._failed(s, f"timeout (> {self.timeout:g} s)"))
                    self._retire(i, kill=True)
        for i in range(self.n):
            s = self.slots[i]
            if s is None:
                continue
            if s["done"] < self.per:  # a worker that ran its quota has exited on its own
                try:
                    s["conn"].send(None)
                except (BrokenPipeError, OSError):
                    pass  # it exited already; join below collects it
            self._retire(i)


def summarize(records, dtypes):
    rows = []
    for d in list(dtypes) + ["total"]:
        rs = [r for r in records if d == "total" or r["dtype"] == d]
        c = collections.Counter(r["status"] for r in rs)
        runnable = sum(c[s] for s in STATUSES)
        rows.append({"dtype": d, **{s: c[s] for s in STATUSES}, "total": runnable,
                     "eager_fails": c["eager_fails"],
                     "pct_compiled": round(100.0 * c["compiled"] / runnable, 1) if runnable else None})
    return rows


def fallback_reasons(records):
    """(target, pairs, example reason) for the commonest fallback reasons among fell-back pairs."""
    import re
    from pair_runner import FALLBACK_LINE
    count, example = collections.Counter(), {}
    for r in records:
        if r["status"] != "fell_back":
            continue
        targets = {}
        for line in r.get("fallbacks", []):
            m = FALLBACK_LINE.match(line)
            if m and m["reason"].startswith("result of unsupported"):
                continue  # a getitem of an unsupported multi-output op: counted with that op
            if m:
                targets.setdefault(m["target"], m["reason"])
            else:  # a whole-graph fallback; strip object addresses so equal reasons aggregate
                targets.setdefault("<whole graph> " + re.sub(r"0x[0-9a-f]+", "0x..", line)[:160], "")
        if not targets:
            for gb in r.get("graph_breaks", [])[:1]:
                targets["<Dynamo graph break> " + gb.splitlines()[0][:120]] = ""
        if not targets:
            targets[r.get("reason") or "no fallback logged"] = ""
        for t, why in targets.items():
            count[t] += 1
            example.setdefault(t, (why, f"{r['op']}/{r['dtype']}"))
    return [(t, n, *example[t]) for t, n in count.most_common(40)]


def print_report(records, dtypes, elapsed, out=sys.stdout):
    w = out.write
    rows = summarize(records, dtypes)
    w("\n| dtype | compiled | views only | fell back | wrong | crashed | total | % compiled "
      "| eager fails |\n")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    for r in rows:
        pct = "-" if r["pct_compiled"] is None else f"{r['pct_compiled']:.1f}%"
        name = "**total**" if r["dtype"] == "total" else r["dtype"]
        w(f"| {name} | {r['compiled']} | {r['views']} | {r['fell_back']} | {r['wrong']} "
          f"| {r['crashed']} "
          f"| {r['total']} | {pct} | {r['eager_fails']} |\n")
    t = rows[-1]
    w(f"\nTotals: {t['total']} eager-runnable (op, dtype) pairs: {t['compiled']} compiled "
      f"({t['pct_compiled']}%), {t['views']} views only (nothing to compute), "
      f"{t['fell_back']} fell back, {t['wrong']} wrong, "
      f"{t['crashed']} crashed; {t['eager_fails']} pairs eager cannot run. {elapsed:.0f} s.\n")
    bad = sorted((r for r in records if r["status"] in ("wrong", "crashed")),
                 key=lambda r: (r["status"], r["op"], DTYPES.index(r["dtype"])))
    w(f"\n## Wrong and crashed pairs ({len(bad)})\n\n")
    for r in bad:
        w(f"- **{r['status'].upper()}** `{r['op']}` {r['dtype']}: {r['reason']}\n")
        if r.get("sample"):
            w(f"    - sample: {r['sample']}\n")
        if r.get("diagnosis"):
            w(f"    - diagnosis: {r['diagnosis'].splitlines()[0] if r['diagnosis'] else ''}\n")
        if r.get("repro"):
            w(f"    - repro: {os.path.relpath(r['repro'], ROOT) if os.path.isabs(r['repro']) else r['repro']}\n")
    reasons = fallback_reasons(records)
    w(f"\n## Commonest fallback reasons (pairs that fell back, by target; top {len(reasons)})\n\n")
    w("| pairs | target | example reason | example pair |\n|---:|---|---|---|\n")
    for target, n, why, pair in reasons:
        w(f"| {n} | `{target}` | {why.replace('|', '/')[:140]} | {pair} |\n")


def braze_build():
    """Which braze this sweep ran: the repository's HEAD and when the package was installed."""
    import subprocess
    import braze
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head = "?"
    installed = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(os.path.getmtime(braze._C.__file__)))
    return f"HEAD {head}, braze installed {installed}"


def main(argv=None):
    args = parse_args(argv)
    # Workers inherit these (the forkserver starts after them).
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["BRAZE_LOG"] = "fallback"
    os.environ.pop("BRAZE_STRICT", None)
    os.environ["BRAZE_CACHE_DIR"] = os.path.abspath(args.cache_dir)
    os.makedirs(os.environ["BRAZE_CACHE_DIR"], exist_ok=True)
    os.environ["CONFORMANCE_REPRO_DIR"] = os.path.abspath(args.repro_dir)
    sys.path.insert(0, HERE)
    # The forkserver imports pair_runner once (Python 3.11 does not pass it sys.path).
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")]))
    import warnings
    warnings.simplefilter("ignore")
    if args.replay:
        import pair_runner
        pair_runner.setup_worker()
        for path in args.replay:
            print(pair_runner.replay(path))
        return 0
    pairs = select_pairs(args)
    dtypes = [d for d in DTYPES if any(p[1] == d for p in pairs)]
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["pair_runner"])  # torch, op_db and braze imported once
    records, t0, build = [], time.time(), braze_build()

    def on_result(rec):
        records.append(rec)
        n = len(records)
        if not args.quiet and (n % 50 == 0 or n == len(pairs) or rec["status"] in ("wrong", "crashed")):
            el = time.time() - t0
            eta = el / n * (len(pairs) - n)
            note = f"  {rec['status']}: {rec['op']}/{rec['dtype']}" if rec["status"] in ("wrong", "crashed") else ""
            print(f"[{n}/{len(pairs)} {el:.0f}s, eta {eta:.0f}s]{note}", file=sys.stderr, flush=True)

    Pool(ctx, args.workers, args.tasks_per_worker, args.timeout).run(
        [(name, d, args.samples) for name, d in pairs], on_result)
    elapsed = time.time() - t0
    records.sort(key=lambda r: (r["op"], DTYPES.index(r["dtype"])))
    print(f"op_db conformance sweep: {len(pairs)} (op, dtype) pairs, {args.samples} samples each; {build}")
    print_report(records, dtypes, elapsed)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"samples": args.samples, "seconds": round(elapsed, 1), "build": build,
                       "summary": summarize(records, dtypes),
                       "fallback_reasons": fallback_reasons(records), "pairs": records}, f, indent=1)
    failed = any(r["status"] in ("wrong", "crashed") for r in records)
    return 1 if failed and not args.no_fail else 0


if __name__ == "__main__":
    sys.exit(main())
