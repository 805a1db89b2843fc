"""CPU attention's peak memory: how much a compiled call's peak resident memory grows, against
the Sq x Sk scores it never holds (`make bench-cpu-memory`).

  * forward: causal scaled_dot_product_attention, [1, 8, 4096, 64] f32, inference;
  * training: causal attention forward and the gradients of q, k and v, [1, 2, 2048, 32] f32;
  * training with dropout: the same through braze::attention_dropout (p = 0.1, one seed),
    whose gradients are compared with its eager implementation's.

Each case runs in a fresh process (2 threads) after a compile at another size, so that its peak
is its own; it also prints the largest error against eager and the ops left to eager.

    python benchmarks/cpu_attention_memory.py
"""
import os
import subprocess
import sys
import textwrap

_TRAINING = """
        q, k, v = (torch.randn(1, 2, 2048, 32, requires_grad=True) for _ in range(3))
        scores = 2 * 2048 * 2048 * 4
        small = [t[:, :, :64].detach().requires_grad_() for t in (q, k, v)]
        torch.compile(fn, backend="braze", dynamic=False)(*small).sum().backward()
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="braze", dynamic=False)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        got = torch.autograd.grad(compiled(q, k, v).sum(), (q, k, v))
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        want = torch.autograd.grad(fn(q, k, v).sum(), (q, k, v))
"""

CASES = {
    "forward S=4096": ("""
        q, k, v = (torch.randn(1, 8, 4096, 64) for _ in range(3))
        scores = 8 * 4096 * 4096 * 4
        with torch.no_grad():
            torch.compile(fn, backend="braze")(*(t[:, :, :64] for t in (q, k, v)))
            torch._dynamo.reset()
            compiled = torch.compile(fn, backend="braze", dynamic=False)
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            got = [compiled(q, k, v)]
            grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
            want = [fn(q, k, v)]
    """),
    "training S=2048": _TRAINING,
    "training with dropout S=2048": """
        from braze.attention_dropout import attention_dropout
        seed = torch.tensor(77)
        fn = lambda q, k, v: attention_dropout(q, k, v, None, seed, 0.1, True, 32 ** -0.5)[0]
""" + _TRAINING,
}

PRELUDE = """
import resource, torch, torch.nn.functional as F, braze
torch.manual_seed(0)
fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
"""

EPILOGUE = """
err = max((g - w).abs().max().item() for g, w in zip(got, want))
print(grown * 1024 / 2**20, scores / 2**20, err, braze.counters()["fallback_ops"])
"""


def run_case(name):
    """(peak RSS growth MiB, scores MiB, max error, fallback ops) of case `name`, measured in a
    fresh process with 2 threads; RuntimeError with the child's last line if it failed."""
    script = PRELUDE + textwrap.dedent(CASES[name]) + EPILOGUE
    env = dict(os.environ, OMP_NUM_THREADS="2")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         timeout=900)
    if run.returncode != 0:
        raise RuntimeError(run.stderr.strip().splitlines()[-1] if run.stderr.strip() else
                           f"exit status {run.returncode}")
    grown, scores, err, fallbacks = run.stdout.split()[-4:]
    return float(grown), float(scores), float(err), int(fallbacks)


def main():
    print("| case | peak RSS growth MiB | scores MiB (one product) | max error | fallback ops |")
    print("|---|---:|---:|---:|---:|")
    for name in CASES:
        try:
            grown, scores, err, fallbacks = run_case(name)
        except RuntimeError as e:
            print(f"| {name} | failed: {e} | | | |")
            continue
        print(f"| {name} | {grown:.2f} | {scores:.0f} | {err:.1e} | {fallbacks} |")


if __name__ == "__main__":
    main()
