"""The model zoo: real architectures built offline from transformers configs with random weights at
small sizes (2 layers, hidden <= 256, sequences of 32-64 tokens, 64x64 images), and the check that
runs each one under torch.compile(backend="braze") against eager.

Used by tests/python/test_model_zoo.py (a short CPU selection in `make test`) and by
`python tests/python/zoo.py` (the whole zoo, a table per device: `make zoo`).

Every entry builds (model, keyword inputs, outputs), where outputs(result) picks the tensors to
compare. Inference entries run under torch.no_grad(); training entries run forward + a loss +
backward and compare the loss and every parameter's gradient.
"""
import argparse
import dataclasses
import json
import math
import sys
import time
import warnings

import torch

SEQ = 32
BATCH = 2
VOCAB = 256


def _transformers():
    import transformers
    transformers.logging.set_verbosity_error()
    return transformers


def _ids(vocab=VOCAB, seq=SEQ):
    return torch.randint(0, vocab, (BATCH, seq))


def _hidden(result):
    return [result.last_hidden_state]


def _logits(result):
    return [result.logits]


# ---- decoders ----------------------------------------------------------------------------------
def _decoder_common(**extra):
    return dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                intermediate_size=256, vocab_size=VOCAB, max_position_embeddings=128, **extra)


def gpt2():
    t = _transformers()
    cfg = t.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=VOCAB, n_positions=128,
                       bos_token_id=0, eos_token_id=0)
    return t.GPT2LMHeadModel(cfg), {"input_ids": _ids()}, _logits


def llama():
    t = _transformers()
    cfg = t.LlamaConfig(num_key_value_heads=2, **_decoder_common())
    return t.LlamaForCausalLM(cfg), {"input_ids": _ids()}, _logits


def opt():
    t = _transformers()
    cfg = t.OPTConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, ffn_dim=256,
                      vocab_size=VOCAB, max_position_embeddings=128, word_embed_proj_dim=128)
    return t.OPTForCausalLM(cfg), {"input_ids": _ids()}, _logits


def phi3():
    t = _transformers()
    cfg = t.Phi3Config(num_key_value_heads=2, pad_token_id=0, **_decoder_common())
    return t.Phi3ForCausalLM(cfg), {"input_ids": _ids()}, _logits


def gemma2():
    t = _transformers()
    cfg = t.Gemma2Config(num_key_value_heads=2, head_dim=32, sliding_window=16,
                         **_decoder_common())
    return t.Gemma2ForCausalLM(cfg), {"input_ids": _ids()}, _logits


def gpt_neox():
    t = _transformers()
    cfg = t.GPTNeoXConfig(**_decoder_common())
    return t.GPTNeoXForCausalLM(cfg), {"input_ids": _ids()}, _logits


def falcon():
    t = _transformers()
    cfg = t.FalconConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                         vocab_size=VOCAB, new_decoder_architecture=False, multi_query=True)
    return t.FalconForCausalLM(cfg), {"input_ids": _ids()}, _logits


def mixtral():
    t = _transformers()
    cfg = t.MixtralConfig(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                          **_decoder_common())
    return t.MixtralForCausalLM(cfg), {"input_ids": _ids()}, _logits


def qwen2_moe():
    """A mixture of experts with a shared expert behind a sigmoid gate, and a softmax router."""
    t = _transformers()
    cfg = t.Qwen2MoeConfig(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                           moe_intermediate_size=64, shared_expert_intermediate_size=128,
                           **_decoder_common())
    return t.Qwen2MoeForCausalLM(cfg), {"input_ids": _ids()}, _logits


# ---- encoders ----------------------------------------------------------------------------------
def _encoder_common():
    return dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                intermediate_size=256, vocab_size=VOCAB, max_position_embeddings=128)


def bert():
    t = _transformers()
    return t.BertModel(t.BertConfig(**_encoder_common())), {"input_ids": _ids()}, _hidden


def roberta():
    t = _transformers()
    cfg = t.RobertaConfig(pad_token_id=1, **_encoder_common())
    return t.RobertaModel(cfg), {"input_ids": torch.randint(2, VOCAB, (BATCH, SEQ))}, _hidden


def electra():
    t = _transformers()
    cfg = t.ElectraConfig(embedding_size=64, **_encoder_common())
    return t.ElectraModel(cfg), {"input_ids": _ids()}, _hidden


# ---- encoder-decoder ---------------------------------------------------------------------------
def whisper():
    t = _transformers()
    cfg = t.WhisperConfig(vocab_size=VOCAB, num_mel_bins=16, encoder_layers=2, decoder_layers=2,
                          encoder_attention_heads=4, decoder_attention_heads=4, d_model=128,
                          encoder_ffn_dim=256, decoder_ffn_dim=256, max_source_positions=32,
                          max_target_positions=64, pad_token_id=0, bos_token_id=1,
                          eos_token_id=2, decoder_start_token_id=1)
    model = t.WhisperModel(cfg)
    mel = torch.randn(BATCH, 16, 64)  # log-mel frames: 2 x max_source_positions
    return model, {"input_features": mel, "decoder_input_ids": _ids(seq=16)}, _hidden


# ---- vision ------------------------------------------------------------------------------------
def _image(channels=3, size=64):
    return torch.randn(BATCH, channels, size, size)


def swin():
    t = _transformers()
    cfg = t.SwinConfig(image_size=64, patch_size=4, embed_dim=32, depths=[1, 1],
                       num_heads=[2, 4], window_size=4)
    return t.SwinModel(cfg), {"pixel_values": _image()}, _hidden


def deit():
    t = _transformers()
    cfg = t.DeiTConfig(image_size=64, patch_size=8, num_hidden_layers=2, hidden_size=128,
                       num_attention_heads=4, intermediate_size=256)
    return t.DeiTModel(cfg), {"pixel_values": _image()}, _hidden


def segformer():
    t = _transformers()
    cfg = t.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                            hidden_sizes=[32, 64], num_attention_heads=[1, 2],
                            patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2])
    return t.SegformerModel(cfg), {"pixel_values": _image()}, _hidden


def _lively(model):
    """Weights that keep a deep CNN's activations of order one (the configs' small normal init
    makes them vanish after a few layers, and a comparison would check nothing), with batch-norm
    statistics that are not the identity."""
    g = torch.Generator().manual_seed(1)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device="cpu")

    def rand(*shape):
        return torch.rand(*shape, generator=g, device="cpu")
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Conv2d):
                fan_in = m.weight[0].numel()
                m.weight.copy_(randn(m.weight.shape) * (2.0 / fan_in) ** 0.5)
            elif isinstance(m, torch.nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(randn(n) * 0.1)
                m.running_var.copy_(rand(n) + 0.5)
                m.weight.copy_(rand(n) + 0.5)
                m.bias.copy_(randn(n) * 0.1)
    return model


def mobilenet_v2():
    t = _transformers()
    cfg = t.MobileNetV2Config(image_size=64, depth_multiplier=0.35)
    return _lively(t.MobileNetV2Model(cfg)), {"pixel_values": _image()}, _hidden


def resnet():
    t = _transformers()
    cfg = t.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                         layer_type="basic")
    return _lively(t.ResNetModel(cfg)), {"pixel_values": _image()}, _hidden


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    build: object
    kwargs: tuple = ()  # extra keyword arguments of the forward call
    train: bool = False

    def call_kwargs(self):
        return dict(self.kwargs)


def _entries():
    out = []
    for name, fn in [("gpt2", gpt2), ("llama", llama), ("opt", opt), ("phi3", phi3),
                     ("gemma2", gemma2), ("gpt_neox", gpt_neox), ("falcon", falcon),
                     ("mixtral", mixtral), ("qwen2_moe", qwen2_moe)]:
        out.append(Entry(name, fn))
        out.append(Entry(f"{name}-nocache", fn, (("use_cache", False),)))
    for name, fn in [("bert", bert), ("roberta", roberta), ("electra", electra),
                     ("whisper", whisper), ("swin", swin), ("deit", deit),
                     ("segformer", segformer), ("mobilenet_v2", mobilenet_v2),
                     ("resnet", resnet)]:
        out.append(Entry(name, fn))
    for name, fn in [("gpt2", gpt2), ("bert", bert), ("resnet", resnet),
                     ("mobilenet_v2", mobilenet_v2), ("llama", llama), ("deit", deit)]:
        out.append(Entry(f"{name}-train", fn, train=True))
    return out


ENTRIES = {e.name: e for e in _entries()}

# Tolerances: float32 (the CPU) against eager; bfloat16 (CUDA, the whole model in bf16) as the
# absolute slack over twice eager's own error against float32 (see _compare).
TOLERANCE = {torch.float32: dict(rtol=2e-3, atol=2e-3), torch.bfloat16: dict(rtol=0, atol=2e-2)}


def _dtype_for(device):
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def _loss(out):
    """A scalar from a model's first output that depends on every element."""
    x = out[0].float()
    return (x * x).mean() + x.mean()


@dataclasses.dataclass
class Report:
    model: str
    device: str
    ok: bool = False
    graphs: int = 0
    partitions: int = 0
    fallback_ops: dict = dataclasses.field(default_factory=dict)
    fallback_graphs: int = 0
    recompiles: int = 0
    max_error: float = float("nan")
    error: str = ""
    seconds: float = 0.0


def _max_error(got, want):
    worst = 0.0
    for g, w in _paired(got, want):
        d = (g.double() - w.double()).abs()
        worst = max(worst, float(d.max()) if d.numel() else 0.0)
    return worst


def _run(entry, model, inputs, pick, fn):
    kwargs = entry.call_kwargs()
    if not entry.train:
        with torch.no_grad():
            return [o.detach() for o in pick(fn(**inputs, **kwargs))]
    model.zero_grad(set_to_none=True)
    loss = _loss(pick(fn(**inputs, **kwargs)))
    loss.backward()
    grads = [p.grad.detach().clone() if p.grad is not None else None
             for p in model.parameters()]
    return [loss.detach()] + grads


def _paired(got, want):
    """(got, want) pairs; a parameter that the loss does not reach has no gradient in eager and
    a zero one through AOTAutograd (as with every torch.compile backend)."""
    for g, w in zip(got, want):
        if g is None and w is None:
            continue
        yield (torch.zeros_like(w) if g is None else g), (torch.zeros_like(g) if w is None else w)


def _compare(got, want, truth, dtype):
    """Raises AssertionError unless `got` (braze) matches `want` (eager, same dtype). In float32
    they must be close; in half precision, braze's error against the float32 `truth` may be at
    most twice eager's own (plus a small absolute slack): as accurate as eager, whatever order
    the kernels round in."""
    if len(got) != len(want):
        raise AssertionError(f"{len(got)} results where eager gives {len(want)}")
    if truth is None:
        for g, w in _paired(got, want):
            torch.testing.assert_close(g.float(), w.float(), **TOLERANCE[dtype])
        return
    ours = _max_error(got, truth)
    eagers = _max_error(want, truth)
    if not ours <= 2 * eagers + TOLERANCE[dtype]["atol"]:
        raise AssertionError(f"error against float32 {ours:.3g}, eager's own {eagers:.3g}")


def check(name, device="cpu", calls=3):
    """Runs zoo entry `name` on `device` compiled by braze `calls` times and compares each call
    with eager. Returns a Report; never raises for a model failure (the report says it)."""
    import braze
    entry = ENTRIES[name]
    rep = Report(name, str(device))
    start = time.perf_counter()
    torch._dynamo.reset()
    try:
        torch.manual_seed(0)
        model, inputs, pick = entry.build()
        dtype = _dtype_for(device)
        model = model.to(device=device)
        model.train(False)  # dropout off even in the training entries: results are comparable
        inputs = {k: x.to(device) for k, x in inputs.items()}
        truth = None
        if dtype != torch.float32:
            truth = [None if x is None else x.double()
                     for x in _run(entry, model, inputs, pick, model)]
            model = model.to(dtype=dtype)
            inputs = {k: x.to(dtype) if x.is_floating_point() else x for k, x in inputs.items()}
        want = _run(entry, model, inputs, pick, model)
        before = braze.counters()
        ops_before = braze.fallback_ops_by_op()
        compiled = torch.compile(model, backend="braze")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            errors = []
            for _ in range(calls):
                got = _run(entry, model, inputs, pick, compiled)
                _compare(got, want, truth, dtype)
                errors.append(_max_error(got, want))
        after = braze.counters()
        rep.max_error = max(errors)
        for key in ("graphs", "partitions", "fallback_graphs", "recompiles"):
            setattr(rep, key, after[key] - before[key])
        rep.fallback_ops = {op: n - ops_before.get(op, 0)
                            for op, n in braze.fallback_ops_by_op().items()
                            if n != ops_before.get(op, 0)}
        rep.ok = rep.fallback_graphs == 0
        if not rep.ok:
            said = [str(w.message) for w in caught if "braze" in str(w.message)]
            rep.error = (f"{rep.fallback_graphs} graph calls ran in eager"
                         + (f" ({said[0][:300]})" if said else ""))
    except Exception as e:  # the report names it
        rep.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    rep.seconds = time.perf_counter() - start
    return rep


def format_table(reports):
    lines = ["| model | device | ok | graphs | partitions | fallback ops | recompiles | max error |",
             "|---|---|---|---:|---:|---|---:|---:|"]
    for r in reports:
        ops = ", ".join(f"{k} ×{v}" for k, v in sorted(r.fallback_ops.items())) or "—"
        ok = "ok" if r.ok else f"FAIL: {r.error}"
        lines.append(f"| {r.model} | {r.device} | {ok} | {r.graphs} | {r.partitions} | {ops} | "
                     f"{r.recompiles} | {r.max_error:.2e} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", default="", help="comma-separated names; default: all")
    parser.add_argument("--json", help="write the reports here")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(__import__("os").environ.get("OMP_NUM_THREADS", "2")))
    names = [n for n in args.models.split(",") if n] or list(ENTRIES)
    reports = []
    for n in names:
        r = check(n, args.device)
        print(f"{n}: {'ok' if r.ok else r.error} ({r.seconds:.1f} s)", file=sys.stderr, flush=True)
        reports.append(r)
    print(format_table(reports))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dataclasses.asdict(r) for r in reports], f, indent=1,
                      default=lambda x: None if isinstance(x, float) and math.isnan(x) else x)
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
