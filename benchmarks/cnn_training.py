"""CNN training steps (the CPU by default): eager vs braze vs TorchInductor, in one process.

    python benchmarks/cnn_training.py                    # ResNet-18-shaped, MobileNetV2, ViT
    python benchmarks/cnn_training.py --only resnet18 --repeats 7
    python benchmarks/cnn_training.py --device cuda      # on a GPU

A step is forward, a loss (the output's squared mean) and backward, in train mode (batch norm
takes the batch's statistics), float32, the models of benchmarks/models.py at a reduced size
(ResNet-18-shaped at 32 base channels, MobileNetV2 at width 1.0, a 4-layer ViT of width 192
with 8×8 patches; batch 4, 64×64 images).
A fourth contender, "braze, conv bwd eager", is braze with aten.convolution_backward left to
eager (its rule removed while it compiles): braze as it was before that op compiled.
Timing: perf_counter per step, median of --repeats samples, the contenders interleaved within
each repeat after warm-up; --threads torch threads (default 2). Correctness: the largest
gradient error against a float64 copy of the model (the same weights, running statistics and
input), relative to the largest float64 gradient: eager's own error is the yardstick (against
eager, a contender that is closer to the exact gradient than eager looks worse). braze's graphs,
partitions and fallback ops are counted over its first step.
"""
import argparse
import copy
import statistics
import time

import torch

import braze
import braze.registry
import models


def resnet():
    model = models.resnet18_shaped(width=32, classes=100)
    return model, torch.randn(4, 3, 64, 64)


class LastHidden(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x).last_hidden_state


def mobilenet():
    t = models._quiet_transformers()
    model = t.MobileNetV2Model(t.MobileNetV2Config(image_size=64))
    return LastHidden(model), torch.randn(4, 3, 64, 64)


def vit():
    """A small ViT: its patch embedding is a stride-8 8×8 convolution, whose backward is the
    only convolution backward in the step."""
    t = models._quiet_transformers()
    cfg = t.ViTConfig(image_size=64, patch_size=8, hidden_size=192, num_hidden_layers=4,
                      num_attention_heads=3, intermediate_size=768)
    return LastHidden(t.ViTModel(cfg, add_pooling_layer=False)), torch.randn(4, 3, 64, 64)


MODELS = {"resnet18": resnet, "mobilenet_v2": mobilenet, "vit": vit}
CONV_BACKWARD = torch.ops.aten.convolution_backward.default


def step(fn, params, x):
    for p in params:
        p.grad = None
    out = fn(x)
    out.square().mean().backward()
    if x.is_cuda:
        torch.cuda.synchronize()
    return [p.grad.clone() for p in params]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=",".join(MODELS))
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    print("| model | eager ms | Inductor ms | braze, conv bwd eager ms | braze ms | braze / eager × "
          "| braze / Inductor × | grad error vs f64 (eager, Inductor, braze) | braze graphs, partitions, "
          "fallback ops (conv bwd eager: same) |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|")
    for name in a.only.split(","):
        torch.manual_seed(0)
        model, x = MODELS[name]()
        model, x = model.to(a.device), x.to(a.device)
        model.train()
        params = [q for q in model.parameters() if q.requires_grad]
        state = {k: v.clone() for k, v in model.state_dict().items()}
        fns = {"eager": model}
        for name_, backend in (("inductor", "inductor"), ("conv bwd eager", "braze"),
                               ("braze", "braze")):
            fns[name_] = torch.compile(model, backend=backend)
        grads, counts = {}, {}
        rules = braze.registry._REAL_RULES
        for backend, fn in fns.items():
            torch._dynamo.reset()
            model.load_state_dict(state)  # the same running statistics for every first step
            before = braze.counters()
            kept = rules.pop(CONV_BACKWARD) if backend == "conv bwd eager" else None
            try:
                grads[backend] = step(fn, params, x)
            finally:
                if kept is not None:
                    rules[CONV_BACKWARD] = kept
            after = braze.counters()
            counts[backend] = [after[k] - before[k] for k in ("graphs", "partitions", "fallback_ops")]
        exact = copy.deepcopy(model).double()
        exact.load_state_dict(state)
        exact_params = [q for q in exact.parameters() if q.requires_grad]
        grads64 = step(exact, exact_params, x.double())
        scale = max(g.abs().max().item() for g in grads64)
        err = {b: max((g.double() - w).abs().max().item() for g, w in zip(grads[b], grads64))
               / scale for b in ("eager", "inductor", "braze")}
        for fn in fns.values():
            step(fn, params, x)
        times = {b: [] for b in fns}
        for _ in range(a.repeats):
            for b, fn in fns.items():
                start = time.perf_counter()
                step(fn, params, x)
                times[b].append((time.perf_counter() - start) * 1e3)
        ms = {b: statistics.median(t) for b, t in times.items()}
        print(f"| {name} | {ms['eager']:.1f} | {ms['inductor']:.1f} | {ms['conv bwd eager']:.1f} | "
              f"{ms['braze']:.1f} | {ms['eager'] / ms['braze']:.2f} | "
              f"{ms['inductor'] / ms['braze']:.2f} | {err['eager']:.1e}, {err['inductor']:.1e}, "
              f"{err['braze']:.1e} | "
              f"{', '.join(map(str, counts['braze']))} "
              f"({', '.join(map(str, counts['conv bwd eager']))}) |", flush=True)


if __name__ == "__main__":
    main()
