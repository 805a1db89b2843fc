"""Host time per call against the call's GPU span, by backend (one process):

    python benchmarks/gpu_host.py moe --backends braze,inductor_ro [--profile]

For each backend, after warm-up: 30 calls, each after a synchronize, timing the host from the
call to its return (perf_counter) and the call's span on the stream (CUDA events recorded
around it), medians. A call whose host time nears its span is host-bound. With --profile,
cProfile's top functions by cumulative time over 30 more calls. Models are gpu_models.py's.
"""
import argparse
import cProfile
import io
import os
import pstats
import sys
import time

sys.argv, _argv = sys.argv[:1], sys.argv  # gpu_models parses its own flags at import
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_models as gm  # noqa: E402
sys.argv = _argv

import torch  # noqa: E402

P = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
P.add_argument("model", choices=gm.MODELS)
P.add_argument("--backends", default="braze,inductor_ro")
P.add_argument("--profile", action="store_true")


def main():
    a = P.parse_args()
    model, call, _, train = gm.build(a.model)
    grad = torch.enable_grad() if train else torch.no_grad()
    with grad:
        for b in a.backends.split(","):
            fn = gm.compiled(model, b)
            for _ in range(5):
                call(fn)
            host, span = [], []
            for _ in range(30):
                torch.cuda.synchronize()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t = time.perf_counter()
                s.record()
                call(fn)
                h = time.perf_counter() - t
                e.record()
                e.synchronize()
                host.append(h * 1e3)
                span.append(s.elapsed_time(e))
            host.sort()
            span.sort()
            print(f"## {a.model} {b}: host {host[15]:.3f} ms a call, span {span[15]:.3f} ms",
                  flush=True)
            if a.profile:
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(30):
                    call(fn)
                torch.cuda.synchronize()
                prof.disable()
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(25)
                print(out.getvalue())


if __name__ == "__main__":
    main()
