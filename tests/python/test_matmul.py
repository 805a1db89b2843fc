"""Matrix products: through BLAS (scipy-openblas64) and through braze's own loop nests."""
import functools

import pytest
import torch
import torch.nn.functional as F

import braze
from _device import eager

CASES = {
    "mm": (lambda a, b: a @ b, lambda: (torch.randn(33, 17), torch.randn(17, 9))),
    "mm_transposed_a": (lambda a, b: a.t() @ b, lambda: (torch.randn(17, 33), torch.randn(17, 9))),
    "linear_bias_gelu": (lambda x, w, b: F.gelu(F.linear(x, w, b)),
                         lambda: (torch.randn(8, 32), torch.randn(16, 32), torch.randn(16))),
    "bmm": (lambda a, b: torch.bmm(a, b), lambda: (torch.randn(3, 5, 7), torch.randn(3, 7, 4))),
    "matmul_broadcast": (lambda a, b: a @ b, lambda: (torch.randn(2, 3, 5, 7), torch.randn(7, 4))),
    "matvec": (lambda a, b: a @ b, lambda: (torch.randn(6, 7), torch.randn(7))),
    "vecmat": (lambda a, b: a @ b, lambda: (torch.randn(6), torch.randn(6, 7))),
    "addmm_scaled": (lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0),
                     lambda: (torch.randn(4, 5), torch.randn(4, 3), torch.randn(3, 5))),
    "f64": (lambda a, b: a @ b, lambda: (torch.randn(9, 4, dtype=torch.float64),
                                         torch.randn(4, 3, dtype=torch.float64))),
    "int64": (lambda a, b: a @ b, lambda: (torch.randint(-5, 5, (4, 6)), torch.randint(-5, 5, (6, 3)))),
    "mlp_two_layers": (lambda x, w1, w2: F.linear(torch.relu(F.linear(x, w1)), w2),
                       lambda: (torch.randn(16, 24), torch.randn(40, 24), torch.randn(8, 40))),
    # Products big enough to be split over the threads: in row blocks, in column blocks (few
    # rows), over a batch smaller than the thread count, and with transposed operands.
    "split_rows": (lambda a, b: a @ b, lambda: (torch.randn(203, 64), torch.randn(64, 37))),
    "split_columns_transposed": (lambda a, b: a.t() @ b.t(),
                                 lambda: (torch.randn(512, 3), torch.randn(301, 512))),
    "split_batch": (lambda a, b: torch.bmm(a, b.transpose(1, 2)),
                    lambda: (torch.randn(3, 45, 64), torch.randn(3, 50, 64))),
    "split_f64": (lambda a, b: a @ b, lambda: (torch.randn(129, 70, dtype=torch.float64),
                                               torch.randn(70, 61, dtype=torch.float64))),
}


@pytest.mark.parametrize("blas", [True, False])
@pytest.mark.parametrize("name", sorted(CASES))
def test_matmul_matches_eager(name, blas):
    fn, make = CASES[name]
    torch.manual_seed(0)
    args = make()
    before = braze.counters()["fallback_ops"]
    compiled = torch.compile(fn, backend=lambda gm, ex: braze.braze_backend(
        gm, ex, braze.Options(blas=blas)), dynamic=False)
    torch.testing.assert_close(compiled(*args), eager(fn, *args), rtol=1e-4, atol=1e-4)
    assert braze.counters()["fallback_ops"] == before


def test_mismatched_inner_dims_is_a_clear_error():
    g = braze._C.Graph()
    a = g.input("a", "f32", [g.sym_const(2), g.sym_const(3)], [])
    b = g.input("b", "f32", [g.sym_const(4), g.sym_const(5)], [])
    g.set_name("mm_1")
    with pytest.raises(braze.CompileError,
                       match=r"matmul \(node 'mm_1'\): shapes \[2, 3\] and \[4, 5\] cannot be multiplied \(3 vs 4\)"):
        g.matmul(a, b)


# Batched products with the batch laid out in the ways models lay it out: contiguous (one
# strided-batched library call on CUDA), an operand expanded along the heads (grouped-query
# attention: batch stride 0), transposed operands, and batch dims that do not collapse.
BATCHED = {
    "bmm_4d": (lambda a, b: a @ b, ((2, 3, 8, 16), (2, 3, 16, 5))),
    "scores_transposed_k": (lambda q, k: q @ k.transpose(-1, -2), ((2, 4, 9, 16), (2, 4, 7, 16))),
    "gqa_expanded_k": (lambda q, k: q @ k.expand(2, 2, 3, 16, 8),
                       ((2, 2, 3, 8, 16), (2, 2, 1, 16, 8))),
    "permuted_batch": (lambda a, b: a.permute(1, 0, 2, 3) @ b, ((3, 2, 8, 16), (2, 3, 16, 5))),
    "broadcast_batch": (lambda a, b: a @ b, ((4, 1, 6, 8), (3, 8, 5))),
    # How PyTorch's math attention computes half-precision scores: widened to f32 first.
    "widened_to_f32": (lambda a, b: a.float() @ b.float().transpose(-1, -2),
                       ((2, 3, 8, 16), (2, 3, 5, 16))),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(BATCHED))
def test_batched_matmul_matches_eager(name, dtype):
    fn, shapes = BATCHED[name]
    torch.manual_seed(0)
    args = [torch.randn(s).to(dtype) for s in shapes]
    before = braze.counters()["fallback_ops"]
    got = torch.compile(fn, backend="braze", dynamic=False)(*args)
    tol = 1e-4 if dtype == torch.float32 or got.dtype == torch.float32 else 3e-2
    want = eager(fn, *args)
    assert got.shape == want.shape
    torch.testing.assert_close(got.float(), fn(*[a.float() for a in args]), rtol=tol, atol=tol * 4)
    assert braze.counters()["fallback_ops"] == before


@pytest.mark.parametrize("form", ["scaled", "bias", "rows"])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_product_with_unaligned_rows(device, dtype, transposed, form):
    """On CUDA a large result whose rows are not 16-byte aligned (an odd vocabulary) is computed
    in row chunks with a padded pitch and copied into place: here in two chunks, each split
    into the aligned columns and the rest. The weight is [n, k] (a Linear, with the bias after
    it or in cuBLASLt's epilogue) or [k, n] (`rows`)."""
    if device != "cuda":
        pytest.skip("the padded path is CUDA's")
    torch.manual_seed(0)
    n = 2051 if dtype == torch.bfloat16 else 1025
    a = torch.randn(64, 16384).to(dtype) if transposed else torch.randn(16384, 64).to(dtype)
    w = torch.randn(n, 64).to(dtype)
    b = torch.randn(n).to(dtype)

    def fn(a, w, b):
        x = a.t() if transposed else a
        if form == "bias":
            return F.linear(x, w, b)
        if form == "rows":
            return x @ w.t().contiguous() + b
        return F.linear(x, w) * 2 + b

    got = torch.compile(fn, backend="braze", dynamic=False)(a, w, b)
    want = fn(*[t.float() for t in (a, w, b)])
    tol = 1e-3 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("shapes", [((0, 3), (3, 4)), ((2, 0, 3), (2, 3, 4)), ((0, 2, 3), (0, 3, 4)),
                                    ((5, 3), (3, 0))], ids=str)
def test_empty_products_match_eager(shapes):
    """A product with no rows, columns or batch points writes nothing: the CPU's BLAS path
    returns before splitting its work (dividing by the empty batch trapped: bilinear of a
    zero-row input crashed the process)."""
    torch.manual_seed(3)
    a, b = (torch.randn(*s, dtype=torch.float64) for s in shapes)
    got = torch.compile(lambda a, b: torch.matmul(a, b) * 2, backend="braze", dynamic=False)(a, b)
    assert got.shape == torch.matmul(a, b).shape
    x1, x2 = torch.randn(0, 3), torch.randn(0, 4)
    w, bias = torch.randn(5, 3, 4), torch.randn(5)
    torch._dynamo.reset()
    out = torch.compile(F.bilinear, backend="braze", dynamic=False)(x1, x2, w, bias)
    assert out.shape == (0, 5)


def _grouped_mm_op():
    pytest.importorskip("transformers.integrations.moe")  # registers the op
    return torch.ops.transformers.grouped_mm_fallback


@pytest.mark.parametrize("blas", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("counts", [[10, 0, 25, 3, 0, 19], [0, 0, 40], [57], [0, 0, 0]])
def test_grouped_products_match_the_per_expert_loop(device, counts, dtype, blas):
    """A mixture of experts' grouped product (transformers' grouped_mm_fallback): rows sorted by
    expert, each times its expert's weight; empty experts, every row in one expert, no row
    routed at all, and 7 rows past the last offset (0, as the op writes them). On the CPU it
    compiles (one BLAS call per run of rows of one expert, or the loop nest without BLAS);
    CUDA keeps f32 and f64 products whole, in eager, counted."""
    op = _grouped_mm_op()
    torch.manual_seed(0)
    rows, k, n = sum(counts) + 7, 24, 40
    x = torch.randn(rows, k, dtype=dtype, device=device)
    w = torch.randn(len(counts), k, n, dtype=dtype, device=device)
    offs = torch.tensor(counts, device=device).cumsum(0).to(torch.int32)
    f = torch.compile(lambda x, w, offs: op(x, w, offs) * 2, backend=lambda gm, ex:
                      braze.braze_backend(gm, ex, braze.Options(blas=blas)), dynamic=False)
    before = braze.counters()["fallback_ops"]
    out, code = braze.run_and_get_code(f, x, w, offs)
    torch.testing.assert_close(out, op(x, w, offs) * 2, rtol=1e-5, atol=1e-5)
    if device == "cpu":
        assert braze.counters()["fallback_ops"] == before
        assert ("_group(bufs, syms, err, r)" in "".join(code)) == blas
    else:
        assert braze.counters()["fallback_ops"] == before + 1


def _grouped_kernel(k_major):
    """The device template of braze's grouped kernel on this GPU: wgmma on sm_90 where the
    weights are read K-major, else mma.sync."""
    wgmma = k_major and torch.cuda.get_device_capability() == (9, 0)
    return "braze_grouped_wgmma<" if wgmma else "braze_grouped_mm<"


def _per_expert(x, w, offs, out_dtype):
    """The grouped product as a loop over experts, in f32 from the same half inputs, rounded
    once (what a GEMM with f32 accumulation computes); rows past the last offset are 0."""
    out = torch.zeros(x.shape[0], w.shape[-1], dtype=torch.float32, device=x.device)
    start = 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = x[start:end].float() @ w[e].float()
        start = end
    return out.to(out_dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("counts,k,n,transposed", [
    ([10, 0, 25, 3, 0, 19], 24, 40, False),      # tiny, one tile spanning every expert
    ([300, 0, 1, 129, 0, 77], 256, 384, True),   # several tiles, boundaries inside tiles
    ([0, 0, 200], 72, 136, True),                # every row in the last expert
    ([45, 90, 33], 20, 36, False),               # K and N not multiples of 8: element copies
    ([45, 90, 33], 20, 36, True),
    ([0, 0, 0], 32, 64, False),                  # no row routed: every row past the end
])
def test_half_grouped_products_run_one_kernel_on_cuda(device, dtype, counts, k, n, transposed,
                                                     monkeypatch):
    """Half-precision grouped products: on CUDA one tensor-core kernel that reads each row's
    expert on the device (no fallback op), equal to the per-expert loop accumulated in f32 and
    rounded once; weights stored [experts, k, n] or read transposed from [experts, n, k]. The
    CPU keeps half products whole, in eager, counted. (BRAZE_GROUPED_GEMM=1: by default CUDA
    keeps them whole where eager's kernel is faster,
    test_half_grouped_products_stay_whole_where_eagers_kernel_is_faster.)"""
    monkeypatch.setenv("BRAZE_GROUPED_GEMM", "1")
    op = _grouped_mm_op()
    torch.manual_seed(0)
    rows = sum(counts) + 7
    x = torch.randn(rows, k, device=device).to(dtype)
    stored = torch.randn(len(counts), *((n, k) if transposed else (k, n)), device=device) / 4
    stored = stored.to(dtype)
    offs = torch.tensor(counts, device=device).cumsum(0).to(torch.int32)
    f = torch.compile(lambda x, w, offs: op(x, w.transpose(1, 2) if transposed else w, offs),
                      backend="braze", dynamic=False)
    before = braze.counters()["fallback_ops"]
    out, code = braze.run_and_get_code(f, x, stored, offs)
    w = stored.transpose(1, 2) if transposed else stored
    torch.testing.assert_close(out, _per_expert(x, w, offs, dtype), rtol=1e-2, atol=1e-2)
    if device == "cuda":
        assert braze.counters()["fallback_ops"] == before
        assert _grouped_kernel(transposed) in "".join(code)
    else:
        assert braze.counters()["fallback_ops"] == before + 1


def test_aten_grouped_mm_with_f32_output_runs_one_kernel_on_cuda(device, monkeypatch):
    """aten._grouped_mm with out_dtype=float32: the f32 sums are stored unrounded."""
    monkeypatch.setenv("BRAZE_GROUPED_GEMM", "1")
    if device == "cpu" or not hasattr(torch.ops.aten, "_grouped_mm"):
        pytest.skip("aten._grouped_mm with out_dtype runs on CUDA")
    torch.manual_seed(0)
    x = torch.randn(200, 64, device=device, dtype=torch.bfloat16)
    w = torch.randn(4, 96, 64, device=device, dtype=torch.bfloat16).transpose(1, 2)
    offs = torch.tensor([50, 50, 130, 200], device=device, dtype=torch.int32)
    fn = lambda x, w, offs: torch._grouped_mm(x, w, offs=offs, out_dtype=torch.float32)
    try:
        fn(x, w, offs)
    except RuntimeError as e:  # torch 2.11's CUDA kernel writes bf16 only
        pytest.skip(f"eager's _grouped_mm takes no f32 output here: {e}")
    before = braze.counters()["fallback_ops"]
    out = torch.compile(fn, backend="braze", dynamic=False)(x, w, offs)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, _per_expert(x, w, offs, torch.float32), rtol=1e-4, atol=1e-4)
    assert braze.counters()["fallback_ops"] == before


def test_half_grouped_products_stay_whole_where_eagers_kernel_is_faster(device, monkeypatch):
    """By default a half grouped product runs eager's kernel (one counted fallback op), equal to
    eager, on the CPU and wherever braze's kernel is slower than eager's: weights stored
    [experts, in, out], any weights with BRAZE_GROUPED_GEMM=0, and any GPU but sm_90."""
    op = _grouped_mm_op()
    torch.manual_seed(0)
    x = torch.randn(50, 32, device=device).to(torch.bfloat16)
    stored = torch.randn(3, 32, 48, device=device).to(torch.bfloat16)
    offs = torch.tensor([10, 30, 50], device=device, dtype=torch.int32)
    for mode, w in ((None, stored), ("0", stored.transpose(1, 2).contiguous().transpose(1, 2))):
        torch._dynamo.reset()
        if mode is None:
            monkeypatch.delenv("BRAZE_GROUPED_GEMM", raising=False)
        else:
            monkeypatch.setenv("BRAZE_GROUPED_GEMM", mode)
        f = torch.compile(lambda x, w, offs: op(x, w, offs) * 2, backend="braze", dynamic=False)
        before = braze.counters()["fallback_ops"]
        torch.testing.assert_close(f(x, w, offs), op(x, w, offs) * 2)
        assert braze.counters()["fallback_ops"] == before + 1


def test_half_grouped_products_with_k_major_weights_compile_by_default_on_sm90(device,
                                                                               monkeypatch):
    """On sm_90, a bf16 grouped product whose weights are read K-major (transformers' weights
    [experts, out, in], transposed) runs braze's wgmma kernel by default: no fallback op, equal
    to the per-expert f32 loop; on other GPUs it stays whole."""
    if device == "cpu":
        pytest.skip("the CPU keeps half-precision grouped products whole")
    monkeypatch.delenv("BRAZE_GROUPED_GEMM", raising=False)
    op = _grouped_mm_op()
    torch.manual_seed(0)
    x = torch.randn(700, 192, device=device).to(torch.bfloat16)
    stored = (torch.randn(4, 320, 192, device=device) / 8).to(torch.bfloat16)
    offs = torch.tensor([100, 100, 450, 690], device=device, dtype=torch.int32)
    f = torch.compile(lambda x, w, offs: op(x, w.transpose(1, 2), offs), backend="braze",
                      dynamic=False)
    before = braze.counters()["fallback_ops"]
    out, code = braze.run_and_get_code(f, x, stored, offs)
    torch.testing.assert_close(out, _per_expert(x, stored.transpose(1, 2), offs, torch.bfloat16),
                               rtol=1e-2, atol=1e-2)
    if torch.cuda.get_device_capability() == (9, 0):
        assert braze.counters()["fallback_ops"] == before
        assert "braze_grouped_wgmma<true, " in "".join(code)
    else:
        assert braze.counters()["fallback_ops"] == before + 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("counts,k,half", [
    ([300, 0, 1, 129, 0, 77], 192, 256),   # tiles at expert boundaries, halves of 2 tiles
    ([0, 0, 200], 72, 200),                # a half that is no multiple of 128 (a partial tile)
    ([45, 90, 33], 20, 36),                # K and halves not multiples of 8: element copies
    ([0, 0, 0], 64, 128),                  # no row routed: every row past the end
])
def test_a_gated_grouped_product_computes_its_activation_in_the_products_kernel(
        device, dtype, counts, k, half, monkeypatch):
    """A mixture of experts' gate-up product and its activation, silu(gate) * up over the two
    halves of the product's columns: on sm_90 with BRAZE_PAIRED_EPILOGUE=1 one kernel (the wgmma
    kernel's paired epilogue; off by default, where the two are two kernels),
    which never stores the product, equal to the per-expert product in f32, rounded, then the
    activation; 7 rows past the last offset give zeros. Also with transformers' sentinel
    masked_fill between them (a mask read from another input, as the epilogue may). Where the
    product is also returned, it is stored and the activation is a kernel of its own, with the
    same values."""
    if device == "cpu":
        pytest.skip("the CPU keeps half-precision grouped products whole")
    monkeypatch.delenv("BRAZE_GROUPED_GEMM", raising=False)
    op = _grouped_mm_op()
    torch.manual_seed(0)
    rows = sum(counts) + 7
    x = torch.randn(rows, k, device=device).to(dtype)
    stored = (torch.randn(len(counts), 2 * half, k, device=device) / 4).to(dtype)
    offs = torch.tensor(counts, device=device).cumsum(0).to(torch.int32)
    ids = torch.randint(0, len(counts) + 2, (rows,), device=device)

    def gated(x, w, offs, ids, masked=False):
        y = op(x, w.transpose(1, 2), offs)
        if masked:
            y = y.masked_fill((ids >= len(counts)).unsqueeze(-1), 0.0)
        g, u = y.chunk(2, dim=-1)
        return F.silu(g) * u

    product = _per_expert(x, stored.transpose(1, 2), offs, dtype)
    sm90 = torch.cuda.get_device_capability() == (9, 0)
    for variant in ("default", "gated", "masked", "also_product"):
        torch._dynamo.reset()
        monkeypatch.setenv("BRAZE_PAIRED_EPILOGUE", "0" if variant == "default" else "1")
        if variant == "also_product":
            fn = lambda x, w, offs, ids: (gated(x, w, offs, ids), op(x, w.transpose(1, 2), offs))
        else:
            fn = functools.partial(gated, masked=variant == "masked")
        masked = product.masked_fill((ids >= len(counts)).unsqueeze(-1), 0.0)
        gate, up = (masked if variant == "masked" else product).chunk(2, dim=-1)
        before = braze.counters()["fallback_ops"]
        out, code = braze.run_and_get_code(torch.compile(fn, backend="braze", dynamic=False),
                                           x, stored, offs, ids)
        got = out[0] if variant == "also_product" else out
        torch.testing.assert_close(got, F.silu(gate) * up, rtol=2e-2, atol=2e-2)
        if variant == "also_product":
            torch.testing.assert_close(out[1], product, rtol=1e-2, atol=1e-2)
        if sm90:
            assert braze.counters()["fallback_ops"] == before
            assert (", true>(" in "".join(code)) == (variant in ("gated", "masked"))


def test_a_half_router_with_gathered_tokens_is_one_graph_on_cuda(device, monkeypatch):
    """transformers' MoE route in bf16 on CUDA: top-2 router, tokens gathered in their experts'
    order into the grouped product (weights read transposed), results scattered back and
    summed per token; and with the rows of sentinel tokens filled with zeros first. No op runs
    in eager; the tokens' gather and the mask are the kernel's row table."""
    if device == "cpu":
        pytest.skip("the CPU keeps half-precision grouped products whole")
    monkeypatch.setenv("BRAZE_GROUPED_GEMM", "1")
    op = _grouped_mm_op()
    torch.manual_seed(0)
    experts, hidden, inner, tokens = 8, 64, 96, 301
    gate = torch.randn(hidden, experts, device=device).to(torch.bfloat16)
    w = (torch.randn(experts, inner, hidden, device=device) / 8).to(torch.bfloat16)

    def moe(h, masked):
        weights, chosen = (h @ gate).float().softmax(-1).topk(2, -1)
        flat = chosen.reshape(-1)
        order = flat.argsort(stable=True)
        offs = torch.stack([(flat <= e).sum() for e in range(experts)]).to(torch.int32)
        tokens_g = h[order // 2]
        if masked:  # transformers' sentinel rows (expert-parallel): the last expert's
            tokens_g = tokens_g.masked_fill((flat[order] >= experts - 1).unsqueeze(-1), 0.0)
        y = op(tokens_g, w.transpose(1, 2), offs)
        back = torch.empty_like(y).index_copy(0, order, y)
        return (back.view(tokens, 2, inner).float() * weights.unsqueeze(-1)).sum(1)

    h = torch.randn(tokens, hidden, device=device).to(torch.bfloat16)
    for masked in (False, True):
        torch._dynamo.reset()
        f = torch.compile(functools.partial(moe, masked=masked), backend="braze", dynamic=False)
        before = braze.counters()["fallback_ops"]
        out, code = braze.run_and_get_code(f, h)
        torch.testing.assert_close(out, moe(h, masked), rtol=2e-2, atol=2e-2)
        assert braze.counters()["fallback_ops"] == before
        assert _grouped_kernel(True) in "".join(code)
        # the row table masks the rows past the last offset (CUDA's decomposition), and the
        # sentinel rows too where the model fills them with zeros
        zero = [line for line in "".join(code).splitlines() if "const bool zero = " in line]
        assert zero and all((" || " in line) == masked for line in zero)


@pytest.mark.cpu_only("CUDA keeps the grouped product in eager (one counted fallback op)")
def test_a_grouped_product_with_transposed_weights_and_the_experts_loop_of_a_router():
    """The route of transformers' MoE: a top-2 router, tokens sorted by expert, the grouped
    product with weights stored [experts, out, in] (read transposed, in place), and the results
    scattered back and summed per token: one graph, no op in eager, equal to eager."""
    op = _grouped_mm_op()
    torch.manual_seed(0)
    experts, hidden, inner, tokens = 4, 32, 48, 37
    gate = torch.randn(hidden, experts)
    w = torch.randn(experts, inner, hidden) / 6

    def moe(h):
        weights, chosen = (h @ gate).softmax(-1).topk(2, -1)
        flat = chosen.reshape(-1)
        order = flat.argsort(stable=True)
        offs = torch.stack([(flat <= e).sum() for e in range(experts)]).to(torch.int32)
        y = op(h[order // 2], w.transpose(1, 2), offs)  # token of each routed slot
        back = torch.empty_like(y).index_copy(0, order, y)
        return (back.view(tokens, 2, inner) * weights.unsqueeze(-1)).sum(1)

    h = torch.randn(tokens, hidden)
    f = torch.compile(moe, backend="braze", dynamic=False)
    before = braze.counters()["fallback_ops"]
    out, code = braze.run_and_get_code(f, h)
    torch.testing.assert_close(out, moe(h), rtol=1e-4, atol=1e-4)
    assert braze.counters()["fallback_ops"] == before
    # the tokens' gather is the product's: each run's rows are copied, then one BLAS call
    assert "_row(bufs, syms, err, i)" in "".join(code) and "_group(" in "".join(code)


@pytest.mark.cpu_only("the CPU's BLAS")
def test_in_process_products_call_pytorchs_mkl_and_packages_keep_openblas(tmp_path):
    """Where PyTorch has MKL, a compile for this process calls it (libtorch_cpu's Fortran ILP64
    gemm through row-major wrappers): f32 and f64, plain and transposed operands, a bias, sizes
    that are not multiples of anything, equal to eager. A package, which runs without PyTorch,
    still links OpenBLAS."""
    from braze import cpu as cpu_support
    lib = cpu_support.jit_blas_library()
    if lib is None or "libtorch_cpu" not in lib:
        pytest.skip("PyTorch has no MKL here")
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        x, w, b = (torch.randn(37, 24, dtype=dtype), torch.randn(53, 24, dtype=dtype),
                   torch.randn(53, dtype=dtype))
        for fn in (lambda x, w, b: F.linear(x, w, b), lambda x, w, b: x.t() @ x,
                   lambda x, w, b: torch.bmm(x.view(1, 37, 24), w.t().unsqueeze(0))):
            torch._dynamo.reset()
            out, code = braze.run_and_get_code(torch.compile(fn, backend="braze", dynamic=False),
                                               x, w, b)
            tol = 1e-4 if dtype == torch.float32 else 1e-10
            torch.testing.assert_close(out, fn(x, w, b), rtol=tol, atol=tol)
            assert ("sgemm_64_" if dtype == torch.float32 else "dgemm_64_") in "".join(code)
    if cpu_support.blas_library() is None:
        return
    model = torch.nn.Linear(24, 53).eval()
    braze.export(model, (torch.randn(8, 24),), str(tmp_path / "p"))
    manifest = open(tmp_path / "p" / "package.txt").read()
    assert "libtorch_cpu" not in manifest and "openblas" in manifest
    x = torch.randn(8, 24)
    torch.testing.assert_close(braze.load(str(tmp_path / "p"))(x), model(x).detach())
