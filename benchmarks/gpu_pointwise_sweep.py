"""Pointwise kernels on the GPU: braze-opt --cuda's kernel for a graph of one pointwise kernel,
under plan-cuda's launch record and under records of other vector widths and block sizes, in
one process.

    python benchmarks/gpu_pointwise_sweep.py             # the casts and adds of bf16 training
    python benchmarks/gpu_pointwise_sweep.py --repeats 21 --json sweep.json

Each case is a graph whose inputs are random and whose outputs are checked against the planned
form's. The forms are timed as CUDA graphs of 24 calls that rotate over enough input and output
sets to exceed the L2 cache (each call reads and writes memory, as in a training step), medians
of --repeats samples with the forms interleaved. Printed per case: the planned record, every
form's time and bandwidth, and the fastest.
"""
import argparse
import json
import os
import re
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_column_sums import function_text, opt  # noqa: E402

DT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def case(name, inputs, body, outputs):
    """A graph `name` of inputs [(name, dtype, shape)], body lines and outputs
    [(name, dtype, shape)]."""
    sig = ", ".join(f"%{n}: {d}[{', '.join(map(str, s))}]" for n, d, s in inputs)
    text = (f"graph({sig}) {{\n" + "".join(f"  {line}\n" for line in body) +
            f"  return {', '.join('%' + n for n, _, _ in outputs)}\n}}\n")
    return dict(name=name, text=text, inputs=inputs, outputs=outputs)


def cases():
    w, h = [2816, 1024], [4, 512, 1024]
    return [
        # A weight gradient of an autocast step: the bf16 product widened to the f32 .grad.
        case("widen bf16->f32 [2816,1024]", [("x", "bf16", w)],
             ["%c = convert(%x) : f32[2816, 1024]"], [("c", "f32", w)]),
        # A forward weight cast: the f32 parameter rounded to bf16 for the product.
        case("round f32->bf16 [2816,1024]", [("x", "f32", w)],
             ["%c = convert(%x) : bf16[2816, 1024]"], [("c", "bf16", w)]),
        # A residual add of the f32 stream and a bf16 product, writing both precisions.
        case("residual f32+bf16 [4,512,1024]", [("r", "f32", h), ("y", "bf16", h)],
             ["%c = convert(%y) : f32[4, 512, 1024]", "%a = add(%r, %c) : f32[4, 512, 1024]",
              "%b = convert(%a) : bf16[4, 512, 1024]"],
             [("a", "f32", h), ("b", "bf16", h)]),
        case("copy bf16 [4,512,2816]", [("x", "bf16", [4, 512, 2816])],
             ["%c = neg(%x) : bf16[4, 512, 2816]"], [("c", "bf16", [4, 512, 2816])]),
        case("copy f32 [2816,1024]", [("x", "f32", w)],
             ["%c = neg(%x) : f32[2816, 1024]"], [("c", "f32", w)]),
    ]


def forms(c):
    """The planned form and the forms of other records: dicts of record, prelude, body, grid,
    block."""
    got = opt(c["text"])
    if got is None:
        raise SystemExit(f"braze-opt refused {c['name']}")
    head = got[0].splitlines()[0]
    if not re.match(r"kernel0 outer \[[^]]*\] launch\{block=\d+ vec=\d+\}$", head):
        raise SystemExit(f"{c['name']}: not one plain pointwise kernel: {head}")
    out = []
    for block in (None, 128, 256, 512):
        for vec in (None, 2, 4, 8, 16):
            if (block is None) != (vec is None):
                continue
            record = None if block is None else re.sub(
                r"launch\{[^}]*\}", f"launch{{block={block} vec={vec}}}", head) + "\n"
            g = opt(c["text"], *([record] if record else []))
            if g is None:
                continue
            rec = g[0].splitlines()[0]
            m = re.search(r"launch\{block=(\d+) vec=(\d+)\}", rec)
            b, v = int(m[1]), int(m[2])
            if record and any(f["record"] == rec[rec.index("launch{"):] for f in out):
                continue
            prelude, body = function_text(g[1], "kernel0")
            points = 1
            for d in c["outputs"][0][2]:
                points *= d
            out.append(dict(record=rec[rec.index("launch{"):], planned=record is None,
                            prelude=prelude, body=body, grid=-(-points // (b * v)), block=b))
    return out


def sweep(c, repeats):
    from torch.cuda._utils import _cuda_load_module, _nvrtc_compile
    fs = forms(c)
    names = [f"form{i}" for i in range(len(fs))]
    source = fs[0]["prelude"] + "\n" + "\n".join(
        f["body"].replace(") kernel0(", f") {name}(", 1) for f, name in zip(fs, names))
    ptx, _ = _nvrtc_compile(source, names[0])
    kernels = _cuda_load_module(ptx, names)
    nbytes = sum(torch.Size(s).numel() * DT[d].itemsize for _, d, s in c["inputs"] + c["outputs"])
    sets = max(2, -(-(256 << 20) // nbytes))  # past a 50 MiB L2 several times over
    torch.manual_seed(0)
    ins = [[torch.randn(s, device="cuda").to(DT[d]) for _, d, s in c["inputs"]]
           for _ in range(sets)]
    outs = [[torch.empty(s, device="cuda", dtype=DT[d]) for _, d, s in c["outputs"]]
            for _ in range(sets)]
    err = torch.zeros(1, dtype=torch.int32, device="cuda")
    want = None
    graphs = {}
    for f, name in zip(fs, names):
        k = kernels[name]

        def call(i, k=k, f=f):
            k(grid=(f["grid"], 1, 1), block=(f["block"], 1, 1), args=ins[i] + outs[i] + [err])
        for o in outs[0]:
            o.fill_(float("nan"))
        call(0)
        torch.cuda.synchronize()
        got = [o.clone() for o in outs[0]]
        if want is None:
            want = got
        elif not all(torch.equal(a, b) for a, b in zip(got, want)):
            raise SystemExit(f"{c['name']} {f['record']}: results differ from the planned form's")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(24):
                call(i % sets)
        graphs[name] = g
    samples = {n: [] for n in names}
    for r in range(repeats):
        for n in names[r % len(names):] + names[:r % len(names)]:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graphs[n].replay()
            b.record()
            b.synchronize()
            samples[n].append(a.elapsed_time(b) * 1000 / 24)
    for f, n in zip(fs, names):
        f["us"] = statistics.median(samples[n])
        f["gbps"] = nbytes / 1e3 / f["us"]
    return fs


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--json", help="write every time here")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    results = {}
    for c in cases():
        fs = sweep(c, args.repeats)
        planned = next(f for f in fs if f["planned"])
        best = min(fs, key=lambda f: f["us"])
        print(f"## {c['name']}: planned {planned['record']} {planned['us']:.2f} us "
              f"({planned['gbps']:.0f} GB/s); fastest {best['record']} {best['us']:.2f} us")
        for f in fs:
            if not f["planned"]:
                print(f"  {f['record']}: {f['us']:.2f} us ({f['gbps']:.0f} GB/s)")
        sys.stdout.flush()
        results[c["name"]] = [{k: f[k] for k in ("record", "planned", "us", "gbps")} for f in fs]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
