"""Scatters beyond braze's pair cap, in the modes that combine in place: eager, TorchInductor and
braze in one process, medians of interleaved repeats (ms per call), with each compiled result's
largest difference from eager's.

    python benchmarks/scatter_modes.py [--device cpu|cuda] [--repeats 15]

Workloads: scatter_reduce amax without self and mean with self (200000x64 sources into 4096x64
rows, f32), and a bf16 embedding-style index_put sum (8192x256 rows into a 32000x256 table,
many repeated ids), which eager rounds after each value.
"""
import argparse
import statistics
import time

import torch

import braze

P = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
P.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
P.add_argument("--repeats", type=int, default=15)
ARGS = P.parse_args()
DEV = torch.device(ARGS.device)


def workloads():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 64, generator=g)
    i = torch.randint(0, 4096, (200000, 64), generator=g)
    s = torch.randn(200000, 64, generator=g)
    table = torch.randn(32000, 256, generator=g).bfloat16()
    ids = torch.randint(0, 2000, (8192,), generator=g)
    rows = torch.randn(8192, 256, generator=g).bfloat16()
    to = lambda *ts: tuple(t.to(DEV) for t in ts)
    return {
        "amax_without_self": (lambda x, i, s: x.scatter_reduce(0, i, s, "amax",
                                                               include_self=False), to(x, i, s)),
        "mean_with_self": (lambda x, i, s: x.scatter_reduce(0, i, s, "mean"), to(x, i, s)),
        "bf16_index_put_sum": (lambda t, i, r: t.index_put((i,), r, accumulate=True),
                               to(table, ids, rows)),
    }


def timed(fn, args):
    if DEV.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn(*args)
    if DEV.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def main():
    print(f"device {DEV}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'workload':<20} {'eager':>9} {'inductor':>9} {'braze':>9}  max |error| vs eager "
          f"(inductor, braze), braze fallback ops")
    for name, (fn, args) in workloads().items():
        want = fn(*args).double()
        fns = {"eager": fn}
        fallback, error = None, {}
        for backend in ("inductor", "braze"):
            torch._dynamo.reset()
            before = braze.counters()["fallback_ops"]
            f = torch.compile(fn, backend=backend)
            got = f(*args).double()
            same_nan = torch.equal(got.isnan(), want.isnan())
            error[backend] = float((got - want).nan_to_num().abs().max()) if same_nan else "NaN"
            if backend == "braze":
                fallback = braze.counters()["fallback_ops"] - before
            fns[backend] = f
        samples = {k: [] for k in fns}
        for _ in range(ARGS.repeats):
            for k, f in fns.items():
                samples[k].append(timed(f, args))
        ms = {k: statistics.median(v) for k, v in samples.items()}
        print(f"{name:<20} {ms['eager']:>9.2f} {ms['inductor']:>9.2f} {ms['braze']:>9.2f}  "
              f"{error['inductor']:.3g}, {error['braze']:.3g}, {fallback}", flush=True)


if __name__ == "__main__":
    main()
