"""A CUDA package replays a CUDA graph per input layout from the layout's second call on: its
results equal eager's at every call and stay intact while later calls run, two streams at once
stay correct, and the switches (at load, BRAZE_CUDA_GRAPHS=0) turn the graphs off."""
import threading
import warnings

import pytest
import torch
from torch.export import Dim

import braze

warnings.filterwarnings("ignore", category=FutureWarning)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 256)
        self.norm = torch.nn.LayerNorm(256)
        self.fc2 = torch.nn.Linear(256, 32)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.norm(self.fc1(x)))).softmax(-1)


@pytest.fixture(scope="module")
def cuda_package(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("a CUDA package")
    torch.manual_seed(3)
    model = Block().eval().cuda()
    path = str(tmp_path_factory.mktemp("graphs") / "block")
    braze.export(model, (torch.randn(8, 64, device="cuda"),), path,
                 dynamic_shapes={"x": {0: Dim("batch", min=1, max=512)}})
    return model, path


def _want(model, x):
    with torch.no_grad():
        return model(x)


def test_a_layout_is_captured_at_its_second_call(cuda_package, device):
    if device != "cuda":
        pytest.skip("a CUDA package")
    model, path = cuda_package
    run = braze.load(path)
    assert run.cuda_graph_stats == {"captures": 0, "replays": 0, "uncaptured": 0, "off": ""}
    held = []
    for batch in (8, 8, 8, 5, 5, 8, 300):
        x = torch.randn(batch, 64, device="cuda")
        got = run(x)
        held.append((x, got))
        torch.testing.assert_close(got, _want(model, x), rtol=1e-4, atol=1e-5)
    # Each call's outputs are its own: later replays did not write over them.
    for x, got in held:
        torch.testing.assert_close(got, _want(model, x), rtol=1e-4, atol=1e-5)
    assert run.cuda_graph_stats == {"captures": 2, "replays": 4, "uncaptured": 3, "off": ""}


def test_two_streams_at_once(cuda_package, device):
    if device != "cuda":
        pytest.skip("a CUDA package")
    model, path = cuda_package
    run = braze.load(path)
    xs = [torch.randn(64 + 16 * i, 64, device="cuda") for i in range(4)]
    want = [_want(model, x) for x in xs]
    got = [[] for _ in xs]

    def work(i):
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for _ in range(20):
                got[i].append(run(xs[i]))
        stream.synchronize()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for outs, w in zip(got, want):
        for g in outs:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert run.cuda_graph_stats["captures"] == len(xs)


def test_the_switches(cuda_package, device, monkeypatch):
    if device != "cuda":
        pytest.skip("a CUDA package")
    model, path = cuda_package
    x = torch.randn(16, 64, device="cuda")
    for run, off in ((braze.load(path, cuda_graphs=False), "turned off at load"),
                     (None, "BRAZE_CUDA_GRAPHS=0")):
        if run is None:
            monkeypatch.setenv("BRAZE_CUDA_GRAPHS", "0")
            run = braze.load(path)
        for _ in range(3):
            torch.testing.assert_close(run(x), _want(model, x), rtol=1e-4, atol=1e-5)
        assert run.cuda_graph_stats == {"captures": 0, "replays": 0, "uncaptured": 3, "off": off}


@pytest.mark.cpu_only("a CPU package")
def test_a_cpu_package_has_no_cuda_graphs(tmp_path):
    torch.manual_seed(3)
    model = Block().eval()
    path = str(tmp_path / "block")
    braze.export(model, (torch.randn(8, 64),), path)
    run = braze.load(path)
    x = torch.randn(8, 64)
    torch.testing.assert_close(run(x), _want(model, x), rtol=1e-4, atol=1e-5)
    assert run.cuda_graph_stats["off"] == "a CPU package"


class Lookup(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(100, 32)
        self.fc = torch.nn.Linear(32, 8)

    def forward(self, ids):
        return self.fc(self.emb(ids)).relu()


def test_a_bad_index_raises_from_a_replay(tmp_path, device):
    if device != "cuda":
        pytest.skip("a CUDA package")
    torch.manual_seed(4)
    model = Lookup().eval().cuda()
    path = str(tmp_path / "lookup")
    braze.export(model, (torch.randint(0, 100, (4, 16), device="cuda"),), path)
    assert "checks-indices" in open(path + "/package.txt").read().splitlines()
    run = braze.load(path)
    for _ in range(3):
        ids = torch.randint(0, 100, (4, 16), device="cuda")
        torch.testing.assert_close(run(ids), _want(model, ids), rtol=1e-4, atol=1e-5)
    assert run.cuda_graph_stats["replays"] == 2
    bad = torch.randint(0, 100, (4, 16), device="cuda")
    bad[2, 3] = 100
    with pytest.raises(braze.RunError, match="out of bounds"):
        run(bad)
    ids = torch.randint(0, 100, (4, 16), device="cuda")  # the package still runs
    torch.testing.assert_close(run(ids), _want(model, ids), rtol=1e-4, atol=1e-5)
