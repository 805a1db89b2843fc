"""GPU benchmark suite: eager PyTorch vs TorchInductor vs braze on CUDA, in one process.

    python benchmarks/gpu_suite.py                          # whole suite on cuda, markdown table
    python benchmarks/gpu_suite.py --only softmax,ln_gelu --repeats 20
    python benchmarks/gpu_suite.py --json gpu.json          # also every raw number
    python benchmarks/gpu_suite.py --device cpu --scale 64 --repeats 3 --no-inductor   # smoke run
    python benchmarks/gpu_suite.py --mode max-autotune      # both compilers' autotuning

Workloads (names for --only), all on the device, random inputs:
  seed (harness.seed_func 8192×8192 f32), sin (`((x+1)*2).sin()` 2^27 f32), softmax (8192×8192
  bf16), ln_gelu (gelu(layer_norm(x, w, b)) 16384×4096 bf16), rmsnorm (LLaMA's, 16384×4096 bf16),
  mlp (Linear(1024→4096)–GELU–Linear(4096→1024) on 8192×1024 bf16; GEMM-bound), xent
  (cross-entropy 8192×32000 f32), masked_attn and masked_attn64 (scaled_dot_product_attention
  with a boolean causal mask tensor, B4 H16 S1024, head dim 128 and 64, bf16; TFLOP/s counted
  as 4·B·H·S²·D, the work of a mask no kernel skips), and two launch-overhead cases: seed_small
  (64×128 f32) and ln_gelu_small (32×768 f32). All but mlp and the attentions are memory-bound.

Method (the one in /work/shared/ANCHORS.md, on the GPU):
  * copy bandwidth, measured once at start: dst.copy_(src) of a --copy-gib GiB buffer, CUDA
    events, median; it counts the bytes read + written and is the ceiling for every
    memory-bound kernel;
  * GPU time: after warm-up, each sample times `inner` back-to-back calls between two CUDA events
    and divides (inner chosen so a sample lasts >= --min-sample-ms, at least 1); median over
    --repeats samples; eager, Inductor and braze interleaved within every repeat, so drift
    (clocks, temperature) hits all alike. The big inputs (>= 128 MB) are far larger than L2,
    so no cache flushing;
  * whole-call time, for the two launch-overhead cases only: perf_counter over --wall-calls
    back-to-back calls then torch.cuda.synchronize(), per call, median of --wall-samples
    interleaved samples; includes the Python wrapper and the launches; compared with eager;
  * achieved GB/s = (bytes of all inputs read + bytes of the output) / GPU time, and its fraction
    of the copy bandwidth; the Linear-GELU-Linear MLP reports TFLOP/s (2*M*N*K per linear);
  * compile s = first call (with synchronize) minus one eager call, each backend compiled after
    torch._dynamo.reset(); caches are cold: BRAZE_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR,
    TRITON_CACHE_DIR (and CUDA_CACHE_PATH, the driver's PTX JIT cache) point into a fresh temp
    dir removed at exit (--warm-cache keeps the usual ones);
  * error: max abs error of the first compiled result against eager, compared in float64, with
    assert_close tolerances per output dtype: rtol = 2e-2 for bf16, 1e-4 for f32, and atol the
    same times min(1, mean |eager output|) (softmax's outputs are ~1e-4: a flat atol of 2e-2
    would pass anything); a failure is printed as WRONG; braze.counters() fallback deltas over
    its compile show the workloads braze ran (partly) in eager.
The "targets" section checks: braze at >= 90% of the copy bandwidth on every memory-bound
workload; braze at least as fast as Inductor (GPU time) on every workload; braze's whole-call
time <= eager's on the two small cases; and braze correct and free of fallbacks everywhere.
All under torch.no_grad(), random inputs (torch.manual_seed(--seed) before each workload).
--scale F divides the big sizes (rows, or the element count) for quick runs; with --device cpu,
CUDA events are replaced by perf_counter. One backend failing on one workload is reported in
the table and does not stop the suite; the exit status is 1 when braze raised or was WRONG.
"""
import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
import types
import warnings

import harness

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--only", action="append", default=[], help="workloads to run (comma-separated or repeated)")
p.add_argument("--repeats", type=int, default=50, help="timed samples per backend (default 50)")
p.add_argument("--warmup", type=int, default=5, help="timed warm-up calls per backend (default 5)")
p.add_argument("--min-sample-ms", type=float, default=1.0, help="minimum sample length (default 1)")
p.add_argument("--wall-calls", type=int, default=2000, help="calls per whole-call sample (default 2000)")
p.add_argument("--wall-samples", type=int, default=7, help="whole-call samples (default 7)")
p.add_argument("--copy-gib", type=float, default=1.0, help="copy-bandwidth buffer, GiB (default 1)")
p.add_argument("--no-inductor", action="store_true", help="skip TorchInductor")
p.add_argument("--warm-cache", action="store_true", help="keep the usual on-disk compile caches")
p.add_argument("--json", metavar="PATH", help="also write all raw numbers as JSON")
p.add_argument("--device", default="cuda", help="torch device (default cuda)")
p.add_argument("--scale", type=float, default=1.0, help="divide the big sizes by this (smoke runs)")
p.add_argument("--threads", type=int, default=2, help="host threads (matter only with --device cpu)")
p.add_argument("--seed", type=int, default=0)
p.add_argument("--mode", default=None, help="torch.compile mode for Inductor and braze alike "
               "(max-autotune: Inductor's autotuning and braze's autotuner)")
ARGS = p.parse_args()

TMP = harness.prepare_process(types.SimpleNamespace(malloc="default", threads=ARGS.threads,
                                                    warm_cache=ARGS.warm_cache), "braze-gpu-bench-")
if TMP:
    os.environ["TRITON_CACHE_DIR"] = os.path.join(TMP, "triton")
    os.environ["CUDA_CACHE_PATH"] = os.path.join(TMP, "cuda")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import braze  # noqa: E402

DEV = torch.device(ARGS.device)  # main() gives a bare "cuda" its index
CUDA = DEV.type == "cuda"
# With --mode, each compiler also runs in its default mode in the same process (the _default
# backends): the speed a mode buys, and its compile time over the default's (the tuning time).
_DEFAULTS = ARGS.mode is not None
BACKENDS = (("eager",) + (() if ARGS.no_inductor else ("inductor_default",) * _DEFAULTS + ("inductor",))
            + ("braze_default",) * _DEFAULTS + ("braze",))
LABEL = {"eager": "eager", "inductor": "Inductor", "braze": "braze",
         "inductor_default": "Inductor (default mode)", "braze_default": "braze (default mode)"}
TOL = {torch.bfloat16: 2e-2, torch.float16: 1e-2}  # rtol by output dtype; others (f32) 1e-4
BW_TARGET = 0.90
COPY_BPS = None  # measured copy bandwidth, bytes/s (set in main)

# ----------------------------------------------------------------------------------------------
# Workloads. kind: "memory" (memory-bound: GB/s), "compute" (GEMM-bound: TFLOP/s), "overhead"
# (launch-bound: whole-call time compared with eager).

WORKLOADS = ("seed", "sin", "softmax", "ln_gelu", "rmsnorm", "mlp", "xent", "masked_attn",
             "masked_attn64", "seed_small", "ln_gelu_small")


def sin_func(x):
    return ((x + 1) * 2).sin()


def softmax_func(x):
    return torch.softmax(x, -1)


def ln_gelu_func(x, w, b):
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b))


def rms_norm_func(x, w, eps=1e-6):
    """LLaMA's RMSNorm: normalize in float32, cast back, times the weight."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return h.type_as(x) * w


def xent_func(logits, target):
    return F.cross_entropy(logits, target)


def masked_attention_func(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def build(name):
    """(kind, description, fn, args, flops or None) of one workload, with fresh random inputs."""
    def big(n):  # a big size (rows, or elements), divided by --scale
        return max(1, int(n / ARGS.scale))

    def r(*shape, dtype=torch.float32):
        return torch.randn(*shape, dtype=dtype, device=DEV)

    bf = torch.bfloat16
    if name == "seed":
        m = big(8192)
        return "memory", f"seed example {m}×8192 f32", harness.seed_func, (r(m, 8192), r(m, 8192)), None
    if name == "sin":
        n = big(1 << 27)
        n_s = f"2^{n.bit_length() - 1}" if n & (n - 1) == 0 else str(n)
        return "memory", f"`((x+1)*2).sin()` {n_s} f32", sin_func, (r(n),), None
    if name == "softmax":
        m = big(8192)
        return "memory", f"softmax {m}×8192 bf16", softmax_func, (r(m, 8192, dtype=bf),), None
    if name == "ln_gelu":
        m = big(16384)
        return ("memory", f"`gelu(layer_norm(x))` {m}×4096 bf16", ln_gelu_func,
                (r(m, 4096, dtype=bf), r(4096, dtype=bf), r(4096, dtype=bf)), None)
    if name == "rmsnorm":
        m = big(16384)
        return "memory", f"RMSNorm {m}×4096 bf16", rms_norm_func, (r(m, 4096, dtype=bf), r(4096, dtype=bf)), None
    if name == "mlp":
        m = big(8192)
        mlp = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))
        mlp = mlp.to(device=DEV, dtype=bf).eval()
        return ("compute", f"Linear–GELU–Linear {m}×1024×4096 bf16", mlp, (r(m, 1024, dtype=bf),),
                2 * (2 * m * 1024 * 4096))
    if name == "xent":
        m = big(8192)
        return ("memory", f"cross-entropy {m}×32000 f32", xent_func,
                (r(m, 32000), torch.randint(0, 32000, (m,), device=DEV)), None)
    if name in ("masked_attn", "masked_attn64"):
        # A boolean causal mask passed as a tensor (its values are data to the compiler).
        b, h, sq, d = max(1, int(4 / ARGS.scale)), 16, 1024, 128 if name == "masked_attn" else 64
        mask = torch.ones(sq, sq, dtype=torch.bool, device=DEV).tril()[None, None]
        return ("compute", f"attention, boolean mask tensor, B{b} H{h} S{sq} D{d} bf16",
                masked_attention_func,
                (r(b, h, sq, d, dtype=bf), r(b, h, sq, d, dtype=bf), r(b, h, sq, d, dtype=bf), mask),
                4 * b * h * sq * sq * d)
    if name == "seed_small":
        return "overhead", "seed example 64×128 f32 (overhead)", harness.seed_func, (r(64, 128), r(64, 128)), None
    assert name == "ln_gelu_small"
    return ("overhead", "`gelu(layer_norm(x))` 32×768 f32 (overhead)", ln_gelu_func,
            (r(32, 768), r(768), r(768)), None)


# ----------------------------------------------------------------------------------------------
# Measurement


def sync():
    if CUDA:
        torch.cuda.synchronize(DEV)


def sample_s(fn, args, inner):
    """Seconds per call over `inner` back-to-back calls: CUDA events on the GPU, else perf_counter."""
    if not CUDA:
        return harness.sample_s(fn, args, inner)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    sync()
    start.record()
    for _ in range(inner):
        fn(*args)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / inner


def wall_s(fn, args, calls):
    """Whole-call seconds per call: perf_counter over `calls` calls and a final synchronize."""
    sync()
    t = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    sync()
    return (time.perf_counter() - t) / calls


def inner_for(fn, args):
    """One untimed call (it may recompile after a dynamo reset), then --warmup timed ones; the
    fastest sets how many calls make a sample last >= --min-sample-ms."""
    fn(*args)
    t = min(sample_s(fn, args, 1) for _ in range(max(1, ARGS.warmup)))
    return max(1, math.ceil(ARGS.min_sample_ms * 1e-3 / max(t, 1e-7)))


def interleaved(fns, rounds, measure, res, what):
    """rounds × one measure(backend) for each backend in turn -> backend -> list; a backend that
    raises is reported in res and dropped from fns."""
    out = {b: [] for b in fns}
    for _ in range(rounds):
        for b in list(fns):
            try:
                out[b].append(measure(b))
            except Exception as e:  # report, never hide
                res[f"{b}_error"] = f"{type(e).__name__} while {what}: {str(e).strip()[:300]}"
                del fns[b], out[b]
    return out


def copy_bandwidth():
    """Device-to-device copy bandwidth in bytes/s (read + written), median of CUDA-event samples."""
    n = int(ARGS.copy_gib * (1 << 30) / ARGS.scale)
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    copy = lambda: dst.copy_(src)  # noqa: E731
    inner = inner_for(copy, ())
    return 2 * n / statistics.median(sample_s(copy, (), inner) for _ in range(max(20, ARGS.repeats)))


def _nbytes(x):
    return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else 0


def check(out, ref):
    """(max abs error, None if it passes the dtype's tolerance else why), compared in float64."""
    if not isinstance(out, torch.Tensor) or out.shape != ref.shape:
        what = f"shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        return float("nan"), f"got {what}, eager gives shape {tuple(ref.shape)}"
    o, r = out.detach().double(), ref.detach().double()
    diff = (o - r).abs().masked_fill((o.isnan() & r.isnan()) | (o.isinf() & (o == r)), 0)
    err = float(diff.max()) if diff.numel() else 0.0
    del diff
    if out.dtype != ref.dtype:
        return err, f"got dtype {out.dtype}, eager gives {ref.dtype}"
    # atol shrinks with the output's mean magnitude below 1: softmax's outputs are ~1e-4, where a
    # flat 2e-2 would let any answer pass.
    tol = TOL.get(ref.dtype, 1e-4)
    atol = tol * min(1.0, float(r.abs().mean())) if r.numel() else tol
    try:
        torch.testing.assert_close(o, r, rtol=tol, atol=atol)
        return err, None
    except AssertionError as e:
        return err, "\n".join(str(e).strip().splitlines()[:6])


def inductor_tuning_s():
    """Seconds Inductor's own clock (dynamo_timed, torch._dynamo.utils.compilation_time_metrics)
    gives its tuning phases so far: GEMM templates' precompile and benchmark, and the Triton
    autotuner's config benchmarks and coordinate descent. The configs' compiles in its worker
    processes are not among them, where braze's clock counts its forms' compiles."""
    from torch._dynamo.utils import compilation_time_metrics
    return sum(sum(v) for k, v in compilation_time_metrics.items()
               if k.endswith(("_template_autotuning", "_template_precompiling"))
               or k.startswith("CachingAutotuner."))


def compile_backend(fn, args, backend, eager_s, ref, res):
    """Compiles fn for backend in a fresh dynamo state, times its first call and checks that
    result against eager's (ref); fills res; returns the compiled callable."""
    torch._dynamo.reset()
    before = braze.counters()
    tuner_s = ((lambda: braze.compile_times().get("autotune", 0.0))
               if backend.startswith("braze") else inductor_tuning_s)  # the tuner's own clock
    tuned_before = tuner_s()
    mode = None if backend.endswith("_default") else ARGS.mode
    compiled = (torch.compile(fn, backend="braze", mode=mode) if backend.startswith("braze")
                else torch.compile(fn, mode=mode))

    def first_call():
        out = compiled(*args)
        sync()
        return out

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, cs = harness.compile_s(first_call, eager_s)
    res[f"{backend}_compile_s"] = cs
    res[f"{backend}_tune_s"] = tuner_s() - tuned_before
    if backend == "braze":  # the counters of the mode under test
        after = braze.counters()
        res["braze_counters"] = {k: after[k] - before.get(k, 0) for k in after}
        msgs = sorted({str(w.message).splitlines()[0] for w in caught})
        if msgs:
            res["braze_warnings"] = msgs
    res[f"{backend}_max_abs_err"], res[f"{backend}_wrong"] = check(out, ref)
    return compiled


def run_workload(name):
    torch.manual_seed(ARGS.seed)
    kind, desc, fn, args, flops = build(name)
    res = {"name": name, "workload": desc, "kind": kind, "flops": flops}
    ref = fn(*args)
    res["bytes"] = sum(_nbytes(a) for a in args) + _nbytes(ref)
    eager_s = res["eager_call_s"] = statistics.median(wall_s(fn, args, 1) for _ in range(3))

    fns = {"eager": fn}
    for b in BACKENDS[1:]:
        try:
            fns[b] = compile_backend(fn, args, b, eager_s, ref, res)
        except Exception as e:  # report, never hide
            res[f"{b}_error"] = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
            res[f"{b}_traceback"] = traceback.format_exc()
    del ref
    gc.collect()

    # Warm-up and inner per backend, then samples interleaved eager, Inductor, braze, eager, ...
    inner = {b: v[0] for b, v in interleaved(fns, 1, lambda b: inner_for(fns[b], args), res, "warming up").items()}
    samples = interleaved(fns, max(1, ARGS.repeats), lambda b: sample_s(fns[b], args, inner[b]), res, "timing")
    walls = (interleaved(fns, ARGS.wall_samples, lambda b: wall_s(fns[b], args, ARGS.wall_calls), res,
                         "timing whole calls") if kind == "overhead" else {})
    for b in fns:
        ms = res[f"{b}_ms"] = statistics.median(samples[b]) * 1e3
        res[f"{b}_samples_ms"], res[f"{b}_inner"] = [x * 1e3 for x in samples[b]], inner[b]
        if b in walls:
            res[f"{b}_call_ms"] = statistics.median(walls[b]) * 1e3
            res[f"{b}_call_samples_ms"] = [x * 1e3 for x in walls[b]]
        res[f"{b}_GBps"] = res["bytes"] / (ms * 1e-3) / 1e9
        res[f"{b}_bw_frac"] = res["bytes"] / (ms * 1e-3) / COPY_BPS
        if flops:
            res[f"{b}_TFLOPs"] = flops / (ms * 1e-3) / 1e12
    for t in ("", "call_"):
        if f"braze_{t}ms" in res and f"inductor_{t}ms" in res:
            res[f"braze_vs_inductor_{t}x"] = res[f"inductor_{t}ms"] / res[f"braze_{t}ms"]

    del fns, args, fn
    torch._dynamo.reset()
    gc.collect()
    if CUDA:
        torch.cuda.empty_cache()
    return res


# ----------------------------------------------------------------------------------------------
# Reporting


def _ms(v):
    return "—" if v is None else f"{v:.4f}" if v < 0.1 else f"{v:.3f}" if v < 10 else f"{v:.1f}"


def _pct(r, b):
    return f"{r[f'{b}_bw_frac']:.0%}" if f"{b}_bw_frac" in r else "—"


def _cell(r, b):
    if f"{b}_error" in r:
        return "**ERROR**"
    c = _ms(r.get(f"{b}_ms"))
    if f"{b}_call_ms" in r:
        c += f" · call {_ms(r[f'{b}_call_ms'])}"
    if r.get(f"{b}_wrong"):
        c += " **WRONG**"
    return c


def _fell_back(r):
    c = r.get("braze_counters", {})
    return bool(c.get("fallback_graphs") or c.get("fallback_ops"))


def _fallbacks(r):
    c = r.get("braze_counters")
    s = "—" if c is None else f"{c.get('fallback_graphs', 0)} / {c.get('fallback_ops', 0)}"
    return s + " **EAGER**" if _fell_back(r) else s


def print_table(results):
    first = {b: next((r["name"] for r in results if f"{b}_compile_s" in r), None) for b in BACKENDS[1:]}
    head = ["workload", "eager ms", "Inductor ms", "braze ms", "braze/Inductor ×", "GB/s braze",
            "% of copy BW (braze, Inductor)", "compile s (Inductor, braze)", "max err braze",
            "fallbacks (graphs / ops)"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in results:
        x = f"{r['braze_vs_inductor_x']:.2f}×" if "braze_vs_inductor_x" in r else "—"
        if "braze_vs_inductor_call_x" in r:
            x += f" · call {r['braze_vs_inductor_call_x']:.2f}×"
        if r["kind"] == "compute":
            rate = f"{r['braze_TFLOPs']:.3g} TFLOP/s" if "braze_TFLOPs" in r else "—"
            pct = "(GEMM-bound)"
        else:
            rate = f"{r['braze_GBps']:.3g}" if "braze_GBps" in r else "—"
            pct = f"{_pct(r, 'braze')}, {_pct(r, 'inductor')}"
            if r["kind"] == "overhead":
                pct += " (launch-bound)"
        cs = []
        for b in ("inductor", "braze"):
            v = r.get(f"{b}_compile_s")
            cs.append("—" if v is None else f"{v:.2f}" + (" ¹" if first[b] == r["name"] else ""))
            hits = r.get("braze_counters", {}).get("cache_hits") if b == "braze" else 0
            if hits:
                cs[-1] += " (cache hit)"
        err = r.get("braze_max_abs_err")
        err = "—" if err is None else f"{err:.2e}" + (" **WRONG**" if r.get("braze_wrong") else "")
        row = [r["workload"], _cell(r, "eager"), "—" if ARGS.no_inductor else _cell(r, "inductor"),
               _cell(r, "braze"), x, rate, pct, ", ".join(cs), err, _fallbacks(r)]
        print("| " + " | ".join(row) + " |")
    if _DEFAULTS:
        print_mode_table(results)
    print()
    print("ms = median GPU time per call (CUDA events; perf_counter off the GPU); "
          "'call' = whole-call wall time per call (Python + launches + synchronize), the number "
          "compared with eager on the overhead cases. × = Inductor ms / braze ms (> 1: braze faster). "
          "GB/s = (inputs read + output written) / time. compile s = first call − one eager call."
          + (f" ¹ first compile of that backend in this process (includes one-time set-up"
             f"{'' if ARGS.warm_cache else ', cold caches'})." if any(first.values()) else ""))


def print_mode_table(results):
    """With --mode: each compiler's speed and compile time in that mode against its default."""
    print()
    head = ["workload", "Inductor default ms", f"Inductor {ARGS.mode} ms", "braze default ms",
            f"braze {ARGS.mode} ms", f"braze {ARGS.mode} / Inductor {ARGS.mode} ×",
            "tuning s (Inductor, braze)", "tuner s, own clocks (Inductor, braze)"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in results:
        x = (f"{r['inductor_ms'] / r['braze_ms']:.2f}×" if "inductor_ms" in r and "braze_ms" in r
             else "—")
        tune = []
        for b in ("inductor", "braze"):
            a, d = r.get(f"{b}_compile_s"), r.get(f"{b}_default_compile_s")
            tune.append("—" if a is None or d is None else f"{a - d:.2f}")
        own = [r.get(f"{b}_tune_s") for b in ("inductor", "braze")]
        print("| " + " | ".join([r["workload"], _cell(r, "inductor_default"), _cell(r, "inductor"),
                                 _cell(r, "braze_default"), _cell(r, "braze"), x,
                                 ", ".join(tune),
                                 ", ".join("—" if o is None else f"{o:.3f}" for o in own)]) + " |")
    print(f"tuning s = first call in {ARGS.mode} minus first call in the default mode, each "
          "compiled cold in this process: the difference of two compiles, whose noise can exceed "
          "the tuning (it goes negative). Own clocks, over the "
          f"{ARGS.mode} compile: Inductor's dynamo_timed tuning phases (templates' precompile "
          "and benchmark, Triton config benchmarks and coordinate descent; not the configs' "
          "compiles in its workers), and braze.compile_times()['autotune'] (forms' compiles "
          "included).")


def targets(results):
    """[(description, passed, or None when there is nothing to check; details)]."""
    mem = [r for r in results if r["kind"] == "memory"]
    small = [r for r in results if r["kind"] == "overhead"]
    low = [f"{r['name']} {_pct(r, 'braze')}" for r in mem if r.get("braze_bw_frac", 0) < BW_TARGET]
    out = [(f"braze at >= {BW_TARGET:.0%} of copy bandwidth on every memory-bound workload",
            not low if mem else None, ", ".join(low))]
    if ARGS.no_inductor:
        out.append(("braze at least as fast as Inductor on every workload", None, "--no-inductor"))
    else:
        slow = [r["name"] + (f" {r['braze_vs_inductor_x']:.2f}×" if "braze_vs_inductor_x" in r else " (braze failed)")
                for r in results if "inductor_ms" in r and r.get("braze_vs_inductor_x", 0) < 1.0]
        skipped = [r["name"] for r in results if "inductor_ms" not in r]
        details = ", ".join(slow) + (f"; not compared (Inductor failed): {', '.join(skipped)}" if skipped else "")
        out.append(("braze at least as fast as Inductor on every workload (GPU time)", not slow, details.lstrip("; ")))
    slow = [f"{r['name']} braze {_ms(r.get('braze_call_ms'))} vs eager {_ms(r.get('eager_call_ms'))} ms"
            for r in small if not r.get("braze_call_ms", math.inf) <= r.get("eager_call_ms", 0)]
    out.append(("braze whole-call time <= eager's on the small (overhead) cases", not slow if small else None,
                "; ".join(slow)))
    bad = [r["name"] + (" ERROR" if "braze_error" in r or "eager_error" in r else
                        " WRONG" if r.get("braze_wrong") else " fallback")
           for r in results if "braze_error" in r or "eager_error" in r or r.get("braze_wrong") or _fell_back(r)]
    out.append(("braze correct against eager and free of fallbacks on every workload", not bad, ", ".join(bad)))
    return out


def print_notes(results):
    for r in results:
        for b in BACKENDS:
            if f"{b}_error" in r:
                print(f"- {r['name']}: {LABEL[b]} raised {r[f'{b}_error']}")
            if r.get(f"{b}_wrong"):
                print(f"- {r['name']}: {LABEL[b]} differs from eager beyond the tolerance:\n    "
                      + r[f"{b}_wrong"].replace("\n", "\n    "))
        if _fell_back(r):
            c = r["braze_counters"]
            print(f"- {r['name']}: braze fell back to eager (fallback_graphs={c['fallback_graphs']}, "
                  f"fallback_ops={c['fallback_ops']})")
        for w in r.get("braze_warnings", []):
            print(f"- {r['name']}: braze warning: {w}")


def main():
    global COPY_BPS, DEV
    torch.set_num_threads(ARGS.threads)
    only = [n for o in ARGS.only for n in o.split(",") if n]
    bad = [n for n in only if n not in WORKLOADS]
    if bad:
        print(f"unknown workload(s) {bad}; choose from {', '.join(WORKLOADS)}", file=sys.stderr)
        return 2
    names = only or list(WORKLOADS)
    if CUDA:
        if not torch.cuda.is_available():
            print(f"--device {ARGS.device}: CUDA is not available (try --device cpu --scale 64)", file=sys.stderr)
            return 2
        if DEV.index is None:  # torch.cuda.set_device and friends want an index
            DEV = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(DEV)
    try:
        import triton
        triton_v = triton.__version__
    except ImportError:
        triton_v = "not installed"
    dev_name = (torch.cuda.get_device_name(DEV) if CUDA else platform.processor() or platform.machine())

    print(f"# braze GPU suite — torch {torch.__version__} (CUDA {torch.version.cuda or '—'}), "
          f"triton {triton_v}, Python {platform.python_version()}")
    print(f"# device: {DEV} = {dev_name}" + ("" if CUDA else f", {torch.get_num_threads()} host threads"))
    print("# caches: " + ("the usual ones (--warm-cache)" if ARGS.warm_cache else f"fresh, under {TMP} (cold)"))
    print(f"# {ARGS.repeats} interleaved repeats after {ARGS.warmup} warm-up calls, samples >= "
          f"{ARGS.min_sample_ms} ms; overhead cases also {ARGS.wall_samples} × {ARGS.wall_calls} whole calls"
          + (f"; big sizes divided by {ARGS.scale:g}" if ARGS.scale != 1 else ""), flush=True)
    with torch.no_grad():
        COPY_BPS = copy_bandwidth()
        print(f"# copy bandwidth: {COPY_BPS / 1e9:.0f} GB/s (dst.copy_(src) of {ARGS.copy_gib / ARGS.scale:g} GiB, "
              "bytes read + written, median)", flush=True)
        harness.prime_dynamo()
        t_suite = time.perf_counter()
        results = []
        for n in names:
            t = time.perf_counter()
            try:
                r = run_workload(n)
            except Exception as e:  # eager itself failed (out of memory, ...): report, go on
                r = {"name": n, "workload": n, "kind": "error", "eager_error": f"{type(e).__name__}: {e}"}
                torch._dynamo.reset()
                gc.collect()
                if CUDA:
                    torch.cuda.empty_cache()
            results.append(r)
            status = ("ERROR" if "eager_error" in r or "braze_error" in r else "braze WRONG" if r.get("braze_wrong")
                      else "ok")
            print(f"  {n}: done in {time.perf_counter() - t:.1f} s ({status})", file=sys.stderr, flush=True)
        suite_s = time.perf_counter() - t_suite

    print()
    print_table(results)
    print()
    print("targets")
    print()
    tgts = targets(results)
    for desc, ok, details in tgts:
        mark = "[x]" if ok else "[ ]" if ok is not None else "[-]"
        word = "PASS" if ok else "FAIL" if ok is not None else "n/a"
        print(f"- {mark} {word}: {desc}" + (f" — {details}" if details else ""))
    print()
    print_notes(results)
    print(f"suite wall time {suite_s:.1f} s")

    if ARGS.json:
        meta = {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton_v,
                "device": str(DEV), "device_name": dev_name, "copy_GBps": COPY_BPS / 1e9,
                "command": " ".join([sys.executable] + sys.argv), "args": vars(ARGS), "suite_wall_s": suite_s}
        os.makedirs(os.path.dirname(os.path.abspath(ARGS.json)), exist_ok=True)
        with open(ARGS.json, "w") as f:
            json.dump({"meta": meta, "results": results,
                       "targets": [{"target": d, "pass": ok, "details": x} for d, ok, x in tgts]},
                      f, indent=2)
        print(f"wrote {ARGS.json}")
    torch._dynamo.reset()
    return 1 if any("braze_error" in r or "eager_error" in r or r.get("braze_wrong") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
