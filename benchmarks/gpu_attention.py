"""braze's own CUDA attention kernel against cuDNN's (and PyTorch's flash and memory-efficient
kernels), on one GPU, in one process.

    python benchmarks/gpu_attention.py                 # B4 H16 S1024, head dims 64 and 128
    python benchmarks/gpu_attention.py --seq 2048 --repeats 15
    python benchmarks/gpu_attention.py --training      # forward and backward

For each head dim and each mask (none, is_causal, a boolean causal mask tensor) it times, with
CUDA events (median of --repeats samples of 10 back-to-back calls, after warm-up):
  * eager scaled_dot_product_attention restricted to cuDNN, flash and memory-efficient
    attention (sdpa_kernel); a backend that declines the problem is shown as --;
  * braze with cuDNN attention off (torch.backends.cuda.enable_cudnn_sdp(False) while it
    compiles: its own kernel), and with it on.
TFLOP/s count 4·B·H·S²·D, halved for the causal cases (both masks keep half the scores).
own/cudnn is eager cuDNN's time over braze's own kernel's. err is braze's own kernel's max
abs error against eager. bf16, random inputs, torch.no_grad(), CUDA graphs off.

With --training, each call is a forward and a backward (torch.autograd.grad of the output
against a fixed random gradient, for q, k and v): eager's backends as above, and braze, which
compiles the forward (its output and log-sum-exp) and the backward (its fused gradient kernels);
TFLOP/s count 3.5 times the forward's products. err is then the largest error of braze's four
results (output, dq, dk, dv) against eager's.
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import braze


def timed(f, args, repeats, inner=10):
    for _ in range(3):
        f(*args)
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            f(*args)
        b.record()
        torch.cuda.synchronize()
        samples.append(a.elapsed_time(b) / inner)
    return statistics.median(samples)


def plain(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def masked(q, k, v, m):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m)


def training(f):
    """f's output and its gradients for q, k and v (against the gradient `g`, the last of the
    arguments), as one call."""
    def step(*args):
        *inputs, g = args
        leaves = [x.detach().requires_grad_() if i < 3 else x for i, x in enumerate(inputs)]
        out = f(*leaves)
        return (out,) + torch.autograd.grad(out, leaves[:3], g)
    return step


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--dims", default="64,128")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--training", action="store_true", help="time a forward and a backward")
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    torch.manual_seed(0)
    b, h, s = a.batch, a.heads, a.seq
    eager = (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
             ("efficient", SDPBackend.EFFICIENT_ATTENTION))
    print("| head dim | mask | " + " | ".join(n for n, _ in eager) +
          " | braze own | braze cuDNN | own/cudnn | err |")
    print("|---|---|" + "---|" * (len(eager) + 4))
    with torch.set_grad_enabled(a.training):
        for d in (int(x) for x in a.dims.split(",")):
            for kind, f in (("none", plain), ("causal", causal), ("bool tensor", masked)):
                q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                args = (q, k, v)
                if kind == "bool tensor":
                    args += (torch.ones(s, s, dtype=torch.bool, device="cuda").tril()[None, None],)
                flops = 4 * b * h * s * s * d * (1 if kind == "none" else 0.5)
                base = f
                if a.training:
                    f = training(base)
                    args += (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16),)
                    flops *= 3.5
                ref = [x.float() for x in (f(*args) if a.training else (f(*args),))]
                ms = {}
                for name, backend in eager:
                    try:
                        with sdpa_kernel(backend):
                            ms[name] = timed(f, args, a.repeats)
                    except RuntimeError:
                        ms[name] = None
                err = float("nan")
                for name, on in (("own", False), ("braze cudnn", True)):
                    torch._dynamo.reset()
                    torch.backends.cuda.enable_cudnn_sdp(on)
                    try:
                        g = torch.compile(base, backend="braze", options={"cuda_graphs": False})
                        g = training(g) if a.training else g
                        out = g(*args)
                    finally:
                        torch.backends.cuda.enable_cudnn_sdp(True)
                    if name == "own":
                        outs = out if a.training else (out,)
                        err = max((o.float() - r).abs().max().item() for o, r in zip(outs, ref))
                    ms[name] = timed(g, args, a.repeats)

                def cell(t):
                    return "--" if t is None else f"{t * 1e3:.1f} us, {flops / t / 1e9:.0f} TF/s"
                ratio = ms["cudnn"] / ms["own"] if ms["cudnn"] else float("nan")
                print(f"| {d} | {kind} | " + " | ".join(cell(ms[n]) for n, _ in eager) +
                      f" | {cell(ms['own'])} | {cell(ms['braze cudnn'])} | {ratio:.2f} | {err:.2g} |",
                      flush=True)
    print("braze counters:", braze.counters())


if __name__ == "__main__":
    main()
