"""Whole models built offline from transformers configs (random weights): each compiles as one
braze graph with nothing falling back, and matches eager."""
import warnings

import pytest
import torch
import transformers

import braze

warnings.filterwarnings("ignore")


def gpt2():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2Model(cfg)


def bert():
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                  intermediate_size=128, vocab_size=128,
                                  max_position_embeddings=64)
    return transformers.BertModel(cfg)


def llama():
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=128, vocab_size=128,
                                   max_position_embeddings=64)
    return transformers.LlamaModel(cfg)


# On CUDA, AOTAutograd keeps attention as one of PyTorch's fused kernels
# (_scaled_dot_product_{flash,efficient,cudnn}_attention), which braze leaves to eager PyTorch:
# the model compiles as partitions around them, and nothing else may fall back.
_CUDA_ATTENTION = {f"aten._scaled_dot_product_{kind}_attention.default"
                   for kind in ("flash", "efficient", "cudnn")}


@pytest.mark.parametrize("make", [gpt2, bert, llama], ids=["gpt2", "bert", "llama"])
def test_model_is_one_graph_and_matches(make, device):
    torch.manual_seed(0)
    model = make().eval()
    ids = torch.randint(0, 128, (2, 16))
    before, ops_before = braze.counters(), braze.fallback_ops_by_op()
    with torch.no_grad():
        want = model(ids).last_hidden_state
        got, code = braze.run_and_get_code(torch.compile(model, backend="braze"), ids)
    torch.testing.assert_close(got.last_hidden_state, want, rtol=1e-4, atol=1e-4)
    after = braze.counters()
    assert after["fallback_graphs"] == before["fallback_graphs"]
    fell_back = {op for op, n in braze.fallback_ops_by_op().items() if n != ops_before.get(op, 0)}
    if device == "cpu":
        assert len(code) == 1
        assert not fell_back
    else:
        assert fell_back <= _CUDA_ATTENTION
        assert after["graphs"] - before["graphs"] == 1
