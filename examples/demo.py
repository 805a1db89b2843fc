"""braze demo (`make demo`): compile the seed example with torch.compile(backend="braze"), check it
against eager PyTorch, show the C++ braze generated, and time it against eager and TorchInductor.
The seed example, w = (softmax(sum(ceil(a) + floor(b), dim=-1)) * 10) ** 3, is seed_func in
benchmarks/harness.py, which holds the set-up and timing this demo shares with the CPU suite.

Timing follows /work/shared/ANCHORS.md: medians over repeats that interleave eager, braze and
Inductor, after warm-up; compile time = first compiled call minus one eager call, each backend in
a fresh torch._dynamo.reset() state. Compiles are cold: both compilers' on-disk caches point to a
fresh temporary directory (pass --warm-cache to use the usual ones).
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import harness  # noqa: E402

p = argparse.ArgumentParser(description="braze demo: the seed example")
p.add_argument("--size", type=int, default=2048, help="rows = cols of a and b (default 2048)")
p.add_argument("--repeats", type=int, default=50, help="interleaved timed samples (default 50)")
p.add_argument("--threads", type=int, default=2)
p.add_argument("--warm-cache", action="store_true", help="reuse the on-disk compile caches")
p.add_argument("--no-inductor", action="store_true", help="skip TorchInductor")
p.add_argument("--no-source", action="store_true", help="don't print the generated C++")
p.add_argument("--malloc", choices=("reuse", "default"), default="reuse",
               help="reuse (default): glibc keeps freed memory, so eager's big temporaries cost no "
                    "page faults; default: glibc as configured (eager can be ~5-10x slower)")
ARGS = p.parse_args()

TMP = harness.prepare_process(ARGS, "braze-demo-")

import torch  # noqa: E402

import braze  # noqa: E402


func = harness.seed_func


def banner(text):
    print(f"\n{'=' * 8} {text} {'=' * max(4, 80 - len(text))}", flush=True)


def main():
    torch.set_num_threads(ARGS.threads)
    torch.manual_seed(0)
    n = ARGS.size
    a = torch.randn(n, n, dtype=torch.float32)
    b = torch.randn(n, n, dtype=torch.float32)
    print(f"braze demo: seed example on {n}×{n} float32, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {os.cpu_count()} CPUs")
    print("malloc: " + ("freed memory kept for reuse (no page faults on big temporaries)"
                        if ARGS.malloc == "reuse" else "glibc defaults"))
    print("caches: " + ("the usual on-disk caches (--warm-cache)" if ARGS.warm_cache
                        else f"fresh and empty under {TMP}, so both compiles are cold"))

    with torch.no_grad():
        # Eager reference and the "one eager call" subtracted from first compiled calls.
        expected = func(a, b)
        eager_call = harness.eager_call_s(func, (a, b), 5)

        # Dynamo/AOTAutograd import once, on something unrelated, so neither backend pays it.
        harness.prime_dynamo()

        # braze: compile (cold), check, show the generated code.
        before = braze.counters()
        fast = torch.compile(func, backend="braze")
        (result, sources), braze_compile = harness.compile_s(
            lambda: braze.run_and_get_code(fast, a, b), eager_call)
        after = braze.counters()
        torch.testing.assert_close(result, expected)
        err = (result.double() - expected.double()).abs().max().item()
        fell_back = (after["fallback_graphs"] - before["fallback_graphs"]
                     + after["fallback_ops"] - before["fallback_ops"])
        print(f"braze matches eager (torch.testing.assert_close, float32 tolerances); "
              f"max abs error {err:.3g} on values up to {expected.abs().max().item():.4g}")
        print(f"braze compiled {after['graphs_compiled'] - before['graphs_compiled']} graph(s) into "
              f"{after['kernels_generated'] - before['kernels_generated']} kernel(s), "
              f"{after['cache_hits'] - before['cache_hits']} cache hit(s), "
              f"{fell_back} fallback(s) to eager")
        if not ARGS.no_source:
            for i, src in enumerate(sources):
                banner(f"generated C++ (graph {i})")
                print(src.rstrip())
            banner("end of generated C++")

        contenders = {"eager": func, "braze": fast}
        compile_s = {"braze": braze_compile}
        if not ARGS.no_inductor:
            print("\ncompiling with TorchInductor (default backend); its first CPU compile in a "
                  "process sets up its C++ toolchain and can take ~10-70 s ...", flush=True)
            torch._dynamo.reset()
            ind = torch.compile(func)
            ind_result, compile_s["inductor"] = harness.compile_s(lambda: ind(a, b), eager_call)
            torch.testing.assert_close(ind_result, expected)
            contenders["inductor"] = ind
            # The reset dropped dynamo's entry for braze's function: its next call (a warm-up
            # call below) re-traces it and hits braze's on-disk cache; timing starts after that.

        # Warm-up, then interleaved repeats; tiny sizes repeat calls inside a sample.
        inner = {k: harness.inner_count(f, (a, b), 3, 2e-3) for k, f in contenders.items()}
        samples, foreign = harness.interleaved_samples(contenders, (a, b), inner, ARGS.repeats)

    med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    banner("timing")
    print(f"median of {ARGS.repeats} interleaved repeats after warm-up, {torch.get_num_threads()} threads\n")
    print(f"| {'':9s} | {'median ms':>10s} | {'vs eager':>8s} | {'compile s':>9s} |")
    print(f"|{'-' * 11}|{'-' * 12}|{'-' * 10}|{'-' * 11}|")
    labels = {"eager": "eager", "braze": "braze", "inductor": "Inductor"}
    for k in contenders:
        cs = f"{compile_s[k]:9.2f}" if k in compile_s else f"{'—':>9s}"
        print(f"| {labels[k]:9s} | {med[k]:10.3f} | {med['eager'] / med[k]:7.2f}× | {cs} |")
    print("\ncompile s = first compiled call − one eager call, in a fresh torch._dynamo.reset() state"
          + ("" if ARGS.warm_cache else ", cold on-disk caches") + ".")
    if "inductor" in compile_s:
        print("Inductor's figure includes its one-time C++ toolchain/header set-up, which the first "
              "Inductor compile in every process pays; later compiles in the same process are faster.")

    if foreign is not None and foreign > harness.BUSY_CORES_LIMIT:
        print(f"WARNING: other processes kept {foreign:.2f} CPU cores busy during the timing; "
              "these numbers are skewed by them.")

    torch._dynamo.reset()
    del fast, contenders
    return 0


if __name__ == "__main__":
    sys.exit(main())
