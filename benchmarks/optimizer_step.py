"""An optimizer step compiled, against eager PyTorch's multi-tensor and fused steps, in one process.

    python benchmarks/optimizer_step.py                       # AdamW, GPT-2 small's parameters, cuda
    python benchmarks/optimizer_step.py --optimizer sgd --repeats 30
    python benchmarks/optimizer_step.py --device cpu --scale 0.1 --backends eager_foreach,braze

Parameters: the shapes of GPT-2 small (124M parameters: embeddings, 12 blocks, final norm), times
--scale per dim of every matrix (the vectors keep their length), f32, random gradients that stay
the same between steps.
Backends (each its own copy of the parameters and state, from the same start):
  eager_foreach   the optimizer with foreach=True (what the compiled steps trace)
  eager_fused     fused=True (one kernel over all parameters; AdamW and Adam only)
  inductor        torch.compile(opt.step) with foreach=True
  braze           torch.compile(opt.step, backend="braze") with foreach=True
On CUDA, Adam and AdamW are capturable (their step counts on the device), as compiled steps are.
Correctness: after --check-steps steps, every parameter against eager_foreach's (relative to its
largest magnitude). Time: ms per step, the median of --repeats samples of --inner steps each,
backends interleaved within every repeat; on CUDA between CUDA events, on the CPU by the clock.
Also braze's counters over its steps (graphs, fallback ops, inputs written in place or copied
back). The exit status is 1 when braze raised, left an op to eager, or differs beyond 1e-5.
"""
import argparse
import statistics
import sys
import time

import torch

import braze

P = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
P.add_argument("--optimizer", default="adamw", choices=("adamw", "adam", "sgd"))
P.add_argument("--device", default="cuda")
P.add_argument("--scale", type=float, default=1.0, help="times every matrix dim")
P.add_argument("--backends", default="eager_foreach,eager_fused,inductor,braze")
P.add_argument("--repeats", type=int, default=15)
P.add_argument("--inner", type=int, default=5)
P.add_argument("--check-steps", type=int, default=3)
ARGS = P.parse_args()
DEV = torch.device(ARGS.device)


def shapes():
    """GPT-2 small's parameter shapes, matrices scaled by --scale."""
    d = max(8, int(768 * ARGS.scale))
    vocab, ctx = max(8, int(50257 * ARGS.scale)), max(8, int(1024 * ARGS.scale))
    out = [(vocab, d), (ctx, d)]
    for _ in range(12):
        out += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,),
                (d, 4 * d), (4 * d,), (4 * d, d), (d,)]
    return out + [(d,), (d,)]


def make(backend):
    g = torch.Generator().manual_seed(0)
    params = []
    for s in shapes():
        p = torch.nn.Parameter(torch.randn(s, generator=g).to(DEV))
        p.grad = torch.randn(s, generator=g).to(DEV) * 1e-2
        params.append(p)
    kw = {"fused": True} if backend == "eager_fused" else {"foreach": True}
    cuda = DEV.type == "cuda"
    if ARGS.optimizer == "sgd":
        if backend == "eager_fused":
            kw = {"fused": True}
        opt = torch.optim.SGD(params, lr=1e-2, momentum=0.9, weight_decay=1e-4, **kw)
    else:
        cls = torch.optim.AdamW if ARGS.optimizer == "adamw" else torch.optim.Adam
        capturable = {"capturable": True} if cuda and backend != "eager_fused" else {}
        opt = cls(params, lr=1e-3, weight_decay=1e-2, **kw, **capturable)
    step = opt.step
    torch._dynamo.reset()
    if backend == "inductor":
        step = torch.compile(opt.step)
    elif backend == "braze":
        step = torch.compile(opt.step, backend="braze")
    return params, step


def sync():
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def sample(step):
    if DEV.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(ARGS.inner):
            step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / ARGS.inner
    t = time.perf_counter()
    for _ in range(ARGS.inner):
        step()
    return (time.perf_counter() - t) * 1e3 / ARGS.inner


def main():
    backends = [b for b in ARGS.backends.split(",") if b]
    if ARGS.optimizer == "sgd" and "eager_fused" in backends and DEV.type == "cpu":
        backends.remove("eager_fused")
    count = sum(torch.Size(s).numel() for s in shapes())
    print(f"# {ARGS.optimizer} over {count / 1e6:.1f}M parameters on "
          f"{torch.cuda.get_device_name() if DEV.type == 'cuda' else 'cpu'} · torch "
          f"{torch.__version__}", flush=True)
    steps, params, rows = {}, {}, {}
    before = braze.counters()
    for b in backends:
        rows[b] = {}
        try:
            params[b], steps[b] = make(b)
            for _ in range(ARGS.check_steps):
                steps[b]()
            sync()
        except Exception as e:
            rows[b]["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            steps.pop(b, None)
    after = braze.counters()
    ref = params.get("eager_foreach")
    for b in steps:
        if ref is not None:
            with torch.no_grad():
                rows[b]["rel_error"] = max(float((p - q).abs().max() / q.abs().max())
                                           for p, q in zip(params[b], ref))
    if "braze" in steps:
        rows["braze"]["counts"] = {k: after[k] - before[k] for k in (
            "graphs", "fallback_ops", "fallback_graphs", "inputs_written_in_place",
            "inputs_copied_back")}
    times = {b: [] for b in steps}
    for _ in range(ARGS.repeats):
        for b, step in steps.items():
            times[b].append(sample(step))
    base = statistics.median(times["eager_foreach"]) if "eager_foreach" in times else None
    print("| backend | ms per step | × eager foreach | rel error vs eager foreach |")
    print("|---|---:|---:|---:|")
    for b in backends:
        r = rows[b]
        if "error" in r:
            print(f"| {b} | FAIL {r['error']} | | |")
            continue
        ms = statistics.median(times[b])
        ratio = f"{base / ms:.2f}" if base else "—"
        print(f"| {b} | {ms:.3f} | {ratio} | {r.get('rel_error', float('nan')):.2e} |")
    bad = False
    if "braze" in rows:
        r = rows["braze"]
        print(f"braze: {r.get('counts')}; fallback by op: {braze.fallback_ops_by_op()}")
        c = r.get("counts") or {}
        bad = ("error" in r or c.get("fallback_ops", 0) or c.get("fallback_graphs", 0)
               or r.get("rel_error", 0) > 1e-5)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
