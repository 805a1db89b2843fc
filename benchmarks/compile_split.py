"""The first call of one model of benchmarks/models.py under torch.compile(backend="braze") on
the CPU, and where braze's compile time went (braze.compile_times(): support, lower,
host_compile, nvrtc, load, python, total). Run it with a fresh BRAZE_CACHE_DIR for a cold
compile:

    BRAZE_CACHE_DIR=$(mktemp -d) .venv/bin/python benchmarks/compile_split.py gpt2
"""
import argparse
import time

import torch

import braze
import models


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", choices=sorted(models.MODELS))
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    fn, inputs = models.MODELS[args.model][1]()
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    with torch.no_grad():
        start = time.perf_counter()
        torch.compile(fn, backend="braze")(*inputs)
        first = time.perf_counter() - start
    split = ", ".join(f"{k} {v:.3f}" for k, v in braze.compile_times().items())
    print(f"{args.model}: first call {first:.2f} s; braze's seconds: {split}; "
          f"fallback ops {braze.counters()['fallback_ops']}")


if __name__ == "__main__":
    main()
