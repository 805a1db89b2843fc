"""Grouped GEMMs at a mixture of experts' sizes on CUDA: eager's torch._grouped_mm against the
same call compiled by braze with its grouped tensor-core kernel (BRAZE_GROUPED_GEMM=1: on sm_90
with these K-major weights it is braze's default, elsewhere opt-in), in one process, CUDA-event
medians.

    python benchmarks/gpu_grouped_gemm.py

4096 routed rows (2048 tokens, top-2), 8 experts with random counts, bf16: the gate-up product
(1024 -> 2 x 2816) and the down product (2816 -> 1024), weights stored [experts, out, in] and read
transposed, as transformers' experts are. braze's time includes its expert lookup (a kernel
before the product). Prints each time, TFLOPs, and the largest difference from eager.
"""
import os

os.environ["BRAZE_GROUPED_GEMM"] = "1"

import torch  # noqa: E402

import braze  # noqa: E402


def median_ms(f, n=30, calls=10):
    """Median over n samples of the time per call of `calls` calls made back to back: the
    stream stays busy while the host makes the next call, so a call's host cost (guards,
    argument checks) is hidden as it is inside a model, and the kernels' time is what is left."""
    for _ in range(5):
        f()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(n):
        start.record()
        for _ in range(calls):
            f()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2]


def main():
    torch.manual_seed(0)
    dev, bf = "cuda", torch.bfloat16
    experts, rows, hidden, inner = 8, 4096, 1024, 2816
    counts = torch.distributions.Multinomial(rows, torch.ones(experts)).sample().long()
    offs = torch.cumsum(counts, 0).to(torch.int32).to(dev)
    x = torch.randn(rows, hidden, device=dev, dtype=bf)
    h = torch.randn(rows, inner, device=dev, dtype=bf)
    gate_up = torch.randn(experts, 2 * inner, hidden, device=dev, dtype=bf) * 0.02
    down = torch.randn(experts, hidden, inner, device=dev, dtype=bf) * 0.02
    eager = lambda a, w, o: torch._grouped_mm(a, w.transpose(-1, -2), offs=o)  # noqa: E731
    compiled = torch.compile(eager, backend="braze", dynamic=False)
    before = braze.counters()["fallback_ops"]
    for name, (a, w) in {"gate-up": (x, gate_up), "down": (h, down)}.items():
        ref, out = eager(a, w, offs), compiled(a, w, offs)
        err = (out.float() - ref.float()).abs().max().item()
        te, tb = median_ms(lambda: eager(a, w, offs)), median_ms(lambda: compiled(a, w, offs))
        flops = 2 * rows * a.shape[1] * w.shape[1]
        print(f"{name}: eager {te:.4f} ms ({flops / te / 1e9:.0f} TFLOPs), braze {tb:.4f} ms "
              f"({flops / tb / 1e9:.0f} TFLOPs), eager / braze {te / tb:.2f}, "
              f"max difference {err:.3g}")
    print("fallback ops:", braze.counters()["fallback_ops"] - before)


if __name__ == "__main__":
    main()
