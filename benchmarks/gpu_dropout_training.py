"""A GPT-2 training step with attention dropout on the GPU: eager, TorchInductor and braze in one
process.

    python benchmarks/gpu_dropout_training.py

The step: GPT2LMHeadModel with 6 layers (GPT-2 small's width), f32, attention dropout 0.1 (the
residual and embedding dropouts 0), ids 4x256 as inputs and labels, forward, loss and backward.
Each backend runs its own copy of the model, from the same weights. braze traces attention with
dropout in CUDA training as PyTorch's math path (rules_attention.MATH_TRAINING_DROPOUT_ON_CUDA),
which then compiles whole; eager and Inductor run PyTorch's fused attention with dropout.

Printed: each backend's loss after three warm-up steps (they differ by their draws) and braze's
counters over them; ms per step, the median of 15 CUDA-event samples with the backends
interleaved in each; and the peak memory allocated during one step above what was allocated
before it.
"""
import copy
import statistics
import sys

import torch

import braze


def main():
    if not torch.cuda.is_available():
        print("gpu_dropout_training.py needs a CUDA device")
        return 0
    import transformers
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=6, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.1)
    model = transformers.GPT2LMHeadModel(cfg).cuda().train()
    ids = torch.randint(0, cfg.vocab_size, (4, 256), device="cuda")
    models = {name: copy.deepcopy(model) for name in ("eager", "inductor", "braze")}

    def step(m):
        out = m(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.loss

    def zero_grads():
        for m in models.values():
            m.zero_grad(set_to_none=True)

    inductor = torch.compile(models["inductor"], backend="inductor")
    compiled = torch.compile(models["braze"], backend="braze")
    runs = {"eager": lambda: step(models["eager"]), "inductor": lambda: step(inductor),
            "braze": lambda: step(compiled)}
    for name, run in runs.items():
        before = braze.counters()
        for _ in range(3):
            zero_grads()
            loss = run()
        after = braze.counters()
        counts = {k: after[k] - before[k]
                  for k in ("graphs", "partitions", "fallback_ops", "cuda_graphs")}
        print(f"{name}: loss {float(loss.detach()):.6f}, braze counters {counts}", flush=True)
    times = {name: [] for name in runs}
    for _ in range(15):
        for name, run in runs.items():
            zero_grads()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    for name in runs:
        print(f"{name}: {statistics.median(times[name]):.3f} ms")
    for name, run in runs.items():
        zero_grads()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        run()
        torch.cuda.synchronize()
        print(f"{name}: peak {(torch.cuda.max_memory_allocated() - base) / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
