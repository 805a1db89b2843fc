"""Bias gradients on the GPU: column sums of an [L, C] matrix (over L) as braze-opt --cuda
writes them, unsplit and split in P partials, under plan-cuda's record and under records of R
column groups x T threads, in one process.

    python benchmarks/gpu_bias_sweep.py                    # ViT-B/16's and BERT-base's shapes
    python benchmarks/gpu_bias_sweep.py --shapes 6304x3072:bf16 --json sweep.json

Each shape LxC:dtype (bf16 or f32) sums to f32, as a training step's bias gradient does. For
each P dividing L (P = 1, 2, 4, .. 32, at least 64 rows a partial), the first stage is written
as a loop program over [P, L/P, C] and printed by braze-opt under plan-cuda's record and under
records of R = 1, 2, 4 or 8 groups of 16-byte column vectors and T threads a group (blocks of
128 to 1,024 threads); for P > 1 the second stage (P values a column) is braze's plan and is
timed with the first. Every form's sums are checked against float64's; each form is timed as
a CUDA graph of 20 calls, medians of --repeats samples with the forms interleaved
(gpu_column_sums.timed). Printed per
shape: the unsplit planned form (braze's kernel before split-reductions splits it), the planned
and fastest record for each P, and the five fastest forms.
"""
import argparse
import json
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_column_sums import function_text, opt, timed  # noqa: E402

SHAPES = "6304x3072:bf16,6304x2304:bf16,6304x768:bf16,2048x3072:f32,2048x768:f32,2048x3072:bf16"
P = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
P.add_argument("--shapes", default=SHAPES, help="comma-separated LxC:dtype (bf16 or f32)")
P.add_argument("--repeats", type=int, default=9)
P.add_argument("--json", help="write every time here")
DTYPES = {"bf16": (torch.bfloat16, 2), "f32": (torch.float32, 4)}


def column_sum(rows, cols, dtype, partials=1):
    """The loop program of a sum over `rows` of [rows, cols] values of `dtype` to f32, in
    `partials` partial sums per column (the first stage of a split) when above 1."""
    n = rows // partials
    value = "  %1 = cast(%0) : f32\n  yield %1\n" if dtype != "f32" else "  yield %0\n"
    if partials == 1:
        return (f"buffer %x: {dtype}[{rows}, {cols}] input 0\n"
                f"buffer %out0: f32[{cols}] output 0\n"
                f"compute %out0[i0 < {cols}] reduce sum over [r0 < {rows}] {{\n"
                f"  %0 = load %x[i0 + {cols}*r0] : {dtype}\n{value}}}\n")
    return (f"buffer %x: {dtype}[{partials}, {n}, {cols}] input 0\n"
            f"buffer %out0: f32[{partials}, {cols}] output 0\n"
            f"compute %out0[i0 < {partials}, i1 < {cols}] reduce sum over [r0 < {n}] {{\n"
            f"  %0 = load %x[{n * cols}*i0 + i1 + {cols}*r0] : {dtype}\n{value}}}\n")


def kernel0(text, results, record=None):
    """braze-opt's kernel0 for loop program `text` (under schedule line `record` if given):
    a dict of its record, prelude, function, grid and block, or None where refused."""
    got = opt(text, *([record] if record else []))
    if got is None:
        return None
    schedule, code = got
    head = schedule.splitlines()[0]
    m = re.search(r"launch\{block=(\d+) threads=(\d+) vec=(\d+)(?: columns=(\d+))?", head)
    block, threads, vec, columns = int(m[1]), int(m[2]), int(m[3]), int(m[4] or 0)
    per_block = block // threads * (vec if columns else 1)
    prelude, body = function_text(code, "kernel0")
    return dict(record=head[head.index("launch{"):], prelude=prelude, body=body,
                grid=-(-results // per_block), block=block)


def forms(rows, cols, dtype):
    """Every form of the shape: kernel0 dicts with P, planned and second (the second stage's
    kernel0, for P > 1)."""
    vec = 16 // DTYPES[dtype][1]
    out = []
    for p in (1, 2, 4, 8, 16, 32):
        if rows % p or rows // p < 64:
            continue
        text = column_sum(rows, cols, dtype, p)
        outer = f"[x0 < {p}, x1 < {cols}]" if p > 1 else f"[x0 < {cols}]"
        records = [None] + [f"kernel0 outer {outer} inner [y0 < {rows // p}] "
                            f"launch{{block={r * t} threads={t} vec={vec} columns={r}}}\n"
                            for r in (1, 2, 4, 8) for t in (32, 64, 128, 256, 512, 1024)
                            if 128 <= r * t <= 1024]
        second = kernel0(column_sum(p, cols, "f32"), cols) if p > 1 else None
        for record in records:
            f = kernel0(text, p * cols, record)
            if f is not None:
                f.update(P=p, planned=record is None, second=second)
                out.append(f)
    return out


def launcher(kernel, f, args):
    return lambda: kernel(grid=(f["grid"], 1, 1), block=(f["block"], 1, 1), args=args)


def sweep(rows, cols, dtype, repeats):
    """Times every form of a shape: its forms, each with "us"."""
    from torch.cuda._utils import _cuda_load_module, _nvrtc_compile
    fs = forms(rows, cols, dtype)
    names = [f"form{i}" for i in range(len(fs))]
    source = fs[0]["prelude"] + "\n" + "\n".join(
        f["body"].replace(") kernel0(", f") {name}(", 1) for f, name in zip(fs, names))
    seconds = {}
    for f in fs:
        if f["second"] is not None and f["P"] not in seconds:
            seconds[f["P"]] = f"second{f['P']}"
            source += "\n" + f["second"]["body"].replace(") kernel0(", f") second{f['P']}(", 1)
    ptx, _ = _nvrtc_compile(source, names[0])
    kernels = _cuda_load_module(ptx, names + list(seconds.values()))
    torch.manual_seed(0)
    x = torch.randn(rows, cols, device="cuda").to(DTYPES[dtype][0])
    want = x.double().sum(0)
    partials = torch.empty(32 * cols, device="cuda")
    out = torch.empty(cols, device="cuda")
    err = torch.zeros(1, dtype=torch.int32, device="cuda")
    calls = {}
    for f, name in zip(fs, names):
        if f["P"] == 1:
            call = launcher(kernels[name], f, [x, out, err])
        else:
            first = launcher(kernels[name], f, [x, partials, err])
            second = launcher(kernels[seconds[f["P"]]], f["second"], [partials, out, err])
            call = (lambda a=first, b=second: (a(), b()))
        out.fill_(float("nan"))
        call()
        torch.cuda.synchronize()
        if not torch.allclose(out.double(), want, rtol=1e-4, atol=1e-2):
            raise SystemExit(f"{rows}x{cols}:{dtype} P={f['P']} {f['record']}: sums differ "
                             "from float64's")
        calls[name] = call
    us = timed(calls, repeats)
    for f, name in zip(fs, names):
        f["us"] = us[name]
    return fs


def main():
    args = P.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    results = {}
    for shape in args.shapes.split(","):
        dims, dtype = shape.split(":")
        rows, cols = (int(v) for v in dims.split("x"))
        fs = sweep(rows, cols, dtype, args.repeats)
        results[shape] = [{k: f[k] for k in ("P", "record", "planned", "us")} for f in fs]
        gb = rows * cols * DTYPES[dtype][1] / 1e3  # bytes read / 1e3: GB/s over microseconds
        unsplit = next(f for f in fs if f["P"] == 1 and f["planned"])
        print(f"## {shape}: unsplit, planned {unsplit['record']}: {unsplit['us']:.2f} us "
              f"({gb / unsplit['us']:.0f} GB/s)")
        for p in sorted({f["P"] for f in fs}):
            planned = next(f for f in fs if f["P"] == p and f["planned"])
            best = min((f for f in fs if f["P"] == p), key=lambda f: f["us"])
            print(f"  P={p}: planned {planned['record']} {planned['us']:.2f} us; fastest "
                  f"{best['record']} {best['us']:.2f}")
        for f in sorted(fs, key=lambda f: f["us"])[:5]:
            print(f"  fastest: P={f['P']} {f['record']} {f['us']:.2f} us "
                  f"({gb / f['us']:.0f} GB/s)")
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
