"""The accuracy checker (BRAZE_ACCURACY, Options(accuracy=True)): a planted wrong value in a
middle kernel is found and named with its node, op, source line, worst element and kernel; a
correct model gives no report."""
import warnings

import pytest
import torch

import braze
from _device import braze_opt

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
    # in the partition's own compile, GELU's value is stored by a kernel of its own
    assert r["partition_kernel"].startswith("kernel") and r["partition_kernel_via"] is None
    assert "gelu" in said[0] and r["kernel"] in said[0]
    assert f"in the partition's own: {r['partition_kernel']})" in said[0]


class ExpSum(torch.nn.Module):
    def forward(self, x):
        return (x.exp() * 2).sum(-1) + 1


def test_a_planted_value_that_is_not_stored_names_the_kernel_of_its_reader(monkeypatch):
    """exp(x) * 2 is computed inside the sum's kernel (never stored): the checker names that
    kernel of the partition's own compile, and the reader it is fused into."""
    torch.manual_seed(4)
    _, reports, said = _run(ExpSum().eval(), torch.randn(4, 16, 64), monkeypatch, perturb="exp")
    assert len(reports) == 1 and reports[0]["node"] == "exp"
    r = reports[0]
    assert r["partition_kernel"] == "kernel0" and r["partition_kernel_via"].startswith("sum")
    assert f"kernel0, fused into its reader {r['partition_kernel_via']} there" in said[0]


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


def test_minify_writes_a_small_reproducer_that_braze_opt_runs(monkeypatch, tmp_path):
    import os
    import subprocess
    monkeypatch.setenv("BRAZE_ACCURACY", "minify")
    monkeypatch.setenv("BRAZE_REPRO_DIR", str(tmp_path))
    torch.manual_seed(5)
    model = Block().eval()
    _, reports, _ = _run(model, torch.randn(2, 8, 64), monkeypatch, perturb="gelu")
    folder = reports[0]["reproducer"]
    assert folder and folder.startswith(str(tmp_path))
    text = open(os.path.join(folder, "graph.txt")).read()
    body = [line for line in text.splitlines() if line.startswith("  %")]
    assert len(body) <= 3 and "gelu(" in text
    run = subprocess.run([braze_opt(), os.path.join(folder, "graph.txt"),
                          "--run=" + os.path.join(folder, "tensors.safetensors")],
                         capture_output=True, text=True)
    assert run.returncode == 3 and "DIVERGES" in run.stdout, run.stdout + run.stderr
    # Without the planted add, the same graph and tensors agree.
    fixed = tmp_path / "fixed.txt"
    fixed.write_text(text.replace("return %gelu_2", "return %gelu"))
    run = subprocess.run([braze_opt(), str(fixed),
                          "--run=" + os.path.join(folder, "tensors.safetensors")],
                         capture_output=True, text=True)
    assert run.returncode == 0 and "ok" in run.stdout, run.stdout + run.stderr


def test_braze_opt_run_names_a_missing_input_and_a_bad_file(tmp_path):
    import subprocess
    graph = tmp_path / "g.txt"
    graph.write_text("graph(%x: f32[3]) {\n  %y = neg(%x) : f32[3]\n  return %y\n}\n")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    run = subprocess.run([braze_opt(), str(graph), f"--run={bad}"], capture_output=True,
                         text=True)
    assert run.returncode == 1 and "malformed safetensors header" in run.stderr
    import struct
    for header, said in ((b'{"x":{"dtype":"F32","shape":[99999999999999999999],'
                          b'"data_offsets":[0,4]}}', "an integer out of range"),
                         (b'{"x":{"dtype":"F32","shape":[4294967296,4294967296],'
                          b'"data_offsets":[0,4]}}', "larger than any file"),
                         (b'{"x":{"dtype":"F99","shape":[1],"data_offsets":[0,4]}}',
                          "unknown safetensors dtype")):
        bad.write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))
        run = subprocess.run([braze_opt(), str(graph), f"--run={bad}"], capture_output=True,
                             text=True)
        assert run.returncode == 1 and said in run.stderr, run.stderr
    from braze.package import _write_safetensors
    empty = tmp_path / "empty.safetensors"
    _write_safetensors(str(empty), [("other", torch.ones(3))])
    run = subprocess.run([braze_opt(), str(graph), f"--run={empty}"], capture_output=True,
                         text=True)
    assert run.returncode == 1 and "no tensor for input 'x'" in run.stderr
    good = tmp_path / "good.safetensors"
    _write_safetensors(str(good), [("x", torch.tensor([1.0, -2.0, 3.0])),
                                   ("expected:0", torch.tensor([-1.0, 2.0, -3.0]))])
    run = subprocess.run([braze_opt(), str(graph), f"--run={good}"], capture_output=True,
                         text=True)
    assert run.returncode == 0 and "output 0: [3]: ok" in run.stdout


def test_braze_log_accuracy_prints_the_report_with_its_kernel(monkeypatch, capfd):
    monkeypatch.setenv("BRAZE_LOG", "accuracy")
    torch.manual_seed(6)
    _, reports, _ = _run(Block().eval(), torch.randn(2, 8, 64), monkeypatch, perturb="gelu")
    err = capfd.readouterr().err
    assert len(reports) == 1 and "===== braze: accuracy =====" in err
    assert "0.015625f" in err  # the kernel's code follows the report
