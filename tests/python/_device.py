"""Helpers shared by the tests (most run once per device: see conftest.py)."""
import os

import pytest
import torch
from torch.utils._pytree import tree_map


def on_cuda(*args):
    return any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)


def eager(fn, *args):
    """fn's eager result. Where eager PyTorch has no CUDA kernel for a dtype (integer addmm,
    half-precision angle, integer convolution...), the reference is computed on the CPU and
    moved to the GPU."""
    try:
        return fn(*args)
    except (NotImplementedError, RuntimeError) as e:
        text = str(e)
        unavailable = ("not implemented" in text or "not supported" in text
                       or "unable to find an engine" in text)  # cuDNN: no integer convolution
        if not on_cuda(*args) or not unavailable:
            raise
    with torch.device("cpu"):
        out = fn(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args])
    return tree_map(lambda t: t.cuda() if isinstance(t, torch.Tensor) else t, out)


def eager_cpu(fn, *args):
    """fn's result from eager PyTorch's CPU kernels, on the arguments' device. For ops whose
    result depends on an order eager CUDA leaves open (ties of an unstable sort, duplicate
    scatter targets), braze follows the CPU kernels' order on every device."""
    with torch.device("cpu"):
        out = fn(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args])
    if not on_cuda(*args):
        return out
    return tree_map(lambda t: t.cuda() if isinstance(t, torch.Tensor) else t, out)


def braze_opt():
    """The braze-opt installed with this braze; the test is skipped where there is none."""
    import braze
    exe = os.path.join(os.path.dirname(braze.__file__), "bin", "braze-opt")
    if not os.path.exists(exe):
        pytest.skip("braze-opt is not installed with this braze")
    return exe
