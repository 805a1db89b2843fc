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


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cpu_only(reason): the test is about the CPU path and has no CUDA variant")


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
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    # A backward graph a test never called may still compile in the background: it finishes
    # here, not during the next test, whose counters it would move.
    from braze import background
    background.wait_all()
    torch._dynamo.reset()
