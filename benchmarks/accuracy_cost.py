"""The accuracy checker's cost (BRAZE_ACCURACY): the zoo's GPT-2 and ResNet on the CPU, each
compiled with and without options={"accuracy": True}; the median time per call of 7 calls after
the first, and the checker's reports (none are expected: both models are correct).

    python benchmarks/accuracy_cost.py
"""
import os
import statistics
import sys
import time
import warnings

import torch

import braze
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
import zoo
warnings.filterwarnings("ignore")
for name in ("gpt2", "resnet"):
    torch.manual_seed(0)
    model, kwargs, pick = zoo.ENTRIES[name].build()
    model.eval()
    times = {}
    for accuracy in (False, True):
        torch._dynamo.reset()
        before = len(braze.accuracy_reports())
        f = torch.compile(model, backend="braze", options={"accuracy": accuracy})
        with torch.no_grad():
            f(**kwargs)
            samples = []
            for _ in range(7):
                t = time.perf_counter(); f(**kwargs); samples.append(time.perf_counter() - t)
        times[accuracy] = statistics.median(samples)
        print(name, "accuracy" if accuracy else "plain", f"{times[accuracy]*1e3:.2f} ms/call", "reports", braze.accuracy_reports()[before:])
    print(name, f"checked/unchecked {times[True]/times[False]:.2f}x")
