"""Whole models on the GPU: eager PyTorch, TorchInductor and braze in one process.

    python benchmarks/gpu_models.py                        # every model, every backend
    python benchmarks/gpu_models.py --only gpt2,bert --backends eager,braze --calls 10
    python benchmarks/gpu_models.py --json models.json

Models (names for --only; random weights, built offline from configs):
  gpt2        GPT2LMHeadModel(GPT2Config()), ids 8×512, bf16, logits
  bert        BertModel(BertConfig()) (BERT-base), ids 16×256, bf16
  llama       LLaMA-style: 8 layers, hidden 1024, 16 heads (4 KV heads), ids 4×512, bf16
  resnet50    torchvision resnet50, batch 32, 224×224, f16, channels-last
  gpt2_train  a GPT-2 6-layer training step (forward, loss, backward), ids 4×256, f32
  bert_train  a BERT-base masked-LM training step, ids 8×256, f32
  resnet50_train  a torchvision resnet50 training step (cross-entropy), batch 32, 224×224, f32,
              channels-last, train-mode batch norm
  llama_train a LLaMA-style decoder training step under bf16 autocast: 6 layers, hidden 1024,
              16 heads (4 KV heads), ids 4×512, f32 parameters
  vit_train   a ViT-B/16 training step (torchvision: patch convolution, 12 layers) under bf16
              autocast, batch 32, 224×224
  moe         Mixtral-style mixture of experts: 4 layers, hidden 1024, 16 heads (4 KV heads),
              8 experts of MLP 2816, top 2, ids 4×512, bf16 (greedy routing flips on near-ties
              in bf16 for every backend: compare rel error with eager's noise)
  attention   softmax(q@kᵀ/√d)@v, 8×16×1024×64, bf16
  decoder_a   LLaMA-family decoder at LLM size: 8 layers, hidden 2048, 32 heads (8 KV heads,
              head dim 64), ids 4×1024, bf16, use_cache=False, the causal mask built by
              transformers in the forward
  decoder_b   the same family: 8 layers, hidden 2560, 20 heads (4 KV heads, head dim 128)

With --decode, generation instead (`model.generate`, greedy, --new-tokens after a --prompt
token prompt, model.forward compiled; a LLaMA-style model, 12 layers, hidden 2048, 32 heads, 8
KV heads): each backend with the static cache (cache_implementation="static") and with the
dynamic cache, at batch 1 and 8, in ms per generated token (the wall time of a whole generate
divided by its new tokens, median of --repeats, backends interleaved). Backends there: eager,
inductor, inductor_ro, braze, braze_nocg compile model.forward and call generate() with
disable_compile=True; hf_inductor and hf_braze (static cache only) leave the forward alone and
let generate() compile it the way transformers does on CUDA with a static cache,
CompileConfig(backend=...) in its default mode "reduce-overhead". Without disable_compile,
"eager" with a static cache would be hf_inductor. Correctness: the logits
of the prompt's forward (generate's first scores) against eager's; greedy tokens diverge on
random weights in bf16, for Inductor too. braze's counters over its generates: graphs,
fallback ops, CUDA-graph replays against forward calls.

For each model and backend: every one of --calls calls is compared with eager (max abs error,
and relative to eager's largest magnitude; training compares the loss and every gradient),
braze.counters() deltas over them (fallback_graphs must stay 0), the compile time (first call
minus one eager call, cold caches), GPU time (CUDA events around each call, median of --repeats
samples, backends interleaved within every repeat) and peak memory during one call.
Backends: eager, inductor (default mode), inductor_ro (mode="reduce-overhead"), braze (which
replays static graphs as CUDA graphs by default), braze_nocg (braze without CUDA graphs), and
inductor_ma and braze_ma (mode="max-autotune": Inductor's autotuning with its CUDA graphs, and
braze's autotuner, 5 s a graph, with its CUDA graphs), and braze~PASS+PASS or
braze_nocg~PASS+PASS (braze without those graph passes: Options(disabled_passes=...), to see
what a pass gains or costs).
Peak memory is max_memory_allocated() during one call over memory_allocated() before it, once
the outputs of the call before are released (training: the gradients, set to None): counting
them in the base would credit a backend whose gradients take more memory, as the step frees
them. Memory a backend holds between calls (workspaces, a capture's pool) is not counted. The
allocator's cache is emptied first: a cached block too large for a request but too small to
split is handed out, and counted, whole, so the peak would depend on the backends before.
The exit status is 1 when braze raised, ran a graph in eager, or differs from eager beyond the
tolerance (relative error 5e-2 in bf16/f16, 1e-3 in f32, plus twice eager's own difference
between two calls, or from a call without TF32, whichever is larger: nondeterministic backward
kernels make eager differ from itself, and TF32 convolutions from f32). The moe model is
compared with a float32 run of itself instead, eager included: its greedy routing flips on
near-ties in bf16, differently in every backend, so a backend is within tolerance where its
error is at most twice eager's (or the bf16 tolerance).
"""
import argparse
import copy
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import warnings

P = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
P.add_argument("--only", default="", help="comma-separated model names (default: all)")
P.add_argument("--backends", default="eager,inductor,inductor_ro,braze_nocg,braze")
P.add_argument("--calls", type=int, default=10, help="checked calls per compiled backend")
P.add_argument("--repeats", type=int, default=20, help="timed samples per backend")
P.add_argument("--json", help="write every number here")
P.add_argument("--warm-cache", action="store_true", help="keep the usual on-disk caches")
P.add_argument("--decode", action="store_true", help="time generate() (see above)")
P.add_argument("--batches", default="1,8", help="--decode: batch sizes")
P.add_argument("--caches", default="static,dynamic", help="--decode: static, dynamic or both")
P.add_argument("--prompt", type=int, default=128, help="--decode: prompt tokens")
P.add_argument("--new-tokens", type=int, default=64, help="--decode: generated tokens")
ARGS = P.parse_args()

if not ARGS.warm_cache:
    _TMP = tempfile.mkdtemp(prefix="braze-gpu-models-")
    os.environ["BRAZE_CACHE_DIR"] = os.path.join(_TMP, "braze")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_TMP, "inductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(_TMP, "triton")
    # The driver's compute cache, which NVRTC 13 uses as well: on an H200, GPT-2's NVRTC took
    # 0.46 s in a process with an empty one and 0.22 s in the next process on the same one.
    os.environ["CUDA_CACHE_PATH"] = os.path.join(_TMP, "cuda")

import torch  # noqa: E402

import braze  # noqa: E402

DEV = torch.device("cuda")
MODELS = ("gpt2", "bert", "llama", "resnet50", "gpt2_train", "bert_train", "resnet50_train",
          "llama_train", "vit_train", "moe", "attention", "sdpa", "decoder_a", "decoder_b")
REL_TOL = {torch.bfloat16: 5e-2, torch.float16: 5e-2, torch.float32: 1e-3}
# Models compared with a float32 run of themselves rather than with eager: a mixture of experts'
# greedy routing flips on near-ties in bf16, differently in every backend. A backend is ok
# where its error against the f32 run is at most twice eager's (or REL_TOL).
F32_REFERENCE = {"moe"}


def _transformers():
    import transformers
    transformers.logging.set_verbosity_error()
    return transformers


def build(name):
    """(model, call, dtype, train): call(f) runs the model through f (the model itself or its
    compiled form) and returns the tensors to compare."""
    bf = torch.bfloat16
    torch.manual_seed(0)
    if name == "gpt2":
        t = _transformers()
        m = t.GPT2LMHeadModel(t.GPT2Config()).to(DEV, bf).eval()
        ids = torch.randint(0, 50257, (8, 512), device=DEV)
        return m, (lambda f: [f(ids).logits]), bf, False
    if name == "bert":
        t = _transformers()
        m = t.BertModel(t.BertConfig()).to(DEV, bf).eval()
        ids = torch.randint(0, 30522, (16, 256), device=DEV)
        return m, (lambda f: [f(ids).last_hidden_state]), bf, False
    if name == "llama":
        t = _transformers()
        cfg = t.LlamaConfig(num_hidden_layers=8, hidden_size=1024, num_attention_heads=16,
                            num_key_value_heads=4, intermediate_size=2816, vocab_size=32000,
                            max_position_embeddings=1024)
        m = t.LlamaModel(cfg).to(DEV, bf).eval()
        ids = torch.randint(0, 32000, (4, 512), device=DEV)
        return m, (lambda f: [f(ids).last_hidden_state]), bf, False
    if name == "moe":
        t = _transformers()
        cfg = t.MixtralConfig(num_hidden_layers=4, hidden_size=1024, num_attention_heads=16,
                              num_key_value_heads=4, intermediate_size=2816, num_local_experts=8,
                              num_experts_per_tok=2, vocab_size=32000,
                              max_position_embeddings=1024)
        m = t.MixtralModel(cfg).to(DEV, bf).eval()
        ids = torch.randint(0, 32000, (4, 512), device=DEV)
        return m, (lambda f: [f(ids).last_hidden_state]), bf, False
    if name in ("decoder_a", "decoder_b"):
        t = _transformers()
        hidden, heads, kv = (2048, 32, 8) if name == "decoder_a" else (2560, 20, 4)
        cfg = t.LlamaConfig(num_hidden_layers=8, hidden_size=hidden, num_attention_heads=heads,
                            num_key_value_heads=kv, intermediate_size=hidden * 11 // 4,
                            vocab_size=32000, max_position_embeddings=4096)
        m = t.LlamaModel(cfg).to(DEV, bf).eval()
        ids = torch.randint(0, 32000, (4, 1024), device=DEV)
        return m, (lambda f: [f(ids, use_cache=False).last_hidden_state]), bf, False
    if name == "resnet50":
        import torchvision
        m = torchvision.models.resnet50().to(DEV, torch.float16).eval()
        m = m.to(memory_format=torch.channels_last)
        x = torch.randn(32, 3, 224, 224, device=DEV, dtype=torch.float16)
        x = x.contiguous(memory_format=torch.channels_last)
        return m, (lambda f: [f(x)]), torch.float16, False
    if name == "gpt2_train":
        t = _transformers()
        cfg = t.GPT2Config(n_layer=6, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        m = t.GPT2LMHeadModel(cfg).to(DEV).train()
        ids = torch.randint(0, 50257, (4, 256), device=DEV)
        return m, _train_step(m, lambda f: f(ids, labels=ids).loss), torch.float32, True
    if name == "bert_train":
        t = _transformers()
        m = t.BertForMaskedLM(t.BertConfig(hidden_dropout_prob=0.0,
                                           attention_probs_dropout_prob=0.0)).to(DEV).train()
        ids = torch.randint(0, 30522, (8, 256), device=DEV)
        return m, _train_step(m, lambda f: f(ids, labels=ids).loss), torch.float32, True
    if name == "resnet50_train":
        import torchvision
        m = torchvision.models.resnet50().to(DEV, memory_format=torch.channels_last).train()
        x = torch.randn(32, 3, 224, 224, device=DEV).contiguous(memory_format=torch.channels_last)
        labels = torch.randint(0, 1000, (32,), device=DEV)
        loss = torch.nn.functional.cross_entropy
        # Train-mode batch norm updates its running statistics in every call: the compared
        # gradients are those of the call, whatever the statistics were before it.
        return m, _train_step(m, lambda f: loss(f(x), labels)), torch.float32, True
    if name == "llama_train":
        t = _transformers()
        cfg = t.LlamaConfig(num_hidden_layers=6, hidden_size=1024, num_attention_heads=16,
                            num_key_value_heads=4, intermediate_size=2816, vocab_size=32000,
                            max_position_embeddings=1024)
        m = t.LlamaForCausalLM(cfg).to(DEV).train()
        ids = torch.randint(0, 32000, (4, 512), device=DEV)
        return m, _train_step(m, lambda f: f(ids, labels=ids).loss, bf), bf, True
    if name == "vit_train":
        import torchvision
        m = torchvision.models.vit_b_16(dropout=0.0, attention_dropout=0.0).to(DEV).train()
        x = torch.randn(32, 3, 224, 224, device=DEV)
        labels = torch.randint(0, 1000, (32,), device=DEV)
        loss = torch.nn.functional.cross_entropy
        return m, _train_step(m, lambda f: loss(f(x), labels), bf), bf, True
    if name == "attention":
        q, k, v = (torch.randn(8, 16, 1024, 64, device=DEV, dtype=bf) for _ in range(3))

        def attention(q, k, v):
            return torch.softmax(q @ k.transpose(-1, -2) / 8.0, -1) @ v
        return attention, (lambda f: [f(q, k, v)]), bf, False
    if name == "sdpa":  # the same attention through PyTorch's fused op
        q, k, v = (torch.randn(8, 16, 1024, 64, device=DEV, dtype=bf) for _ in range(3))

        def sdpa(q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return sdpa, (lambda f: [f(q, k, v)]), bf, False
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


def _train_step(m, loss_of, autocast=None):
    """call(f) for a training step of m: gradients cleared, loss_of(f) (under autocast to that
    dtype when given), backward; the loss and every gradient are compared."""
    def step(f):
        m.zero_grad(set_to_none=True)
        with torch.autocast("cuda", autocast, enabled=autocast is not None):
            loss = loss_of(f)
        loss.backward()
        return [loss.detach().float()] + [p.grad for p in m.parameters() if p.grad is not None]
    return step


def compiled(model, backend):
    torch._dynamo.reset()
    if "~" in backend and backend.startswith("braze"):  # braze~pass+pass: without those passes
        backend, passes = backend.split("~", 1)
        options = {"disabled_passes": tuple(passes.split("+"))}
        if backend == "braze_nocg":
            options["cuda_graphs"] = False
        elif backend != "braze":
            raise ValueError(f"unknown backend {backend!r} before '~'")
        return torch.compile(model, backend="braze", options=options)
    if backend == "eager":
        return model
    if backend == "inductor":
        return torch.compile(model)
    if backend == "inductor_ro":
        return torch.compile(model, mode="reduce-overhead")
    if backend == "braze":
        return torch.compile(model, backend="braze")
    if backend == "braze_nocg":
        return torch.compile(model, backend="braze", options={"cuda_graphs": False})
    if backend == "inductor_ma":
        return torch.compile(model, mode="max-autotune")
    if backend == "braze_ma":
        return torch.compile(model, backend="braze", mode="max-autotune")
    raise ValueError(f"unknown backend {backend!r}")


def errors(got, want):
    """(max abs error, max abs error / max |eager|, the position of the tensor with the largest
    error) over all compared tensors."""
    worst, scale, at = 0.0, 0.0, 0
    for i, (g, w) in enumerate(zip(got, want)):
        e = float((g.double() - w.double()).abs().max())
        worst, at = (e, i) if e > worst else (worst, at)
        scale = max(scale, float(w.double().abs().max()))
    return worst, worst / max(scale, 1e-30), at


def gpu_ms(call):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def braze_row(row, before, after, caught, ops_before=None):
    """braze's counters over a backend's calls (after - before), the ops it ran in eager (since
    ops_before, a fallback_ops_by_op()) and its warnings, into row; a graph run in eager fails
    the row."""
    for k in ("graphs", "partitions", "fallback_ops", "fallback_graphs", "recompiles",
              "cuda_graphs", "cuda_graph_replays", "cuda_graph_busy"):
        row[k] = after[k] - before[k]
    if ops_before is not None:
        row["fallback_by_op"] = {op: n - ops_before.get(op, 0)
                                 for op, n in braze.fallback_ops_by_op().items()
                                 if n != ops_before.get(op, 0)}
    row["ok"] = row["ok"] and row["fallback_graphs"] == 0
    row["warnings"] = sorted({str(w.message)[:200] for w in caught if "braze" in str(w.message)})


def run_model(name, backends):
    model, call, dtype, train = build(name)
    grad = torch.enable_grad() if train else torch.no_grad()
    rows = {}
    with grad:
        want = [w.detach().clone() for w in call(model)]
        # Eager's own run-to-run difference (atomics in cuDNN's and cuBLAS's backward kernels)
        # and its difference from a run without TF32 (which f32 convolutions use by default: a
        # ResNet's first weight gradient, a sum over 400k positions after batch norm, differs by
        # a third of the largest gradient): a backend may differ from eager by twice as much on
        # top of the tolerance.
        noise = errors([w.detach() for w in call(model)], want)[1]
        tf32 = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
        try:
            noise = max(noise, errors([w.detach() for w in call(model)], want)[1])
        finally:
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
        if name in F32_REFERENCE:
            wide = copy.deepcopy(model).float()
            ref = [w.detach().float() for w in call(wide)]
            del wide
            noise = errors(want, ref)[1]  # eager's own error against the f32 run
            want = ref
        torch.cuda.synchronize()
        eager_s = min(_wall(lambda: call(model)) for _ in range(3))
        fns = {}
        for b in backends:
            row = rows[b] = {"model": name, "backend": b}
            try:
                before, ops_before = braze.counters(), braze.fallback_ops_by_op()
                fn = compiled(model, b)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    first = _wall(lambda: call(fn))
                    row["compile_s"] = max(0.0, first - eager_s) if b != "eager" else 0.0
                    errs = []
                    for _ in range(ARGS.calls):
                        got = [g.detach().clone() for g in call(fn)]
                        if len(got) != len(want):
                            raise AssertionError(f"{len(got)} results, eager has {len(want)}")
                        errs.append(errors(got, want))
                after = braze.counters()
                worst = max(errs)
                row["max_abs_error"], row["rel_error"] = worst[0], max(e[1] for e in errs)
                row["worst_result"] = worst[2]
                row["eager_noise"] = noise
                row["ok"] = row["rel_error"] <= (max(REL_TOL[dtype], 2 * noise)
                                                 if name in F32_REFERENCE
                                                 else REL_TOL[dtype] + 2 * noise)
                if b.startswith("braze"):
                    braze_row(row, before, after, caught, ops_before)
                if train:
                    model.zero_grad(set_to_none=True)  # the step's first act
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                call(fn)
                torch.cuda.synchronize()
                row["peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
                fns[b] = fn
            except Exception as e:
                failed(row, e)
        for b, ms in medians(fns, lambda fn: gpu_ms(lambda: call(fn))).items():
            rows[b]["ms"] = ms
    return list(rows.values())


def failed(row, e):
    """Marks row failed with exception e (printed with its traceback)."""
    row["ok"] = False
    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    traceback.print_exc(file=sys.stderr)


def medians(fns, sample, errors=None):
    """{backend: the median of --repeats sample(fn)}, the backends interleaved in each repeat.
    With errors (a dict), a backend that raises while timed is dropped and its error kept
    there; without, the error propagates."""
    samples = {b: [] for b in fns}
    for _ in range(ARGS.repeats):
        for b, fn in fns.items():
            if b not in samples:
                continue
            try:
                samples[b].append(sample(fn))
            except Exception as e:
                if errors is None:
                    raise
                errors[b] = f"{type(e).__name__}: {e}"
                del samples[b]
    return {b: statistics.median(s) for b, s in samples.items()}


def _wall(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def table(rows):
    eager = {r["model"]: r.get("ms") for r in rows if r["backend"] == "eager"}
    out = ["| model | backend | ok | ms | × eager | compile s | peak MiB | rel error | "
           "partitions | fallback ops | fallback graphs | recompiles | cuda graphs |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ms = r.get("ms")
        speed = eager.get(r["model"]) / ms if ms and eager.get(r["model"]) else float("nan")
        ok = "ok" if r.get("ok") else ("FAIL " + r.get("error", ""))[:120]
        out.append(f"| {r['model']} | {r['backend']} | {ok} | {_f(ms, 3)} | {_f(speed, 2)} | "
                   f"{_f(r.get('compile_s'), 1)} | {_f(r.get('peak_mib'), 0)} | "
                   f"{_f(r.get('rel_error'), 4, 'e')} | {r.get('partitions', '')} | "
                   f"{r.get('fallback_ops', '')} | {r.get('fallback_graphs', '')} | "
                   f"{r.get('recompiles', '')} | {r.get('cuda_graphs', '')} |")
    return "\n".join(out)


def _f(x, digits, kind="f"):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.{digits}{kind}}"


def decode_model():
    t = _transformers()
    torch.manual_seed(0)
    cfg = t.LlamaConfig(num_hidden_layers=12, hidden_size=2048, num_attention_heads=32,
                        num_key_value_heads=8, intermediate_size=5632, vocab_size=32000,
                        max_position_embeddings=4096)
    return t.LlamaForCausalLM(cfg).to(DEV, torch.bfloat16).eval()


# generate() compiles the forward by itself on CUDA when the cache is static (transformers'
# auto-compile: torch.compile of the model's __call__ with its CompileConfig, mode
# "reduce-overhead" by default). The hf_* backends are that path with the backend named; the
# others set model.forward and pass disable_compile=True, so eager is eager and a compiled
# forward is not compiled again around it.
HF_BACKENDS = {"hf_inductor": "inductor", "hf_braze": "braze"}


class DecodeRunner:
    """One backend's generate(): its forward, its generate arguments, and for hf_* the
    compiled __call__ transformers made, restored before each call so that the backends can
    interleave without transformers compiling again."""

    def __init__(self, model, forward, kw, hf_backend=None):
        self.model, self.forward, self.kw = model, forward, dict(kw)
        if hf_backend is None:
            self.kw["disable_compile"] = True
        else:
            self.kw["compile_config"] = _transformers().CompileConfig(backend=hf_backend)
        self.state = None

    def __call__(self, ids):
        m = self.model
        m.forward = self.forward
        if self.state is not None:
            m._compiled_call, m._last_compile_config = self.state
        elif hasattr(m, "_compiled_call"):
            del m._compiled_call
        out = m.generate(ids, **self.kw)
        if "compile_config" in self.kw and hasattr(m, "_compiled_call"):
            self.state = (m._compiled_call, m._last_compile_config)
        return out


def run_decode(backends):
    """ms per token of generate() for each cache, batch and backend (see the docstring)."""
    model = decode_model()
    plain_forward = model.forward
    rows = []
    for cache in [c for c in ARGS.caches.split(",") if c]:
        if cache not in ("static", "dynamic"):
            raise SystemExit(f"--caches: unknown cache {cache!r} (known: static, dynamic)")
        # transformers never compiles a dynamic cache by itself.
        names = [b for b in backends if cache == "static" or b not in HF_BACKENDS]
        for batch in [int(b) for b in ARGS.batches.split(",") if b]:
            ids = torch.randint(0, 32000, (batch, ARGS.prompt), device=DEV)
            kw = dict(max_new_tokens=ARGS.new_tokens, min_new_tokens=ARGS.new_tokens,
                      do_sample=False, output_logits=True, return_dict_in_generate=True)
            if cache == "static":
                kw["cache_implementation"] = "static"
            with torch.no_grad():
                want = DecodeRunner(model, plain_forward, kw)(ids).logits[0].float()
                gens = {}
                for b in names:
                    row = {"model": f"decode_{cache}_b{batch}", "backend": b}
                    rows.append(row)
                    try:
                        torch._dynamo.reset()
                        if b in HF_BACKENDS:
                            run = DecodeRunner(model, plain_forward, kw, HF_BACKENDS[b])
                        else:
                            run = DecodeRunner(model, compiled(plain_forward, b), kw)
                        print(f"decode_{cache}_b{batch} {b}: compiling", file=sys.stderr,
                              flush=True)
                        before = braze.counters()
                        with warnings.catch_warnings(record=True) as caught:
                            warnings.simplefilter("always")
                            first = _wall(lambda: run(ids))
                            out = run(ids)
                        after = braze.counters()
                        got = out.logits[0].float()
                        row["rel_error"] = float((got - want).abs().max() / want.abs().max())
                        row["ok"] = row["rel_error"] <= REL_TOL[torch.bfloat16]
                        row["compile_s"] = first
                        if b.startswith("braze") or b == "hf_braze":
                            braze_row(row, before, after, caught)
                            row["fallback_by_op"] = braze.fallback_ops_by_op()
                        gens[b] = run
                    except Exception as e:
                        failed(row, e)

                def per_token(run):
                    return _wall(lambda: run(ids)) * 1e3 / ARGS.new_tokens
                timing_errors = {}
                ms = medians(gens, per_token, timing_errors)
                for row in rows[-len(names):]:
                    if row["backend"] in ms:
                        row["ms"] = ms[row["backend"]]
                    if row["backend"] in timing_errors:
                        row["ok"] = False
                        row["error"] = "while timed: " + timing_errors[row["backend"]]
            for row in rows[-len(names):]:  # as it goes: a long run cut short keeps these
                print(f"{row['model']} {row['backend']}: {_f(row.get('ms'), 3)} ms/token, "
                      f"rel_error {_f(row.get('rel_error'), 2, 'e')}, fallback_ops "
                      f"{row.get('fallback_ops', '')}, graphs {row.get('graphs', '')}, "
                      f"cuda_graph_replays {row.get('cuda_graph_replays', '')}"
                      f"{', error ' + row['error'][:120] if row.get('error') else ''}",
                      flush=True)
    model.forward = plain_forward
    return rows


def main():
    if ARGS.decode:
        backends = [b for b in ARGS.backends.split(",") if b]
        print(f"# {torch.cuda.get_device_name()} · torch {torch.__version__} · ms per token",
              flush=True)
        rows = run_decode(backends)
        print(table(rows))
        for r in rows:
            if r.get("fallback_by_op"):
                print(f"{r['model']} {r['backend']}: {r['fallback_by_op']}")
            if "cuda_graph_replays" in r:
                print(f"{r['model']} {r['backend']}: graphs {r['graphs']}, cuda_graph_replays "
                      f"{r['cuda_graph_replays']}")
        if ARGS.json:
            with open(ARGS.json, "w") as f:
                json.dump(rows, f, indent=1)
        return 1 if any(r["backend"].startswith("braze") and not r.get("ok") for r in rows) else 0
    names = [n for n in ARGS.only.split(",") if n] or list(MODELS)
    backends = [b for b in ARGS.backends.split(",") if b]
    print(f"# {torch.cuda.get_device_name()} · torch {torch.__version__}", flush=True)
    rows = []
    for n in names:
        t = time.perf_counter()
        rows += run_model(n, backends)
        print(f"{n}: {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
        torch.cuda.empty_cache()
    print(table(rows))
    for r in rows:
        if r.get("fallback_by_op"):
            print(f"{r['model']} {r['backend']} ran in eager: {r['fallback_by_op']}")
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump(rows, f, indent=1)
    if not ARGS.warm_cache:
        shutil.rmtree(_TMP, ignore_errors=True)
    bad = [r for r in rows if r["backend"].startswith("braze") and not r.get("ok")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
