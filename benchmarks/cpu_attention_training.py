"""CPU attention training step: eager vs braze (PyTorch's flash attention, its log-sum-exp and
backward as braze's fused kernels) vs braze with the math path vs TorchInductor
(`make bench-cpu-training`).

One step is scaled_dot_product_attention (causal, f32, [B, H, S, D]) forward and the gradients of
q, k and v. The contenders are interleaved within every repeat after warm-up; the table gives
median milliseconds per step, the speedup over eager, and each one's largest gradient error
against eager.

    python benchmarks/cpu_attention_training.py
    python benchmarks/cpu_attention_training.py --seq 128,512 --repeats 10
    python benchmarks/cpu_attention_training.py --dropout 0.1

With --only NAME (braze, math or inductor) one compiled contender runs beside eager. Each
contender compiles its own copy of the attention function: Dynamo keeps compiled code on the
function's code object, so two torch.compile wrappers of one function with one backend share it
(before, both braze contenders ran whichever was compiled last: the math path).

With --dropout P the attention drops its probabilities: braze runs braze::attention_dropout (the
fused kernels with their dropout) and, as "braze (math path)", PyTorch's math path, which saves
the probabilities; every contender draws its own, so the errors are not given.
"""
import argparse
import statistics
import types

import harness


def _parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", default="128,512,1024", help="sequence lengths (comma-separated)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=15, help="timed samples per contender")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per contender")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-inductor", action="store_true", help="skip TorchInductor")
    p.add_argument("--warm-cache", action="store_true",
                   help="reuse the braze/Inductor on-disk caches instead of a fresh temp dir")
    p.add_argument("--malloc", choices=("reuse", "default"), default="reuse")
    p.add_argument("--dropout", type=float, default=0.0, help="attention dropout p")
    p.add_argument("--only", choices=("braze", "math", "inductor"),
                   help="one compiled contender beside eager")
    return p.parse_args(argv)


ARGS = _parse_args()
harness.prepare_process(ARGS, "braze-bench-train-")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import braze  # noqa: E402
from braze import rules_attention  # noqa: E402


def attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=ARGS.dropout)


def stepper(fn, grad):
    def step(q, k, v):
        return torch.autograd.grad(fn(q, k, v), (q, k, v), grad)
    return step


def run(seq):
    torch.manual_seed(0)
    shape = (ARGS.batch, ARGS.heads, seq, ARGS.head_dim)
    q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape)
    want = stepper(attention, grad)(q, k, v)
    contenders = {"eager": stepper(attention, grad)}
    plans = [("braze", "braze", False), ("braze (math path)", "braze", True)]
    if not ARGS.no_inductor:
        plans.append(("inductor", "inductor", False))
    if ARGS.only:
        plans = [plan for plan in plans
                 if plan[0] == {"math": "braze (math path)"}.get(ARGS.only, ARGS.only)]
    errors = {}
    for name, backend, math_path in plans:
        torch._dynamo.reset()
        rules_attention.MATH_TRAINING_WITHOUT_DROPOUT = math_path
        rules_attention.FUSED_CPU_DROPOUT = not math_path
        before = braze.counters().get("fallback_ops", 0)
        own = types.FunctionType(attention.__code__.replace(co_name=f"attention_{len(errors)}"),
                                 attention.__globals__)
        step = stepper(torch.compile(own, backend=backend, dynamic=False), grad)
        got = step(q, k, v)  # compiles, with the switches set
        rules_attention.MATH_TRAINING_WITHOUT_DROPOUT = False
        rules_attention.FUSED_CPU_DROPOUT = True
        errors[name] = (max((g - w).abs().max().item() for g, w in zip(got, want)),
                        braze.counters().get("fallback_ops", 0) - before)
        contenders[name] = step
        for _ in range(ARGS.warmup):
            step(q, k, v)
    samples, _ = harness.interleaved_samples(contenders, (q, k, v),
                                             {n: 1 for n in contenders}, ARGS.repeats)
    ms = {n: statistics.median(s) * 1e3 for n, s in samples.items()}
    for n in contenders:
        err, fallbacks = errors.get(n, (0.0, 0))
        error = "-" if ARGS.dropout else f"{err:.1e}"
        print(f"| {seq} | {n} | {ms[n]:.2f} | {ms['eager'] / ms[n]:.2f}x | {error} | "
              f"{fallbacks if n.startswith('braze') else '-'} |")


def main():
    torch.set_num_threads(ARGS.threads)
    print(f"causal attention training step, [B={ARGS.batch}, H={ARGS.heads}, S, D={ARGS.head_dim}] "
          f"f32, dropout {ARGS.dropout}, {ARGS.threads} threads, median of {ARGS.repeats}\n")
    print("| S | contender | ms | vs eager | max grad error | fallback ops |")
    print("|---:|---|---:|---:|---:|---:|")
    for seq in (int(s) for s in ARGS.seq.split(",")):
        run(seq)


if __name__ == "__main__":
    main()
