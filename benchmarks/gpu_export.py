"""CUDA packages (issue 38): exports models with braze.export on the GPU, saves eager's outputs
beside each package for examples/cpp/run_package, and measures in one process:

    python benchmarks/gpu_export.py <dir> [--only resnet50,bert] [--repeats 30] [--json out.json]

For each model: the export's time and the package's size; braze.load's time and its first run;
then the steady-state latency of the loaded package (with its CUDA graphs, and loaded with
cuda_graphs=False) against torch.compile(backend="braze"),
AOTInductor's package (aoti_compile_and_package, run through aoti_load_package, in a process of
its own: see below) and eager, as CUDA-event medians of interleaved repeats, and each one's
largest error against eager.

Models: ResNet-50 (torchvision, random weights, f16, channels-last weights, batch 8 at 224x224)
and BERT-base (transformers, random weights, bf16, 8 sequences of 128 tokens).
"""
import argparse
import json
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import export_packages  # noqa: E402

import braze  # noqa: E402

warnings.filterwarnings("ignore")
DEV = "cuda"


def models():
    """(name, model, make(seed) -> inputs, tolerance)."""
    out = []
    import torchvision
    torch.manual_seed(0)
    resnet = torchvision.models.resnet50().to(DEV, torch.float16).eval()
    resnet = resnet.to(memory_format=torch.channels_last)
    out.append(("resnet50", resnet,
                lambda seed: (torch.randn(8, 3, 224, 224, device=DEV, dtype=torch.float16,
                                          generator=torch.Generator(DEV).manual_seed(seed)),),
                5e-2))
    import transformers
    transformers.logging.set_verbosity_error()

    class Bert(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = transformers.BertModel(transformers.BertConfig())

        def forward(self, ids):
            return self.m(input_ids=ids).last_hidden_state

    bert = Bert().to(DEV, torch.bfloat16).eval()
    out.append(("bert", bert,
                lambda seed: (torch.randint(0, 30522, (8, 128), device=DEV,
                                            generator=torch.Generator(DEV).manual_seed(seed)),),
                1e-1))
    return out


def gpu_ms(fn, inputs):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn(*inputs)
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def say(*what):
    print(*what, file=sys.stderr, flush=True)


def first(result):
    return result[0] if isinstance(result, (tuple, list)) else result


def export_and_load(name, model, make, tol, out, row):
    """Exports `model` to out/name (and eager's cases beside it), loads it and runs it once."""
    x = make(1)
    pkg = os.path.join(out, name)
    t = time.perf_counter()
    braze.export(model, x, pkg)
    row["export_s"] = time.perf_counter() - t
    say(f"{name}: exported in {row['export_s']:.1f} s")
    row["package_mb"] = sum(os.path.getsize(os.path.join(d, f))
                            for d, _, fs in os.walk(pkg) for f in fs) / 2**20
    export_packages.write_cases(model, make, (1, 2), tol, os.path.join(out, name + ".cases"))
    t = time.perf_counter()
    run = braze.load(pkg)
    row["load_ms"] = (time.perf_counter() - t) * 1e3
    torch.cuda.synchronize()
    t = time.perf_counter()
    run(*x)
    torch.cuda.synchronize()
    row["first_run_ms"] = (time.perf_counter() - t) * 1e3
    say(f"{name}: loaded and run once")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--only", default="")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--json", default="")
    p.add_argument("--aoti", action="store_true",
                   help="time AOTInductor's package and eager only (run as a process of its own)")
    p.add_argument("--no-aoti", action="store_true", help="leave AOTInductor out")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows = []
    for name, model, make, tol in models():
        if a.only and name not in a.only.split(","):
            continue
        row = {"model": name}
        x = make(1)
        if not a.aoti:
            export_and_load(name, model, make, tol, a.out, row)
        with torch.no_grad():
            want = first(model(*x)).float()
            if a.aoti:
                ep = torch.export.export(model, x)
                aoti = torch._inductor.aoti_compile_and_package(
                    ep, package_path=os.path.join(a.out, name + ".pt2"))
                backends = {"aoti": torch._inductor.aoti_load_package(aoti)}
            else:
                backends = {"package": braze.load(os.path.join(a.out, name)),
                            "package_nocg": braze.load(os.path.join(a.out, name),
                                                       cuda_graphs=False)}
                torch._dynamo.reset()
                backends["braze"] = torch.compile(model, backend="braze")
                backends["braze"](*x)
                say(f"{name}: torch.compile(backend='braze') compiled")
            backends["eager"] = model
            for b, fn in backends.items():
                got = first(fn(*x)).float()
                torch.cuda.synchronize()
                say(f"{name}: {b} ran")
                row[f"{b}_max_err"] = float((got - want).abs().max())
                for _ in range(3):
                    fn(*x)
                # again once warm: a package replays its CUDA graph from its second call on
                got = first(fn(*x)).float()
                row[f"{b}_max_err"] = max(row[f"{b}_max_err"], float((got - want).abs().max()))
            times = {b: [] for b in backends}
            for _ in range(a.repeats):
                for b, fn in backends.items():
                    times[b].append(gpu_ms(fn, x))
            if "package" in backends:
                row["package_cuda_graphs"] = backends["package"].cuda_graph_stats
        for b, ts in times.items():
            ts.sort()
            row[f"{b}_ms"] = ts[len(ts) // 2]
        rows.append(row)
        print(json.dumps(row), flush=True)
        del backends
        torch._dynamo.reset()
    if a.aoti:
        print(json.dumps(rows))
        return
    if a.no_aoti:
        return finish(rows, a.json)
    # AOTInductor's loaded package crashes in a process that has loaded braze's CUDA modules
    # (torch 2.11: a segmentation fault in _load_aoti), so it is timed in a process of its own,
    # beside eager again: compare its ratio to that process's eager.
    import subprocess
    child = subprocess.run([sys.executable, "-X", "faulthandler", __file__, a.out, "--aoti",
                            "--repeats",
                            str(a.repeats), "--only", a.only], capture_output=True, text=True)
    try:
        aoti = {r["model"]: r for r in json.loads(child.stdout.strip().splitlines()[-1])}
    except (ValueError, IndexError):
        say(f"AOTInductor's process failed (exit {child.returncode}):",
            "\n".join(l for l in child.stderr.splitlines() if "arn" not in l)[-1500:])
        aoti = {}
    for r in rows:
        got = aoti.get(r["model"], {})
        if "aoti_ms" in got:
            # AOTInductor's time in this process's terms: its ratio to eager there, times
            # eager here.
            r["aoti_own_ms"], r["aoti_eager_ms"] = got["aoti_ms"], got["eager_ms"]
            r["aoti_ms"] = got["aoti_ms"] / got["eager_ms"] * r["eager_ms"]
            r["aoti_max_err"] = got["aoti_max_err"]
    finish(rows, a.json)


def finish(rows, json_path):
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=1)
    print("\n| model | export s | package MB | load ms | first run ms | package ms | "
          "package, no CUDA graphs ms | torch.compile braze ms | AOTInductor ms | eager ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['export_s']:.1f} | {r['package_mb']:.1f} | "
              f"{r['load_ms']:.0f} | {r['first_run_ms']:.1f} | {r['package_ms']:.3f} | "
              f"{r.get('package_nocg_ms', float('nan')):.3f} | "
              f"{r['braze_ms']:.3f} | {r.get('aoti_ms', float('nan')):.3f} | "
              f"{r['eager_ms']:.3f} |")


if __name__ == "__main__":
    main()
