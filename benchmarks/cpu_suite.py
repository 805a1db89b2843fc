"""CPU benchmark suite: eager PyTorch vs braze vs TorchInductor (`make bench-cpu`).

Methodology (the one in /work/shared/ANCHORS.md):
  * speedup = median eager time / median compiled time; the three contenders are interleaved
    within every repeat after warm-up, so drift in the machine's state affects all three alike,
    and the repeats go through every order of the three, chained so that each contender's
    samples follow each other contender's equally often (harness.balanced_orders): the calls
    right after an eager sample run slower;
  * one sample = the mean of `inner` back-to-back calls, with `inner` chosen per contender so a
    sample lasts >= --min-sample-ms (matters only for the tiny overhead case);
  * compile time = first compiled call minus one eager call, each backend compiled in a fresh
    torch._dynamo.reset() state;
  * correctness: max abs error of the first compiled result against eager, and
    torch.testing.assert_close with the default float32 tolerances (for the models, the looser
    per-model tolerances of benchmarks/models.py).

Two sections, each printed as a markdown table: the workloads (single fused expressions), then
the models (GPT-2, BERT, LLaMA-style, Mixtral-style, ResNet-18-shaped, MobileNetV2;
benchmarks/models.py: random weights, float32, eval mode, no_grad), whose rows also give
braze's graphs and fallbacks for that model (braze.counters() deltas over its compile).

Compiles are cold by default: BRAZE_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR point to a fresh
temporary directory for this run (so the first Inductor compile in the process includes its
one-time C++ set-up, as it does for a user). --warm-cache keeps whatever the environment says
(the braze default is ~/.cache/braze; `make` sets build/cache).

    python benchmarks/cpu_suite.py                       # whole suite, markdown table
    python benchmarks/cpu_suite.py --only softmax --repeats 10
    python benchmarks/cpu_suite.py --only gpt2,resnet18       # models are named like workloads
    python benchmarks/cpu_suite.py --no-models                # workloads only
    python benchmarks/cpu_suite.py --json results.json
    python benchmarks/cpu_suite.py --mode max-autotune --no-inductor   # braze's autotuner
"""
import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
import warnings

import harness


def _parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", default=[],
                   help="run only this workload or model (repeatable, or comma-separated); see --list")
    p.add_argument("--list", action="store_true", help="list the workloads and models and exit")
    p.add_argument("--no-models", action="store_true", help="skip the models section")
    p.add_argument("--repeats", type=int, default=100, help="timed samples per contender (default 100)")
    p.add_argument("--model-repeats", type=int, default=30,
                   help="timed samples per contender for the models (default 30: a model call "
                        "takes 10-100 ms eager, so a sample is one call)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls per contender (default 3)")
    p.add_argument("--min-sample-ms", type=float, default=5.0,
                   help="a sample repeats a call until it lasts at least this long (default 5)")
    p.add_argument("--threads", type=int, default=2, help="torch, OpenMP and OpenBLAS threads (default 2)")
    p.add_argument("--warm-cache", action="store_true",
                   help="reuse the braze/Inductor on-disk caches instead of a fresh temp dir")
    p.add_argument("--no-inductor", action="store_true", help="skip TorchInductor")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mode", default=None, help="torch.compile mode for braze and Inductor alike "
                   "(max-autotune: braze's autotuner and Inductor's autotuning)")
    p.add_argument("--malloc", choices=("reuse", "default"), default="reuse",
                   help="reuse (default): glibc malloc keeps freed memory, so big temporaries cost "
                        "no page faults; default: glibc as configured, whose eager timings can "
                        "swing ~10x between runs on page faults")
    return p.parse_args(argv)


ARGS = _parse_args()

harness.prepare_process(ARGS, "braze-bench-")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import braze  # noqa: E402

from models import MODELS  # noqa: E402  (imports torch)


# ----------------------------------------------------------------------------------------------
# Workloads: name -> (description, function, input factory)


seed_func = harness.seed_func


def sin_func(x):
    return ((x + 1) * 2).sin()


def softmax_func(x):
    return torch.softmax(x, dim=-1)


def gelu_layer_norm_func(x, w, b):
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b))


def rms_norm_func(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def cross_entropy_func(logits, target):
    return F.cross_entropy(logits, target)


def _randn(*shape):
    return torch.randn(*shape, dtype=torch.float32)


WORKLOADS = {
    "seed-2048": ("seed example 2048×2048 f32", seed_func,
                  lambda: (_randn(2048, 2048), _randn(2048, 2048))),
    "sin": ("`((x+1)*2).sin()` 2^24 f32", sin_func, lambda: (_randn(1 << 24),)),
    "softmax": ("softmax rows 2048×4096 f32", softmax_func, lambda: (_randn(2048, 4096),)),
    "gelu-layer-norm": ("`gelu(layer_norm(x))` 4096×1024 f32", gelu_layer_norm_func,
                        lambda: (_randn(4096, 1024), _randn(1024), _randn(1024))),
    "rms-norm": ("RMSNorm 4096×1024 f32", rms_norm_func,
                 lambda: (_randn(4096, 1024), _randn(1024))),
    "cross-entropy": ("cross-entropy 1024×32000 f32", cross_entropy_func,
                      lambda: (_randn(1024, 32000), torch.randint(0, 32000, (1024,)))),
    "seed-64x128": ("seed example 64×128 f32 (overhead)", seed_func,
                    lambda: (_randn(64, 128), _randn(64, 128))),
    "pointwise-16": ("`(x+1)*2` 16 f32 (per-call overhead)", lambda x: (x + 1) * 2,
                     lambda: (_randn(16),)),
}


# Workloads that also time the floor under torch.compile: a backend that computes nothing and
# returns outputs made once at compile time, so its call is Dynamo's guards and call alone.
FLOOR = {"pointwise-16"}


def _floor_backend(gm, example_inputs):
    outs = gm(*example_inputs)

    def call(*args):
        return outs
    return call


# ----------------------------------------------------------------------------------------------
# Measurement


def _max_abs_err(out, ref):
    out, ref = out.detach().double(), ref.detach().double()
    if out.shape != ref.shape:
        return float("nan")
    both_nan = out.isnan() & ref.isnan()
    same_inf = out.isinf() & (out == ref)
    diff = (out - ref).abs().masked_fill(both_nan | same_inf, 0)
    return float(diff.max()) if diff.numel() else 0.0


def _check(out, ref, tol=None):
    """(max abs error, None if assert_close passes else its message); tol: (rtol, atol), or None
    for assert_close's defaults for the dtype."""
    err = _max_abs_err(out, ref)
    rtol, atol = tol or (None, None)
    try:
        torch.testing.assert_close(out, ref, rtol=rtol, atol=atol)
        return err, None
    except AssertionError as e:
        return err, str(e).strip()


def _compile(fn, args, backend, eager_call_s):
    """Compiles fn in a fresh dynamo state; returns (compiled fn, first output, compile s,
    braze counter deltas, warnings raised)."""
    torch._dynamo.reset()
    before = braze.counters()
    mode = ARGS.mode if backend in ("braze", None) else None
    if backend == "braze_default":  # braze in its default mode, beside --mode's
        backend = "braze"
    compiled = (torch.compile(fn, backend=backend, mode=mode) if backend
                else torch.compile(fn, mode=mode))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, cs = harness.compile_s(lambda: compiled(*args), eager_call_s)
    after = braze.counters()
    deltas = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    msgs = [str(w.message) for w in caught if "braze" in str(w.message) or backend == "braze"]
    return compiled, out, cs, deltas, msgs


def run_workload(name, repeats):
    desc, fn, make_inputs = WORKLOADS[name]
    torch.manual_seed(ARGS.seed)
    args = make_inputs()
    res = {"name": name, "workload": desc, "repeats": repeats}
    return _run(res, fn, args, repeats, settle=False, floor=name in FLOOR)


def run_model(name, repeats):
    desc, build, tol = MODELS[name]
    torch.manual_seed(ARGS.seed)
    fn, args = build()
    res = {"name": name, "workload": desc, "repeats": repeats, "rtol": tol[0], "atol": tol[1]}
    return _run(res, fn, args, repeats, settle=True, tol=tol)


def _run(res, fn, args, repeats, settle, tol=None, floor=False):
    """Compiles fn with both backends, checks them against eager, times the three contenders
    interleaved; fills in and returns res. settle: let the process's threads go idle before each
    sample (harness.settle), for the models, whose matrix products braze runs on OpenBLAS."""
    # Eager warm-up; its median call is the "eager call" subtracted from first compiled calls.
    ref = fn(*args)
    eager_call_s = harness.eager_call_s(fn, args, max(ARGS.warmup, 3))

    contenders = {"eager": fn}
    braze_out = None
    if ARGS.mode:  # braze's default mode too, compiled first: the mode's compile minus its
        try:       # compile is the time the mode adds (the autotuner's)
            c, out, cs, _, _ = _compile(fn, args, "braze_default", eager_call_s)
            contenders["braze_default"] = c
            res["braze_default_compile_s"] = cs
            res["braze_default_max_abs_err"], res["braze_default_mismatch"] = _check(out, ref, tol)
        except Exception as e:
            res["braze_default_error"] = f"{type(e).__name__}: {e}"
    try:
        c, braze_out, cs, deltas, msgs = _compile(fn, args, "braze", eager_call_s)
        contenders["braze"] = c
        res["braze_compile_s"] = cs
        res["braze_counters"] = deltas
        if msgs:
            res["braze_warnings"] = msgs
        res["braze_max_abs_err"], res["braze_mismatch"] = _check(braze_out, ref, tol)
    except Exception as e:  # report, never hide: the table shows ERROR and the notes say why
        res["braze_error"] = f"{type(e).__name__}: {e}"
        res["braze_traceback"] = traceback.format_exc()
    if not ARGS.no_inductor:
        try:
            c, ind_out, cs, _, _ = _compile(fn, args, None, eager_call_s)
            contenders["inductor"] = c
            res["inductor_compile_s"] = cs
            res["inductor_max_abs_err"], res["inductor_mismatch"] = _check(ind_out, ref, tol)
        except Exception as e:
            res["inductor_error"] = f"{type(e).__name__}: {e}"

    if floor:
        contenders["floor"], _, _, _, _ = _compile(fn, args, _floor_backend, eager_call_s)
    # Warm-up, then pick each contender's inner count from its warm call time.
    inner = {}
    for k, f in contenders.items():
        try:
            inner[k] = harness.inner_count(f, args, ARGS.warmup, ARGS.min_sample_ms * 1e-3)
        except Exception as e:
            res[f"{k}_error"] = f"{type(e).__name__} while running: {e}"
    samples, foreign = harness.interleaved_samples(contenders, args, inner, repeats, settle)
    if foreign is not None:
        # CPU that other processes used while we timed: a noisy neighbour skews every number.
        res["foreign_cpu_cores"] = foreign

    for k, s in samples.items():
        s_ms = sorted(x * 1e3 for x in s)
        res[f"{k}_ms"] = statistics.median(s_ms)
        q = statistics.quantiles(s_ms, n=4) if len(s_ms) >= 2 else [s_ms[0]] * 3
        res[f"{k}_stats_ms"] = {"min": s_ms[0], "p25": q[0], "p75": q[2], "max": s_ms[-1],
                                "inner": inner[k]}
    for k in ("braze", "inductor", "braze_default"):
        if f"{k}_ms" in res and "eager_ms" in res:
            res[f"{k}_speedup"] = res["eager_ms"] / res[f"{k}_ms"]
    torch._dynamo.reset()
    return res


# ----------------------------------------------------------------------------------------------
# Reporting


def _fmt_ms(v):
    if v is None:
        return "—"
    return f"{v:.4f}" if v < 0.1 else f"{v:.3f}" if v < 10 else f"{v:.2f}" if v < 100 else f"{v:.1f}"


def _fmt_s(v):
    return "—" if v is None else f"{v:.2f}"


def _fmt_x(v):
    return "—" if v is None else f"{v:.2f}×"


def _fmt_err(v):
    return "—" if v is None else "0" if v == 0 else f"{v:.2e}"


def _fmt_counts(c):
    """braze's graphs compiled / fallback graphs / fallback ops, from its counter deltas."""
    return " / ".join(str(c.get(k, 0)) for k in ("graphs_compiled", "fallback_graphs", "fallback_ops"))


def print_table(results, first_inductor_name, label="workload", counters=False):
    """One markdown table; counters: add a column of braze's graphs / fallbacks."""
    head = [label, "eager ms", "braze ms", "Inductor ms", "braze ×", "Inductor ×",
            "braze compile s", "Inductor compile s", "braze max abs err", "Inductor max abs err"]
    if counters:
        head.append("braze graphs / fallback graphs / fallback ops")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in results:
        b_ms = "ERROR" if "braze_error" in r else _fmt_ms(r.get("braze_ms"))
        i_ms = "ERROR" if "inductor_error" in r else _fmt_ms(r.get("inductor_ms"))
        b_err = _fmt_err(r.get("braze_max_abs_err"))
        if r.get("braze_mismatch"):
            b_err += " **MISMATCH**"
        i_err = _fmt_err(r.get("inductor_max_abs_err"))
        if r.get("inductor_mismatch"):
            i_err += " **MISMATCH**"
        if r.get("braze_counters", {}).get("fallback_graphs") or r.get("braze_counters", {}).get("fallback_ops"):
            b_ms += " (fallback)"
        i_cs = _fmt_s(r.get("inductor_compile_s"))
        if r["name"] == first_inductor_name and "inductor_compile_s" in r:
            i_cs += " ¹"
        b_cs = _fmt_s(r.get("braze_compile_s"))
        hits, misses = (r.get("braze_counters", {}).get(k, 0) for k in ("cache_hits", "cache_misses"))
        if hits:
            b_cs += " (cache hit)" if not misses else f" ({hits} of {hits + misses} graphs cached)"
        row = [r["workload"], _fmt_ms(r.get("eager_ms")), b_ms, i_ms, _fmt_x(r.get("braze_speedup")),
               _fmt_x(r.get("inductor_speedup")), b_cs, i_cs, b_err, i_err]
        if counters:
            row.append("—" if "braze_counters" not in r else _fmt_counts(r["braze_counters"]))
        print("| " + " | ".join(row) + " |")


def print_mode_table(results):
    """With --mode: braze in that mode against braze in its default mode, in the same process."""
    head = ["workload", "braze default ms", f"braze {ARGS.mode} ms", f"{ARGS.mode} / default ×",
            "extra compile s", f"{ARGS.mode} max abs err"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in results:
        d, m = r.get("braze_default_ms"), r.get("braze_ms")
        cd, cm = r.get("braze_default_compile_s"), r.get("braze_compile_s")
        err = _fmt_err(r.get("braze_max_abs_err")) + (" **MISMATCH**" if r.get("braze_mismatch") else "")
        print("| " + " | ".join([r["workload"], _fmt_ms(d), _fmt_ms(m),
                                 _fmt_x(d / m if d and m else None),
                                 _fmt_s(cm - cd if cm is not None and cd is not None else None),
                                 err]) + " |")
    print(f"× = braze default ms / braze {ARGS.mode} ms (> 1: the mode is faster); extra compile s "
          f"= first call in {ARGS.mode} − first call in the default mode (each cold).")


def _geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summarize(results):
    out = {}
    for k in ("braze", "inductor"):
        xs = [r[f"{k}_speedup"] for r in results if f"{k}_speedup" in r]
        if xs:
            out[k] = {"geomean": _geomean(xs), "geomean_clipped": _geomean([max(1.0, x) for x in xs]),
                      "n": len(xs)}
    return out


def _run_section(names, run, repeats):
    results = []
    for n in names:
        t = time.perf_counter()
        r = run(n, repeats)
        results.append(r)
        status = ("braze ERROR" if "braze_error" in r else
                  "braze MISMATCH" if r.get("braze_mismatch") else "ok")
        print(f"  {n}: done in {time.perf_counter() - t:.1f} s ({status})", file=sys.stderr, flush=True)
    return results


def _print_geomeans(summary, what):
    for k, label in (("braze", "braze"), ("inductor", "Inductor")):
        if k in summary:
            s = summary[k]
            print(f"geomean speedup vs eager, {label}: {s['geomean']:.2f}× "
                  f"(clipped at 1.0×: {s['geomean_clipped']:.2f}×, {s['n']} {what})")


def _print_notes(results):
    for r in results:
        notes = []
        if "braze_error" in r:
            notes.append(f"braze raised {r['braze_error']}")
        if r.get("braze_mismatch"):
            notes.append("braze differs from eager beyond assert_close's "
                         + (f"rtol={r['rtol']:g}, atol={r['atol']:g}" if "rtol" in r
                            else "float32 tolerances")
                         + ":\n    " + r["braze_mismatch"].replace("\n", "\n    "))
        c = r.get("braze_counters", {})
        if c.get("fallback_graphs") or c.get("fallback_ops"):
            notes.append(f"braze fell back to eager (fallback_graphs={c.get('fallback_graphs', 0)}, "
                         f"fallback_ops={c.get('fallback_ops', 0)})")
        if r.get("foreign_cpu_cores", 0) > harness.BUSY_CORES_LIMIT:
            notes.append(f"other processes kept {r['foreign_cpu_cores']:.2f} cores busy while this "
                         "workload was timed: its timings are not trustworthy")
        for w in r.get("braze_warnings", []):
            notes.append(f"warning: {w}")
        if "floor_ms" in r:
            notes.append("the floor under torch.compile (a backend that computes nothing and "
                         "returns outputs made at compile time) takes "
                         f"{r['floor_ms'] * 1e3:.1f} µs per call; braze "
                         f"{r.get('braze_ms', float('nan')) * 1e3:.1f} µs, Inductor "
                         f"{r.get('inductor_ms', float('nan')) * 1e3:.1f} µs, eager "
                         f"{r['eager_ms'] * 1e3:.1f} µs")
        if "inductor_error" in r:
            notes.append(f"Inductor raised {r['inductor_error']}")
        if r.get("inductor_mismatch"):
            notes.append("Inductor differs from eager beyond assert_close's tolerances")
        for n in notes:
            print(f"- {r['name']}: {n}")


def main():
    torch.set_num_threads(ARGS.threads)
    if ARGS.list:
        for n, (d, _, _) in WORKLOADS.items():
            print(f"{n:18s} {d}")
        for n, (d, _, tol) in MODELS.items():
            print(f"{n:18s} {d} (model; compared with rtol={tol[0]:g}, atol={tol[1]:g})")
        return 0
    only = [n for o in ARGS.only for n in o.split(",") if n]
    bad = [n for n in only if n not in WORKLOADS and n not in MODELS]
    if bad:
        print(f"unknown workload(s)/model(s) {bad}; choose from {list(WORKLOADS) + list(MODELS)}",
              file=sys.stderr)
        return 2
    if ARGS.no_models and any(n in MODELS for n in only):
        print(f"--no-models contradicts --only {[n for n in only if n in MODELS]}", file=sys.stderr)
        return 2
    workload_names = [n for n in only if n in WORKLOADS] if only else list(WORKLOADS)
    model_names = [] if ARGS.no_models else [n for n in only if n in MODELS] if only else list(MODELS)

    print(f"# braze CPU suite — torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs")
    print(f"# caches: BRAZE_CACHE_DIR={os.environ.get('BRAZE_CACHE_DIR', '(default ~/.cache/braze)')} "
          f"TORCHINDUCTOR_CACHE_DIR={os.environ.get('TORCHINDUCTOR_CACHE_DIR', '(default)')}"
          f"{'' if ARGS.warm_cache else ' (fresh: cold compiles)'}")
    print(f"# {ARGS.repeats} interleaved repeats ({ARGS.model_repeats} for the models) "
          f"after {ARGS.warmup} warm-up calls; "
          f"samples >= {ARGS.min_sample_ms} ms; malloc: "
          + ("freed memory kept for reuse (" + " ".join(f"{k}={v}" for k, v in harness.MALLOC_ENV.items())
             + ")" if ARGS.malloc == "reuse" else "glibc defaults")
          + f"; OPENBLAS_THREAD_TIMEOUT={os.environ.get('OPENBLAS_THREAD_TIMEOUT', '(default)')}",
          flush=True)

    with torch.no_grad():
        harness.prime_dynamo()
        t_suite = time.perf_counter()
        results = _run_section(workload_names, run_workload, ARGS.repeats)
        model_results = _run_section(model_names, run_model, ARGS.model_repeats)
        suite_s = time.perf_counter() - t_suite

    everything = results + model_results
    first_ind = next((r["name"] for r in everything if "inductor_compile_s" in r), None)
    summary, model_summary = summarize(results), summarize(model_results)
    if results:
        print()
        print_table(results, first_ind)
        print()
        _print_geomeans(summary, "workloads")
    if ARGS.mode and everything:
        print()
        print_mode_table(everything)
    if model_results:
        print()
        print("models")
        print()
        print_table(model_results, first_ind, label="model", counters=True)
        print()
        _print_geomeans(model_summary, "models")
    if first_ind:
        print(f"¹ the first Inductor compile in this process ({first_ind}) includes Inductor's "
              "one-time C++ toolchain/header set-up" + ("" if ARGS.warm_cache else " on a cold cache"))
    print("× = median eager ms / median compiled ms; compile s = first compiled call − one eager call")
    if model_results:
        print("model error columns: max abs error of the model's output (last hidden state / logits) "
              "against eager; a mismatch is judged with the model's rtol/atol (see --list)")
    _print_notes(everything)
    print(f"suite wall time {suite_s:.1f} s")

    if ARGS.json:
        meta = {"torch": torch.__version__, "threads": torch.get_num_threads(),
                "cpus": os.cpu_count(), "machine": platform.machine(),
                "repeats": ARGS.repeats, "model_repeats": ARGS.model_repeats, "warmup": ARGS.warmup,
                "min_sample_ms": ARGS.min_sample_ms,
                "openblas_thread_timeout": os.environ.get("OPENBLAS_THREAD_TIMEOUT"),
                "warm_cache": ARGS.warm_cache, "malloc": ARGS.malloc, "command": " ".join([sys.executable] + sys.argv),
                "braze_cache_dir": os.environ.get("BRAZE_CACHE_DIR"),
                "inductor_cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
                "suite_wall_s": suite_s}
        os.makedirs(os.path.dirname(os.path.abspath(ARGS.json)), exist_ok=True)
        with open(ARGS.json, "w") as f:
            json.dump({"meta": meta, "summary": summary, "results": results,
                       "models_summary": model_summary, "models": model_results}, f, indent=2)
        print(f"wrote {ARGS.json}")

    # Drop compiled artifacts before interpreter shutdown.
    torch._dynamo.reset()
    return 1 if any("braze_error" in r or r.get("braze_mismatch") for r in everything) else 0


if __name__ == "__main__":
    sys.exit(main())
