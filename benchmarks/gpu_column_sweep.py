"""A sweep of the first stage of a channels-last batch norm's statistics on the GPU: partials x
column groups x threads, against the form braze plans, in one process.

    python benchmarks/gpu_column_sweep.py                     # ResNet-50's twelve shapes
    python benchmarks/gpu_column_sweep.py --shapes 32x64x56x56 --json sweep.json

For each [N, C, H, W] f32 image stored channels-last, braze's split of `torch.var_mean(x,
(0, 2, 3))` sums x and x*x in f64 over P partials of the N*H*W rows per channel in a first
column kernel, then the partials in a second. Here the first stage is written as a loop program
for each P (a power of two leaving at least 98 rows a partial and 512 to 65,536 partial
results), and braze-opt --cuda prints its kernel under plan-cuda's record and under records of
R = 2, 4 or 8 column groups (4 neighbouring channels each) and T threads a group (blocks of
128 to 1,024 threads). Each shape's kernels are one NVRTC program; every kernel's sums are
checked against float64 sums, then timed as a CUDA graph of 20 launches (medians of --repeats
samples, the kernels of a shape interleaved). The table gives, for each shape, the first stage
of braze's own split (the P and record `braze-opt --cuda` gives the whole op) and the fastest
form found. The second stage (P values a channel) is not timed.
"""
import argparse
import json
import os
import re
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_column_sums import function_text, graphed, opt, var_mean_graph  # noqa: E402

RESNET50 = ("32x64x112x112,32x64x56x56,32x256x56x56,32x128x56x56,32x128x28x28,32x512x28x28,"
            "32x256x28x28,32x256x14x14,32x1024x14x14,32x512x14x14,32x512x7x7,32x2048x7x7")
P = argparse.ArgumentParser(description=__doc__.split("\n")[0])
P.add_argument("--shapes", default=RESNET50, help="comma-separated NxCxHxW images")
P.add_argument("--repeats", type=int, default=9)
P.add_argument("--json", help="write every time here")


def first_stage(p, length, c):
    """The loop program of the first stage: sum and sum of squares over [p, length, c]."""
    def body(square):
        load = f"  %0 = load %x[{length * c}*i0 + i1 + {c}*r0] : f32\n  %1 = cast(%0) : f64\n"
        return load + ("  %2 = mul(%1, %1) : f64\n  yield %2\n" if square else "  yield %1\n")
    head = f"[i0 < {p}, i1 < {c}] reduce sum over [r0 < {length}] {{\n"
    return (f"buffer %x: f32[{p}, {length}, {c}] input 0\n"
            f"buffer %out0: f64[{p}, {c}] output 0\nbuffer %out1: f64[{p}, {c}] output 1\n"
            f"compute %out0{head}{body(False)}}}\ncompute %out1{head}{body(True)}}}\n")


def kernel0(schedule, code, rows):
    """kernel0's record, the prelude, its function and its launch: (record, prelude, body,
    grid, block)."""
    head = schedule.splitlines()[0]
    m = re.search(r"launch\{block=(\d+) threads=(\d+) vec=(\d+)(?: columns=(\d+))?", head)
    block, threads, vec, columns = int(m[1]), int(m[2]), int(m[3]), int(m[4] or 0)
    per_block = block // threads * (vec if columns else 1)
    prelude, body = function_text(code, "kernel0")
    return head[head.index("launch{"):], prelude, body, -(-rows // per_block), block


def planned_partials(n, c, h, w):
    """The partials braze's split gives var_mean over the shape (1: not split)."""
    schedule, _ = opt(var_mean_graph(n, c, h, w))
    head = schedule.splitlines()[0]
    points = 1
    for e in re.findall(r"< (\d+)", head.split("inner")[0]):
        points *= int(e)
    return points // c


def forms(n, c, h, w):
    """Every form of the shape: dicts of P, record, prelude, body, grid and block."""
    rows_all, out = n * h * w, []
    p = 1
    while p <= rows_all:
        length = rows_all // p
        if rows_all % p == 0 and length >= 98 and 512 <= p * c <= 65536:
            program = first_stage(p, length, c)
            records = [None] + [f"block={r * t} threads={t} vec=4 columns={r}"
                                for r in (2, 4, 8) for t in (32, 64, 128, 256, 512)
                                if 128 <= r * t <= 1024]
            for rec in records:
                line = (f"kernel0 outer [x0 < {p}, x1 < {c}] inner [y0 < {length}] "
                        f"launch{{{rec}}}\n" if rec else None)
                got = opt(program, *([line] if line else []))
                if got is None:
                    continue
                record, prelude, body, grid, block = kernel0(*got, p * c)
                out.append(dict(P=p, record=record, planned=rec is None, prelude=prelude,
                                body=body, grid=grid, block=block))
        p *= 2
    return out


def main():
    args = P.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    from torch.cuda._utils import _cuda_load_module, _nvrtc_compile
    rows, results = [], {}
    for shape in args.shapes.split(","):
        n, c, h, w = (int(v) for v in shape.split("x"))
        fs = forms(n, c, h, w)
        names = [f"form{i}" for i in range(len(fs))]
        source = fs[0]["prelude"] + "\n" + "\n".join(
            f["body"].replace(") kernel0(", f") {name}(", 1) for f, name in zip(fs, names))
        ptx, _ = _nvrtc_compile(source, names[0])
        kernels = _cuda_load_module(ptx, names)
        torch.manual_seed(0)
        x = torch.randn(n * h * w * c, device="cuda")
        most = max(f["P"] for f in fs) * c
        s1 = torch.empty(most, dtype=torch.float64, device="cuda")
        s2 = torch.empty_like(s1)
        err = torch.zeros(1, dtype=torch.int32, device="cuda")
        refs, runs = {}, {}
        for f, name in zip(fs, names):
            p = f["P"]
            if p not in refs:
                xd = x.view(p, -1, c).double()
                refs[p] = (xd.sum(1).reshape(-1), (xd * xd).sum(1).reshape(-1))
            call = (lambda k=kernels[name], f=f: k(grid=(f["grid"], 1, 1),
                                                    block=(f["block"], 1, 1),
                                                    args=[x, s1, s2, err]))
            s1.fill_(float("nan"))
            s2.fill_(float("nan"))
            call()
            torch.cuda.synchronize()
            if not (torch.allclose(s1[:p * c], refs[p][0], rtol=1e-9, atol=1e-6) and
                    torch.allclose(s2[:p * c], refs[p][1], rtol=1e-9, atol=1e-6)):
                raise SystemExit(f"{shape} P={p} {f['record']}: sums differ from float64's")
            runs[name] = graphed(call)[0]
        samples = {name: [] for name in runs}
        for _ in range(args.repeats):
            for name, replay in runs.items():
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                replay()
                b.record()
                b.synchronize()
                samples[name].append(a.elapsed_time(b) * 1000 / 20)
        for f, name in zip(fs, names):
            f["us"] = statistics.median(samples[name])
        results[shape] = [{k: f[k] for k in ("P", "record", "planned", "us")} for f in fs]
        split = planned_partials(n, c, h, w)
        # Unsplit (P = 1), braze's first kernel may be another (a two-pass variance in f32).
        braze = [f for f in fs if f["P"] == split and f["planned"] and split > 1]
        best = min(fs, key=lambda f: f["us"])
        rows.append((shape, split, braze[0] if braze else None, best, len(fs)))
    print("| shape | braze P | braze record | braze us | best P | best record | best us | forms |")
    print("|---|---:|---|---:|---:|---|---:|---:|")
    for shape, split, braze, best, count in rows:
        mine = (f"{braze['record']} | {braze['us']:.2f}" if braze else
                "(not split, or a P outside the sweep) | -")
        print(f"| {shape} | {split} | {mine} | {best['P']} | {best['record']} | "
              f"{best['us']:.2f} | {count} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
