"""Where a model's GPU time goes: the kernels of one compiled call, by backend.

    python benchmarks/gpu_profile.py gpt2 --backends inductor,braze_nocg --top 20

For each backend: after warm-up, torch.profiler records --calls calls; the kernels are grouped
by name and printed by total CUDA time per call, with launch counts per call, so that two
backends' lists of the same model can be read side by side. Models are gpu_models.py's.

    python benchmarks/gpu_profile.py moe --backends braze,inductor_ro --host

With --phases (training models), each kernel's name says whether it ran in the forward or the
backward ("fwd:kernel12", "bwd:kernel12"): a compiled step's two modules number their kernels
alike. The step synchronizes before its forward and before its backward (it is timed apart from
gpu_models.py's step for that), and a kernel belongs to the last phase begun before it started.

With --host, instead: the host time of a call against the call's span on the stream, medians of
30 calls each made after a synchronize (perf_counter from the call to its return; CUDA events
recorded around it). A call whose host time nears its span is host-bound.
"""
import argparse
import collections
import os
import sys
import time

sys.argv, _argv = sys.argv[:1], sys.argv  # gpu_models parses its own flags at import
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_models as gm  # noqa: E402
sys.argv = _argv

import torch  # noqa: E402
import braze  # noqa: E402

P = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
P.add_argument("model", choices=gm.MODELS)
P.add_argument("--backends", default="inductor,braze_nocg")
P.add_argument("--calls", type=int, default=3)
P.add_argument("--top", type=int, default=20)
P.add_argument("--host", action="store_true", help="host time per call against its GPU span")
P.add_argument("--phases", action="store_true",
               help="name each kernel by the phase it ran in (fwd: or bwd:)")


def host_and_span(call, fn, calls=30):
    """Medians (ms) of a call's host time and of its span on the stream."""
    for _ in range(5):
        call(fn)
    host, span = [], []
    for _ in range(calls):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t = time.perf_counter()
        s.record()
        call(fn)
        host.append((time.perf_counter() - t) * 1e3)
        e.record()
        e.synchronize()
        span.append(s.elapsed_time(e))
    return sorted(host)[calls // 2], sorted(span)[calls // 2]


PHASE = "gpu_profile:"


def phased(call):
    """call, with a synchronize and a marker before its forward and before its backward."""
    backward = torch.Tensor.backward

    def marked_backward(self, *args, **kwargs):
        torch.cuda.synchronize()
        with torch.profiler.record_function(PHASE + "bwd"):
            return backward(self, *args, **kwargs)

    def step(fn):
        torch.cuda.synchronize()
        torch.Tensor.backward = marked_backward
        try:
            with torch.profiler.record_function(PHASE + "fwd"):
                return call(fn)
        finally:
            torch.Tensor.backward = backward
    return step


def profile(call, fn, calls, phases=False):
    if phases:
        call = phased(call)
    for _ in range(3):
        call(fn)
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA]
    if phases:
        acts.append(torch.profiler.ProfilerActivity.CPU)
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(calls):
            call(fn)
        torch.cuda.synchronize()
    events = list(prof.events())
    marks = sorted((e.time_range.start, e.name[len(PHASE):]) for e in events
                   if e.name.startswith(PHASE))
    per = collections.defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name
            if marks:
                begun = [m for t, m in marks if t <= e.time_range.start]
                name = (begun[-1] if begun else "?") + ":" + name
            per[name][0] += e.device_time_total / calls
            per[name][1] += 1
    return per


def main():
    a = P.parse_args()
    model, call, _, train = gm.build(a.model)
    grad = torch.enable_grad() if train else torch.no_grad()
    with grad:
        for b in a.backends.split(","):
            before = braze.counters()
            fn = gm.compiled(model, b)
            if a.host:
                host, span = host_and_span(call, fn)
                print(f"## {a.model} · {b}: host {host:.3f} ms a call, span {span:.3f} ms")
                continue
            per = profile(call, fn, a.calls, a.phases)
            after = braze.counters()
            total = sum(v[0] for v in per.values())
            launches = sum(v[1] for v in per.values()) / a.calls
            print(f"\n## {a.model} · {b}: {total / 1000:.3f} ms of kernels per call, "
                  f"{launches:.0f} launches; counters "
                  f"{ {k: after[k] - before[k] for k in after if after[k] != before[k]} }")
            rows = sorted(per.items(), key=lambda kv: -kv[1][0])[:a.top]
            for name, (us, n) in rows:
                print(f"{us:9.1f} us {n / a.calls:6.0f}x  {name[:110]}")


if __name__ == "__main__":
    main()
