"""PyTorch's minifier with braze: TORCHDYNAMO_REPRO_AFTER=dynamo at the accuracy level finds a
planted wrong answer in a braze graph and writes a launcher, and the launcher shrinks the graph
to the diverging op (repro.py). Each step runs in a process of its own, as a user runs them."""
import glob
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.cpu_only("the minifier's flow is the same Python on every device")

MODEL = textwrap.dedent("""
    import torch
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(16, 32)
            self.b = torch.nn.Linear(32, 8)
        def forward(self, x):
            h = torch.nn.functional.gelu(self.a(x))
            return self.b(h).relu()
    torch.manual_seed(0)
    f = torch.compile(Block(), backend="braze")
    print(float(f(torch.randn(4, 16)).sum()))
""")


def _env(**extra):
    env = dict(os.environ, BRAZE_TEST_PERTURB="gelu", TORCHDYNAMO_REPRO_FORWARD_ONLY="1",
               **extra)
    env.pop("BRAZE_STRICT", None)
    return env


def test_the_minifier_shrinks_a_braze_wrong_answer_to_its_op(tmp_path):
    (tmp_path / "model.py").write_text(MODEL)
    found = subprocess.run([sys.executable, "model.py"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=600,
                           env=_env(TORCHDYNAMO_REPRO_AFTER="dynamo", TORCHDYNAMO_REPRO_LEVEL="4"))
    assert "AccuracyError" in found.stderr, found.stderr[-3000:]
    launchers = glob.glob(str(tmp_path / "torch_compile_debug" / "*" / "minifier" /
                              "minifier_launcher.py"))
    assert len(launchers) == 1, found.stderr[-3000:]
    assert "backend='braze'" in open(launchers[0]).read()
    shrunk = subprocess.run([sys.executable, launchers[0]], cwd=tmp_path, capture_output=True,
                            text=True, timeout=600, env=_env())
    repro = tmp_path / "repro.py"
    assert repro.exists(), shrunk.stderr[-3000:]
    text = repro.read_text()
    forward = text[text.index("def forward"):text.index("mod = Repro()")]
    calls = [line for line in forward.splitlines() if "torch." in line]
    assert len(calls) == 1 and "gelu" in calls[0], forward  # the planted op alone
    assert "Writing checkpoint with" in shrunk.stderr
    # The repro still fails, and passes without the planted value.
    again = subprocess.run([sys.executable, str(repro)], cwd=tmp_path, capture_output=True,
                           text=True, timeout=600, env=_env())
    assert "AccuracyError" in again.stderr, again.stderr[-3000:]
    env = _env()
    env.pop("BRAZE_TEST_PERTURB")
    clean = subprocess.run([sys.executable, str(repro)], cwd=tmp_path, capture_output=True,
                           text=True, timeout=600, env=env)
    assert clean.returncode == 0 and "AccuracyError" not in clean.stderr, clean.stderr[-3000:]
