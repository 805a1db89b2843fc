"""A short selection of the model zoo (tests/python/zoo.py) on every device: each model matches
eager over three calls with no call of a compiled graph running in eager. The whole zoo runs
with `make zoo`."""
import pytest

import zoo

# One of each family: a decoder with and without its cache, a mixture of experts, an encoder,
# an encoder-decoder, a CNN, and a training step through attention.
SHORT = ["gpt2", "llama-nocache", "mixtral-nocache", "bert", "whisper", "resnet", "gpt2-train"]


@pytest.mark.parametrize("name", SHORT)
def test_zoo_model_matches_eager_and_never_falls_back(name, device):
    report = zoo.check(name, device)
    assert report.ok, f"{name} on {device}: {report.error}\n{zoo.format_table([report])}"
    assert report.fallback_graphs == 0 and report.partitions >= 1
