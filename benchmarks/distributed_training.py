"""Data-parallel training steps compiled by braze, against eager and TorchInductor, on N ranks.

    python benchmarks/distributed_training.py                       # 2 GPUs, NCCL: DDP and FSDP2
    python benchmarks/distributed_training.py --device cpu --repeats 0   # 2 gloo ranks, checks only

The model: --blocks residual MLP blocks (LayerNorm, Linear d -> 4d, GELU, Linear 4d -> d) on
[--batch, --seq, --dim] activations, f32, a squared-mean loss, SGD with momentum. Each rank feeds
batches of its own. Two ways to spread it, as users write them:
  ddp    DistributedDataParallel over torch.compile(model): Dynamo splits the graph at DDP's
         gradient buckets (--bucket-mb), and each piece is compiled;
  fsdp   FSDP2: each block compiled, then sharded with fully_shard, then the root sharded (the
         order torchtitan applies them).
Backends (each its own copy of the model, from the same start): eager, inductor, braze, and
`count`, a backend that compiles nothing and counts the graphs Dynamo hands it (so that a run
where braze saw no graph is told apart from one where Dynamo made none).
Correctness: after --steps steps, every parameter (gathered whole for FSDP2) against eager's,
relative to its largest magnitude. Time: ms per step, the median of --repeats samples, backends
interleaved within every repeat; on CUDA between CUDA events. braze's counters over its steps,
per rank. The exit status is 1 when a compiled copy differs beyond --tol, braze left an op or a
graph to eager, or braze compiled no graph (where Dynamo made some, and always for ddp).
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

P = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
P.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
P.add_argument("--world", type=int, default=2)
P.add_argument("--modes", default="ddp,fsdp")
P.add_argument("--backends", default="eager,inductor,braze,count")
P.add_argument("--blocks", type=int, default=8)
P.add_argument("--dim", type=int, default=1024)
P.add_argument("--batch", type=int, default=8)
P.add_argument("--seq", type=int, default=256)
P.add_argument("--bucket-mb", type=float, default=25)
P.add_argument("--steps", type=int, default=3, help="checked steps")
P.add_argument("--repeats", type=int, default=10, help="timed steps per backend (0: none)")
P.add_argument("--tol", type=float, default=1e-4)
P.add_argument("--json", help="write every number here")


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def make_model(a, device):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[Block(a.dim) for _ in range(a.blocks)]).to(device)


class Counter:
    """A backend that counts the graphs Dynamo hands it and runs them as they are."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


def compiled(module, backend, counter):
    if backend == "count":
        return torch.compile(module, backend=counter)
    return torch.compile(module, backend=backend)


def build(a, mode, backend, device, counter):
    """The model of `mode` for `backend` on this rank, and its optimizer."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = make_model(a, device)
    if mode == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        wrapped = DDP(model, device_ids=ids, bucket_cap_mb=a.bucket_mb)
        if backend != "eager":
            wrapped = compiled(wrapped, backend, counter)
        params = list(model.parameters())
    else:
        from torch.distributed.fsdp import fully_shard
        for i, block in enumerate(list(model)):
            if backend != "eager":
                block = compiled(block, backend, counter)
                model[i] = block
            fully_shard(block)
        fully_shard(model)
        wrapped = model
        params = list(model.parameters())
    return wrapped, params, torch.optim.SGD(params, lr=0.05, momentum=0.9)


def full(p):
    return (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()


def rank_main(rank, a, port, results):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    device = torch.device(a.device, rank) if a.device == "cuda" else torch.device("cpu")
    if a.device == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo", rank=rank,
                            world_size=a.world)
    out = {"rank": rank, "modes": {}}
    try:
        import braze
        for mode in a.modes.split(","):
            out["modes"][mode] = run_mode(a, mode, device, rank, braze)
    except Exception as e:  # reported by the parent, which fails with it
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        results.put(out)
        dist.destroy_process_group()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_mode(a, mode, device, rank, braze):
    torch._dynamo.reset()
    backends = a.backends.split(",")
    counter = Counter()
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
    batches = [torch.randn(a.batch, a.seq, a.dim, generator=g).to(device)
               for _ in range(max(a.steps, 1) + 1)]
    copies, counts = {}, {}
    for b in backends:
        before = braze.counters()
        copies[b] = build(a, mode, b, device, counter)
        for x in batches[:a.steps]:
            step(copies[b], x)
        sync(device)
        after = braze.counters()
        if b == "braze":
            counts = {k: after[k] - before[k] for k in ("graphs", "partitions", "fallback_ops",
                                                        "fallback_graphs", "cuda_graphs")}
            counts["fallback_by_op"] = braze.fallback_ops_by_op()
    ref = [full(p) for p in copies["eager"][1]]
    result = {"braze_counts": counts, "graphs_dynamo_made": counter.graphs, "errors": {}}
    for b in backends:
        if b == "eager":
            continue
        got = [full(p) for p in copies[b][1]]
        worst = max(float((x - y).abs().max() / y.abs().max().clamp_min(1e-30))
                    for x, y in zip(got, ref))
        result["errors"][b] = worst
    if a.repeats:
        times = {b: [] for b in backends if b != "count"}
        x = batches[-1]
        for _ in range(a.repeats):
            for b in times:
                times[b].append(timed(copies[b], x, device))
        result["ms"] = {b: statistics.median(t) for b, t in times.items()}
    return result


def step(copy, x):
    model, _, opt = copy
    opt.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    opt.step()


def timed(copy, x, device):
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(copy, x)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    t = time.perf_counter()
    step(copy, x)
    return (time.perf_counter() - t) * 1000


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(a):
    """Every rank's results (a list by rank); raises if a rank failed."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, a, port, results)) for r in range(a.world)]
    for p in procs:
        p.start()
    got = sorted((results.get(timeout=900) for _ in procs), key=lambda r: r["rank"])
    for p in procs:
        p.join(120)
    for r in got:
        if "error" in r:
            raise RuntimeError(f"rank {r['rank']}: {r['error']}")
    return got


def failures(a, ranks):
    """What the run got wrong, as sentences (empty: nothing)."""
    bad = []
    for r in ranks:
        for mode, res in r["modes"].items():
            for b, err in res["errors"].items():
                if err > a.tol:
                    bad.append(f"rank {r['rank']} {mode} {b}: parameters differ from eager's "
                               f"by {err:.3g} (relative)")
            c = res["braze_counts"]
            if c and (c["fallback_ops"] or c["fallback_graphs"]):
                bad.append(f"rank {r['rank']} {mode}: braze ran ops or graphs in eager: {c}")
            made = res["graphs_dynamo_made"]
            if c and c["graphs"] == 0 and (mode == "ddp" or made):
                bad.append(f"rank {r['rank']} {mode}: braze compiled no graph (Dynamo made "
                           f"{made} for the counting backend)")
    return bad


def main():
    a = P.parse_args()
    if a.device == "cuda" and torch.cuda.device_count() < a.world:
        sys.exit(f"--world {a.world} needs as many GPUs; this machine has "
                 f"{torch.cuda.device_count()}")
    ranks = run(a)
    print(f"| mode | rank | backend | ms per step | × eager | rel. error | Dynamo graphs | "
          f"braze graphs | partitions | fallback ops | CUDA graphs |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in ranks:
        for mode, res in r["modes"].items():
            ms = res.get("ms", {})
            for b in a.backends.split(","):
                c = res["braze_counts"] if b == "braze" else {}
                t = ms.get(b)
                ratio = f"{ms['eager'] / t:.2f}" if t and ms.get("eager") else ""
                print(f"| {mode} | {r['rank']} | {b} | {f'{t:.3f}' if t else ''} | {ratio} | "
                      f"{res['errors'].get(b, 0):.2e} | "
                      f"{res['graphs_dynamo_made'] if b == 'count' else ''} | "
                      f"{c.get('graphs', '')} | {c.get('partitions', '')} | "
                      f"{c.get('fallback_ops', '')} | {c.get('cuda_graphs', '')} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(ranks, f, indent=1)
    bad = failures(a, ranks)
    for b in bad:
        print("FAIL:", b)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
