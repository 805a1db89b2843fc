"""Whole models for the CPU suite's models section (benchmarks/cpu_suite.py), built offline with
random weights: transformers models from their configs (no download), and a ResNet-18-shaped CNN.

Sizes are chosen so one eager float32 forward takes roughly 10-100 ms on 2 threads. Every builder
returns (forward function, input tuple); the function returns one tensor (the last hidden state
or the logits) so the suite can compare it with eager. Call them under torch.manual_seed: the
weights are drawn from the global generator.

This module imports torch at import time: import it after harness.prepare_process().
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, SEQ = 2, 128  # token ids for the transformers
IMAGE = (4, 3, 128, 128)  # the CNN's input


def _quiet_transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def _token_ids(vocab):
    return (torch.randint(0, vocab, (BATCH, SEQ)),)


# The configs keep transformers' defaults where the tests (tests/python/test_models.py) do, so the
# models run as a plain `model(ids)` call does, use_cache=True included: with use_cache=False,
# transformers 5 builds the causal mask through a multi-tensor aten.index that braze leaves to
# eager (4-5 fallback ops, 2 graphs for GPT-2 and LLaMA).


def _last_hidden_state(model):
    model.eval()

    def forward(ids):
        return model(ids).last_hidden_state

    return forward


def gpt2():
    t = _quiet_transformers()
    cfg = t.GPT2Config(n_layer=6, n_embd=384, n_head=6, vocab_size=8192, n_positions=SEQ,
                       bos_token_id=0, eos_token_id=0)
    return _last_hidden_state(t.GPT2Model(cfg)), _token_ids(cfg.vocab_size)


def bert():
    t = _quiet_transformers()
    cfg = t.BertConfig(num_hidden_layers=4, hidden_size=768, num_attention_heads=12,
                       intermediate_size=3072, vocab_size=8192, max_position_embeddings=SEQ)
    return _last_hidden_state(t.BertModel(cfg)), _token_ids(cfg.vocab_size)


def llama():
    t = _quiet_transformers()
    cfg = t.LlamaConfig(num_hidden_layers=4, hidden_size=512, num_attention_heads=8,
                        num_key_value_heads=4, intermediate_size=1408, vocab_size=8192,
                        max_position_embeddings=SEQ)
    return _last_hidden_state(t.LlamaModel(cfg)), _token_ids(cfg.vocab_size)


def mixtral():
    """A mixture of experts: LLaMA-style attention, 8 experts of which each token takes 2."""
    t = _quiet_transformers()
    cfg = t.MixtralConfig(num_hidden_layers=4, hidden_size=512, num_attention_heads=8,
                          num_key_value_heads=4, intermediate_size=1408, vocab_size=8192,
                          num_local_experts=8, num_experts_per_tok=2,
                          max_position_embeddings=SEQ)
    return _last_hidden_state(t.MixtralModel(cfg)), _token_ids(cfg.vocab_size)


class BasicBlock(nn.Module):
    """ResNet's basic block (the same as tests/python/test_nn.py's)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.down(x) if self.down is not None else x))


def resnet18_shaped(width=64, classes=1000):
    """ResNet-18's shape: 7×7 stem, max pool, four stages of two basic blocks (width, 2w, 4w, 8w
    channels), global average pool, linear head. Batch-norm statistics are random, not 0/1, so
    the normalization does real work."""
    layers = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
              nn.MaxPool2d(3, 2, 1)]
    cin = width
    for cout, stride in ((width, 1), (2 * width, 2), (4 * width, 2), (8 * width, 2)):
        layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    model = nn.Sequential(*layers).eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.normal_(0, 0.1)
    return model


def resnet18():
    model = resnet18_shaped()
    return model, (torch.randn(*IMAGE),)


def mobilenet_v2():
    """MobileNetV2 (transformers' MobileNetV2Model, width 1.0; depthwise 3×3 convolutions), random
    weights re-drawn He-normal (the config's small init makes the activations vanish), batch-norm
    statistics that are not 0/1; returns the last hidden state."""
    t = _quiet_transformers()
    model = t.MobileNetV2Model(t.MobileNetV2Config(image_size=IMAGE[-1])).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                m.weight.normal_(0, (2.0 / m.weight[0].numel()) ** 0.5)
            elif isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return _last_hidden_state(model), (torch.randn(*IMAGE),)


# name -> (description, builder, (rtol, atol) for the comparison with eager). Whole models sum
# thousands of products per output through many layers, so float32 results differ from eager's
# by more than one op's tolerance; these are the tolerances tests/python/test_models.py and
# test_nn.py use for the same architectures.
MODELS = {
    "gpt2": ("GPT-2 6 layers × 384, 6 heads, vocab 8192; ids 2×128", gpt2, (1e-4, 1e-4)),
    "bert": ("BERT 4 layers × 768, 12 heads; ids 2×128", bert, (1e-4, 1e-4)),
    "llama": ("LLaMA-style 4 layers × 512, 8 heads / 4 kv, MLP 1408; ids 2×128", llama, (1e-4, 1e-4)),
    "mixtral": ("Mixtral-style 4 layers × 512, 8 heads / 4 kv, 8 experts of MLP 1408, top 2; "
                "ids 2×128", mixtral, (1e-4, 1e-4)),
    "resnet18": ("ResNet-18-shaped CNN, 64 base channels; 4×3×128×128", resnet18, (1e-3, 1e-3)),
    "mobilenet_v2": ("MobileNetV2 (transformers), width 1.0; 4×3×128×128", mobilenet_v2,
                     (1e-3, 1e-3)),
}
