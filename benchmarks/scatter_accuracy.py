"""Scatter-like ops at size, in every dtype and mode, against eager (CPU by default):

    python benchmarks/scatter_accuracy.py [--device cuda] [--rows 200000]

1. scatter_reduce (sum, prod, mean, amax, amin), index_add and index_put(accumulate=True) of
   [rows, 64] sources into 5000 rows, in f16, bf16, f32, f64, i32 and i64: the fallback ops
   braze counted and the largest difference from eager.
2. How each accumulating op sums half-precision values: 4096 ones added into one element give
   4096 where the sum is kept wide and rounded once, 2048 (f16) or 256 (bf16) where it is
   rounded after every add; eager's value beside braze's.
"""
import argparse
import warnings

import torch

import braze

warnings.filterwarnings("ignore")
P = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
P.add_argument("--device", default="cpu")
P.add_argument("--rows", type=int, default=200000)


def _ops(mode, d):
    if mode in ("sum", "prod", "mean", "amax", "amin"):
        return lambda b, i, s: b.scatter_reduce(0, i[:, None].expand(-1, d), s, mode)
    if mode == "index_add":
        return lambda b, i, s: b.index_add(0, i, s)
    return lambda b, i, s: b.index_put((i,), s, accumulate=True)


def sweep(device, rows, d=64, m=5000):
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, m, (rows,), generator=g).to(device)
    print("| op | dtype | fallback ops | max difference from eager |")
    print("|---|---|---:|---:|")
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32,
               torch.int64):
        for mode in ("sum", "prod", "mean", "amax", "amin", "index_add", "index_put_acc"):
            if dt.is_floating_point:
                src, base = torch.randn(rows, d, generator=g), torch.randn(m, d, generator=g)
            else:
                src = torch.randint(-3, 4, (rows, d), generator=g)
                base = torch.randint(-3, 4, (m, d), generator=g)
            src, base = src.to(device, dt), base.to(device, dt)
            f = _ops(mode, d)
            torch._dynamo.reset()
            before = braze.counters()["fallback_ops"]
            got = torch.compile(f, backend="braze")(base, idx, src)
            fallback = braze.counters()["fallback_ops"] - before
            diff = (got.double() - f(base, idx, src).double()).abs().max().item()
            print(f"| {mode} | {str(dt)[6:]} | {fallback} | {diff:.3g} |", flush=True)


def accumulation(device, n=4096):
    i = torch.zeros(n, dtype=torch.long, device=device)
    ops = {"index_add": lambda b, i, s: b.index_add(0, i, s),
           "scatter_add": lambda b, i, s: b.scatter_add(0, i[:, None].expand(-1, 2), s),
           "scatter_reduce sum": lambda b, i, s: b.scatter_reduce(0, i[:, None].expand(-1, 2),
                                                                  s, "sum"),
           "index_put accumulate": lambda b, i, s: b.index_put((i,), s, accumulate=True),
           "embedding_dense_backward": lambda b, i, s: torch.ops.aten.embedding_dense_backward(
               s, i, 1, -1, False)}
    print("\n| op | dtype | eager | braze |")
    print("|---|---|---:|---:|")
    for dt in (torch.float16, torch.bfloat16):
        base = torch.zeros(1, 2, dtype=dt, device=device)
        ones = torch.ones(n, 2, dtype=dt, device=device)
        for name, f in ops.items():
            torch._dynamo.reset()
            got = torch.compile(f, backend="braze")(base, i, ones)[0, 0].item()
            print(f"| {name} | {str(dt)[6:]} | {f(base, i, ones)[0, 0].item():g} | {got:g} |",
                  flush=True)


if __name__ == "__main__":
    a = P.parse_args()
    sweep(a.device, a.rows)
    accumulation(a.device)
