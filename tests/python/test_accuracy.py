"""The accuracy checker (BRAZE_ACCURACY, Options(accuracy=True)): a planted wrong value in a
middle kernel is found and named with its node, op, source line, worst element and kernel; a
correct model gives no report."""
import warnings

import pytest
import torch

import braze

pytestmark = pytest.mark.cpu_only("the checker's own logic; its CUDA path is the same Python")


class Block(torch.nn.Module):
    """A transformer MLP block: layer norm, a product, GELU, a product, the residual: at least
    three kernels."""

    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(64)
        self.fc1 = torch.nn.Linear(64, 256)
        self.fc2 = torch.nn.Linear(256, 64)

    def forward(self, x):
        h = self.fc1(self.ln(x))
        h = torch.nn.functional.gelu(h)
        return x + self.fc2(h)


def _run(model, x, monkeypatch, perturb=None):
    if perturb:
        monkeypatch.setenv("BRAZE_TEST_PERTURB", perturb)
    torch._dynamo.reset()
    before = len(braze.accuracy_reports())
    divergences = braze.counters()["accuracy_divergences"]
    f = torch.compile(model, backend="braze", options={"accuracy": True})
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = f(x)
    reports = braze.accuracy_reports()[before:]
    assert braze.counters()["accuracy_divergences"] - divergences == len(reports)
    return out, reports, [str(w.message) for w in caught if "braze accuracy" in str(w.message)]


def test_a_planted_wrong_value_is_named(monkeypatch):
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(4, 16, 64)
    out, reports, said = _run(model, x, monkeypatch, perturb="gelu")
    assert len(reports) == 1 and len(said) == 1
    r = reports[0]
    assert r["node"] == "gelu" and r["op"] == "aten.gelu.default"
    assert "test_accuracy.py" in r["source"] and "gelu(h)" in r["source"]
    assert abs(r["braze"] - r["float64"] - 1 / 64) < 1e-4
    assert abs(r["eager"] - r["float64"]) < 1e-5
    assert r["kernel"].startswith("kernel") and "0.015625f" in r["code"]
    assert "gelu" in said[0] and r["kernel"] in said[0]


def test_a_planted_value_in_the_last_node_is_named_too(monkeypatch):
    torch.manual_seed(1)
    model = Block().eval()
    _, reports, _ = _run(model, torch.randn(2, 8, 64), monkeypatch, perturb="add")
    assert len(reports) == 1 and reports[0]["node"] == "add"


def test_a_correct_model_gives_no_report(monkeypatch):
    torch.manual_seed(2)
    model = torch.nn.Sequential(Block(), Block()).eval()
    x = torch.randn(4, 16, 64)
    out, reports, said = _run(model, x, monkeypatch)
    assert reports == [] and said == []
    torch.testing.assert_close(out, model(x).detach(), rtol=1e-4, atol=1e-4)


def test_a_correct_half_precision_model_gives_no_report(monkeypatch):
    torch.manual_seed(3)
    model = Block().eval().to(torch.bfloat16)
    _, reports, _ = _run(model, torch.randn(4, 16, 64, dtype=torch.bfloat16), monkeypatch)
    assert reports == []


def test_a_correct_convolutional_model_gives_no_report(monkeypatch):
    torch.manual_seed(4)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 10)).eval()
    _, reports, _ = _run(model, torch.randn(2, 3, 16, 16), monkeypatch)
    assert reports == []
