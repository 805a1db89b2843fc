"""A mixture of experts' grouped products alone, on CUDA: braze's grouped kernel against eager's
torch._grouped_mm (CUTLASS on sm_90), at the sizes of gpu_models.py's MoE model.

    python benchmarks/grouped_gemm.py [--tokens 4096] [--experts 8] [--repeats 15]

The rows are routed to the experts at random (every row to one expert, as after a top-k's
flattening), the weights are transformers' [experts, out, in], read transposed. Two products:
gate-up (hidden 1024 -> 2 x 2816) and down (2816 -> 1024). Each line gives the medians of
--repeats interleaved timings (CUDA events around 10 calls each), braze's speed against
eager's, and the largest difference between their results.
"""
import argparse
import json

import torch

import braze  # noqa: F401 (registers the "braze" backend)

P = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
P.add_argument("--tokens", type=int, default=4096, help="routed rows (tokens x top-k)")
P.add_argument("--experts", type=int, default=8)
P.add_argument("--repeats", type=int, default=15)
SHAPES = {"gate_up": (5632, 1024), "down": (1024, 2816)}  # (out, in)


def grouped(x, w, offs):
    return torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)


def timed(fn, args, calls=10):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn(*args)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls * 1e3  # us


def main():
    a = P.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("grouped_gemm.py needs a CUDA device")
    torch.manual_seed(0)
    counts = torch.multinomial(torch.ones(a.experts), a.tokens, replacement=True)
    offs = counts.bincount(minlength=a.experts).cumsum(0).to(torch.int32).cuda()
    out = {"device": torch.cuda.get_device_name(), "tokens": a.tokens, "experts": a.experts}
    for name, (n, k) in SHAPES.items():
        x = torch.randn(a.tokens, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(a.experts, n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
        torch._dynamo.reset()
        fns = {"eager": grouped, "braze": torch.compile(grouped, backend="braze")}
        err = (fns["braze"](x, w, offs).float() - grouped(x, w, offs).float()).abs().max().item()
        for fn in fns.values():
            for _ in range(3):
                fn(x, w, offs)
        times = {key: [] for key in fns}
        for _ in range(a.repeats):
            for key, fn in fns.items():
                times[key].append(timed(fn, (x, w, offs)))
        med = {key: sorted(v)[len(v) // 2] for key, v in times.items()}
        out[name] = {"eager_us": round(med["eager"], 1), "braze_us": round(med["braze"], 1),
                     "braze_x_eager": round(med["eager"] / med["braze"], 3), "max_diff": err}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
