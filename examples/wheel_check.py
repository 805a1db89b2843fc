"""Run by `make test-wheel` in a fresh virtual environment holding only torch, braze's wheel and
its dependencies: the backend is registered by the wheel's entry point, compiles the seed example
with no fallback, matches eager, and finds its CPU libraries."""
import warnings

import torch

import braze


def seed(a, b):
    return ((a.ceil() + b.floor()).sum(-1).softmax(-1) * 10) ** 3


assert "braze" in torch._dynamo.list_backends(), "the wheel did not register the backend"
with warnings.catch_warnings():
    warnings.simplefilter("error")  # a missing BLAS or oneDNN library is a warning
    f = torch.compile(seed, backend="braze")
    a, b = torch.randn(64, 128), torch.randn(64, 128)
    torch.testing.assert_close(f(a, b), seed(a, b))
    torch.testing.assert_close(torch.compile(lambda x, w: x @ w, backend="braze")(a, b.t()), a @ b.t())
c = braze.counters()
assert c["graphs_compiled"] >= 2 and c["fallback_graphs"] == 0 and c["fallback_ops"] == 0, c
print(f"braze from {braze.__file__}: the seed example and a product compiled, "
      f"{c['kernels_generated']} kernels, no fallback")
