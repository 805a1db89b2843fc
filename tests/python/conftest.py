import os
import tempfile

import pytest
import torch

# Each test session compiles into its own cache so results never depend on earlier runs.
os.environ.setdefault("BRAZE_CACHE_DIR", tempfile.mkdtemp(prefix="braze-test-cache-"))
# Bad indices raise braze.RunError from the call on CUDA too, and CUDA stays usable for the
# tests after: the default device-side assertion would end CUDA in this process (test_cuda.py
# checks that mode in a child process).
os.environ.setdefault("BRAZE_INDEX_CHECKS", "sync")
torch.set_num_threads(2)


def _say_missing_libraries_now():
    """braze's once-per-process notice of a missing CPU library (OpenBLAS, oneDNN), given here
    and dropped, so that no test's count of braze's warnings depends on the machine's wheels
    (test_misc checks the notice itself)."""
    import warnings
    from braze import cpu
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpu.say_missing_libraries(True, True)


_say_missing_libraries_now()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cpu_only(reason): the test is about the CPU path and has no CUDA variant")
    config.addinivalue_line(
        "markers", "graph_fallback(reason): the test makes braze run a whole graph in eager "
        "PyTorch on purpose")


@pytest.fixture(autouse=True, params=["cpu", "cuda"])
def device(request):
    """Every test runs once per device: on CUDA with CUDA as torch's default device, so the
    tensors a test makes live there; skipped where PyTorch sees no GPU."""
    if request.param == "cpu":
        yield "cpu"
        return
    marker = request.node.get_closest_marker("cpu_only")
    if marker:
        pytest.skip(marker.args[0] if marker.args else "a CPU-only test")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.set_default_device("cuda")
    # Eager references in full precision: PyTorch lets cuDNN convolutions use TF32 by default.
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield "cuda"
    finally:
        torch.set_default_device(None)
        torch.backends.cudnn.allow_tf32 = tf32


@pytest.fixture(autouse=True)
def fresh_dynamo(request):
    """A fresh Dynamo per test, and no graph left to eager PyTorch unless the test is marked
    graph_fallback: a test that checks only its ops' fallbacks would pass while a whole graph
    silently ran in eager (counted in fallback_graphs alone)."""
    import braze
    from braze import background
    torch._dynamo.reset()
    before = braze.counters()["fallback_graphs"]
    yield
    # A backward graph a test never called may still compile in the background: it finishes
    # here, not during the next test, whose counters it would move.
    background.wait_all()
    torch._dynamo.reset()
    moved = braze.counters()["fallback_graphs"] - before
    if moved and not request.node.get_closest_marker("graph_fallback"):
        pytest.fail(f"{moved} graph(s) ran in eager PyTorch (braze.counters()['fallback_graphs']); "
                    "BRAZE_LOG=fallback says why. Mark the test graph_fallback if it means to.")
