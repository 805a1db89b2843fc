import os
import tempfile

import pytest
import torch

# Each test session compiles into its own cache so results never depend on earlier runs.
os.environ.setdefault("BRAZE_CACHE_DIR", tempfile.mkdtemp(prefix="braze-test-cache-"))
torch.set_num_threads(2)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
