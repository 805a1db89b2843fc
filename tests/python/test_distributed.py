"""Data-parallel training with braze: DistributedDataParallel over a braze-compiled module on 2
gloo ranks (the CPU) gives the parameters of eager DDP after several SGD steps, and braze
compiles the graphs that Dynamo splits at DDP's gradient buckets (counted per rank)."""
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def _model():
    torch.manual_seed(0)
    layers = [torch.nn.Linear(32, 512), torch.nn.GELU()]
    for _ in range(2):  # parameters of about 2 MB: several 1 MB buckets
        layers += [torch.nn.Linear(512, 512), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(512, 8))


def _rank(rank, world, port, results):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        import braze
        from torch.nn.parallel import DistributedDataParallel as DDP
        eager = DDP(_model(), bucket_cap_mb=1)
        compiled = DDP(torch.compile(_model(), backend="braze"), bucket_cap_mb=1)
        opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (eager, compiled)]
        g = torch.Generator().manual_seed(rank)  # each rank its own batches
        before = braze.counters()
        for _ in range(3):
            x = torch.randn(16, 32, generator=g)
            for m, o in zip((eager, compiled), opts):
                o.zero_grad()
                m(x).square().mean().backward()
                o.step()
        after = braze.counters()
        diff = max(float((a - b).abs().max()) for a, b in zip(eager.parameters(),
                                                              compiled.parameters()))
        results.put((rank, diff, {k: after[k] - before[k]
                                  for k in ("graphs", "fallback_ops", "fallback_graphs")}))
    except Exception as e:  # reported to the test, which fails with it
        results.put((rank, repr(e), None))
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.cpu_only("gloo ranks on the CPU; NCCL needs a machine with 2 GPUs")
def test_ddp_over_a_compiled_module_matches_eager_ddp():
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    ranks = [ctx.Process(target=_rank, args=(r, 2, port, results)) for r in range(2)]
    for p in ranks:
        p.start()
    got = [results.get(timeout=300) for _ in ranks]
    for p in ranks:
        p.join(60)
    for rank, diff, counts in got:
        assert counts is not None, f"rank {rank}: {diff}"
        assert diff < 1e-5, f"rank {rank}: parameters differ from eager DDP by {diff}"
        assert counts["graphs"] >= 2 and counts["fallback_ops"] == 0, counts
        assert counts["fallback_graphs"] == 0, counts
