"""braze.export and braze.load: packages that run without Python's compile path, checked against
eager at several sizes, and every way a package or a call can be wrong giving an error that
names it. (The C++ side, examples/cpp/run_package, runs the same packages in make
test-install.)"""
import hashlib
import os
import threading
import warnings

import pytest
import torch
from torch.export import Dim

import braze

warnings.filterwarnings("ignore", category=FutureWarning)
# CPU packages: each test's CUDA variant would only repeat it. The CUDA packages' tests run on
# the CUDA variant alone.
cpu = pytest.mark.cpu_only("a CPU package")


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 10)
        self.register_buffer("shift", torch.linspace(-1, 1, 10))

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x))) + self.shift


def _export_mlp(model, path):
    braze.export(model, (torch.randn(4, 16),), path,
                 dynamic_shapes={"x": {0: Dim("batch", min=1, max=256)}})
    return model, path


@pytest.fixture(scope="module")
def mlp_package(tmp_path_factory):
    torch.manual_seed(0)
    return _export_mlp(MLP().eval(), str(tmp_path_factory.mktemp("export") / "mlp"))


@cpu
def test_mlp_matches_eager_at_several_batch_sizes(mlp_package):
    model, path = mlp_package
    run = braze.load(path)
    for batch in (1, 4, 37, 256):
        x = torch.randn(batch, 16)
        torch.testing.assert_close(run(x), model(x).detach(), rtol=1e-5, atol=1e-5)
    sig = run.signature
    assert [i["name"] for i in sig["inputs"]] == ["x"]
    assert sig["inputs"][0]["dtype"] == "f32" and sig["inputs"][0]["shape"][1] == 16
    (name, (lo, hi)), = sig["symbols"].items()
    assert sig["inputs"][0]["shape"][0] == name and (lo, hi) == (1, 256)
    assert open(os.path.join(path, "package.txt")).readline() == \
        f"braze-package {braze.package.CPU_FORMAT_VERSION}\n"


@cpu
def test_weights_are_a_safetensors_file(mlp_package):
    import json
    import struct
    model, path = mlp_package
    with open(os.path.join(path, "weights.safetensors"), "rb") as f:
        n, = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    assert (8 + n) % 64 == 0
    for name, value in model.state_dict().items():
        entry = header[name]
        begin, end = entry["data_offsets"]
        assert begin % 64 == 0  # each weight aligned, as the GPU libraries' fast kernels want
        assert entry["shape"] == list(value.shape) and entry["dtype"] == "F32"
        stored = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32)
        assert torch.equal(stored.reshape(value.shape), value)


@pytest.mark.parametrize("bad, message", [
    (lambda: torch.randn(300, 16), "outside the range [1, 256]"),
    (lambda: torch.randn(4, 15), "dim 1 must be 16"),
    (lambda: torch.randn(4, 16, dtype=torch.float64), "is f64, the package takes f32"),
    (lambda: torch.randn(4, 16, 1), "has rank 3"),
])
@cpu
def test_a_wrong_input_is_an_error_naming_it(mlp_package, bad, message):
    _, path = mlp_package
    with pytest.raises(braze.RunError, match="input 0 \\(x\\)") as e:
        braze.load(path)(bad())
    assert message in str(e.value)


@cpu
def test_a_wrong_number_of_inputs_is_an_error(mlp_package):
    _, path = mlp_package
    with pytest.raises(braze.RunError, match="takes 1 inputs, got 2"):
        braze.load(path)(torch.randn(2, 16), torch.randn(2, 16))


@cpu
def test_concurrent_calls_on_one_package(mlp_package):
    model, path = mlp_package
    run = braze.load(path)
    xs = [torch.randn(3 + i, 16) for i in range(8)]
    want = [model(x).detach() for x in xs]
    got = [None] * len(xs)

    def work(i):
        for _ in range(20):
            got[i] = run(xs[i])
    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def _copy(path, tmp_path):
    import shutil
    dst = tmp_path / "copy"
    shutil.copytree(path, dst)
    return str(dst)


def _rewrite_manifest(pkg, edit):
    """package.txt edited by `edit` (a function of its lines before the checksum), with a
    valid checksum."""
    file = os.path.join(pkg, "package.txt")
    lines = open(file).read().splitlines()
    body = "\n".join(edit(lines[:-1])) + "\n"
    open(file, "w").write(body + f"checksum {hashlib.sha256(body.encode()).hexdigest()}\n")


def _flip(file, at):
    data = bytearray(open(file, "rb").read())
    data[at if at >= 0 else len(data) + at] ^= 0x40
    open(file, "wb").write(bytes(data))


@pytest.mark.parametrize("damage, message", [
    (lambda p: os.remove(os.path.join(p, "model.so")), "model.so is missing"),
    (lambda p: _flip(os.path.join(p, "model.so"), 1000), "model.so is damaged"),
    (lambda p: os.truncate(os.path.join(p, "weights.safetensors"), 100),
     "weights.safetensors is damaged"),
    (lambda p: _flip(os.path.join(p, "weights.safetensors"), -3), "weights.safetensors is damaged"),
    (lambda p: os.remove(os.path.join(p, "package.txt")), "package.txt is missing"),
    (lambda p: _flip(os.path.join(p, "package.txt"), 20), "package.txt is damaged"),
    (lambda p: os.truncate(os.path.join(p, "package.txt"), 60), "package.txt is damaged"),
    (lambda p: _rewrite_manifest(p, lambda ls: ["braze-package 99"] + ls[1:]),
     "format version 99 is not one this runtime reads"),
    (lambda p: _rewrite_manifest(p, lambda ls: ls + ["isa avx512-not-a-feature"]),
     "compiled for a CPU with avx512-not-a-feature"),
    (lambda p: _rewrite_manifest(p, lambda ls: [l.replace(" weight 0 ", " weight 999999 ")
                                                for l in ls]),
     "does not fit the weights file"),
    (lambda p: _rewrite_manifest(p, lambda ls: ls + ["device cuda"]), "device cuda"),
    (lambda p: _rewrite_manifest(p, lambda ls: ls + ["gibberish 1 2"]), "unknown record"),
    (lambda p: _rewrite_manifest(p, lambda ls: [l.replace("input fc1.weight f32 2 32 16",
                                                          "input fc1.weight f32 2 4294967296 "
                                                          "4294967296") for l in ls]),
     "a size no file holds"),
])
@cpu
def test_a_damaged_package_is_an_error(mlp_package, tmp_path, damage, message):
    _, path = mlp_package
    pkg = _copy(path, tmp_path)
    damage(pkg)
    with pytest.raises(braze.RunError, match="braze package") as e:
        braze.load(pkg)
    assert message in str(e.value)


@pytest.fixture(scope="module")
def mlp_archive(tmp_path_factory, mlp_package):
    return _export_mlp(mlp_package[0], str(tmp_path_factory.mktemp("archive") / "mlp.zip"))


@cpu
def test_a_package_as_one_zip_archive(mlp_archive):
    """A path ending in .zip gets the package as one file: a zip archive of stored entries,
    which the runtime extracts once (named by its SHA-256) and loads as a package directory."""
    import zipfile
    model, path = mlp_archive
    assert os.path.isfile(path)
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        assert {"package.txt", "model.so", "weights.safetensors"} <= set(names)
        assert all(i.compress_type == zipfile.ZIP_STORED for i in z.infolist())
    for _ in range(2):  # the second load reuses the extracted directory
        run = braze.load(path)
        for batch in (1, 37):
            x = torch.randn(batch, 16)
            torch.testing.assert_close(run(x), model(x).detach(), rtol=1e-5, atol=1e-5)


def _rezip(path, out, compression):
    import zipfile
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w", compression) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))


def _flip_entry(path, out, entry):
    """A copy of archive `path` with one byte of `entry`'s data flipped."""
    import zipfile
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(entry)
    data = bytearray(open(path, "rb").read())
    header = info.header_offset
    start = header + 30 + int.from_bytes(data[header + 26:header + 28], "little") + \
        int.from_bytes(data[header + 28:header + 30], "little")
    data[start + info.file_size // 2] ^= 0x40
    open(out, "wb").write(bytes(data))


@pytest.mark.parametrize("damage, message", [
    (lambda p, o: open(o, "wb").write(open(p, "rb").read()[:-30]),
     "no end of central directory"),
    (lambda p, o: open(o, "wb").write(open(p, "rb").read()[:5000]),
     "no end of central directory"),
    (lambda p, o: _flip_entry(p, o, "weights.safetensors"),
     "entry weights.safetensors is damaged (its CRC-32 does not match)"),
    (lambda p, o: _flip_entry(p, o, "package.txt"),
     "entry package.txt is damaged (its CRC-32 does not match)"),
    (lambda p, o: _rezip(p, o, __import__("zipfile").ZIP_DEFLATED), "is compressed (method 8)"),
    (lambda p, o: open(o, "wb").write(b"not a zip archive at all" * 10),
     "no end of central directory"),
])
@cpu
def test_a_damaged_package_archive_is_an_error(mlp_archive, tmp_path, damage, message):
    _, path = mlp_archive
    out = str(tmp_path / "damaged.zip")
    damage(path, out)
    with pytest.raises(braze.RunError, match="braze package") as e:
        braze.load(out)
    assert message in str(e.value)


@cpu
def test_a_package_archive_entry_named_outside_is_refused(tmp_path):
    import zipfile
    out = str(tmp_path / "evil.zip")
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("../outside.txt", "x")
        z.writestr("package.txt", "braze-package 1\n")
    with pytest.raises(braze.RunError, match="named outside the package"):
        braze.load(out)


@cpu
def test_a_missing_vendor_library_is_an_error(mlp_package, tmp_path):
    _, path = mlp_package
    pkg = _copy(path, tmp_path)
    libs = [l for l in open(os.path.join(pkg, "package.txt")) if l.startswith("vendor ")]
    if not libs:
        pytest.skip("the library links no vendor library here")
    os.remove(os.path.join(pkg, libs[0].split()[1]))
    with pytest.raises(braze.RunError, match="is missing"):
        braze.load(pkg)


@cpu
def test_a_package_can_name_its_libraries_instead_of_bundling_them(tmp_path):
    torch.manual_seed(1)
    model = torch.nn.Linear(64, 64).eval()
    braze.export(model, (torch.randn(8, 64),), str(tmp_path / "p"), bundle_libraries=False)
    assert not os.path.exists(tmp_path / "p" / "lib")
    x = torch.randn(8, 64)
    torch.testing.assert_close(braze.load(str(tmp_path / "p"))(x), model(x).detach())


@cpu
def test_export_replaces_a_package_and_refuses_other_directories(mlp_package, tmp_path):
    model, path = mlp_package
    pkg = _copy(path, tmp_path)
    braze.export(torch.nn.Linear(3, 2).eval(), (torch.randn(2, 3),), pkg)
    assert braze.load(pkg).signature["inputs"][0]["shape"] == [2, 3]
    other = tmp_path / "notes"
    other.mkdir()
    (other / "readme.txt").write_text("mine")
    with pytest.raises(braze.ExportError, match="is not a braze package"):
        braze.export(torch.nn.Linear(3, 2).eval(), (torch.randn(2, 3),), str(other))
    assert (other / "readme.txt").read_text() == "mine"


@cpu
def test_export_from_an_exported_program(tmp_path):
    torch.manual_seed(2)
    model = MLP().eval()
    ep = torch.export.export(model, (torch.randn(5, 16),))
    braze.export(ep, (), str(tmp_path / "p"))
    x = torch.randn(5, 16)
    torch.testing.assert_close(braze.load(str(tmp_path / "p"))(x), model(x).detach(),
                               rtol=1e-5, atol=1e-5)


class Unsupported(torch.nn.Module):
    def forward(self, x):
        a = torch.special.zeta(x, x + 1.0)
        b = torch.special.zeta(x + 2.0, x)
        return a + b


@cpu
def test_unsupported_ops_are_listed_with_their_source_lines(tmp_path, monkeypatch):
    from braze import package as export_module
    real = export_module.support.node_support

    def refuse_zeta(node, device=None):  # an op braze has no rule for, in two places
        if "zeta" in str(node.target):
            return False, "no braze rule for it (test)"
        return real(node, device)
    monkeypatch.setattr(export_module.support, "node_support", refuse_zeta)
    with pytest.raises(braze.ExportError) as e:
        braze.export(Unsupported(), (torch.rand(4) + 1,), str(tmp_path / "p"))
    text = str(e.value)
    assert "2 ops braze cannot compile" in text and text.count("aten.special_zeta") == 2
    assert "test_export.py:" in text and "torch.special.zeta(x, x + 1.0)" in text
    assert "torch.special.zeta(x + 2.0, x)" in text
    assert not os.path.exists(tmp_path / "p")


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return x * 2


@cpu
def test_a_model_that_mutates_a_buffer_is_refused(tmp_path):
    with pytest.raises(braze.ExportError, match="does not mutate"):
        braze.export(Counter(), (torch.randn(3),), str(tmp_path / "p"))


def _cuda_only(device):
    if device != "cuda":
        pytest.skip("a CUDA package")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cuda_package_matches_eager(tmp_path, device, dtype):
    _cuda_only(device)
    torch.manual_seed(5)
    model = MLP().eval().to("cuda", dtype)
    path = str(tmp_path / "mlp")
    braze.export(model, (torch.randn(4, 16, device="cuda", dtype=dtype),), path,
                 dynamic_shapes={"x": {0: Dim("batch", min=1, max=256)}})
    lines = open(os.path.join(path, "package.txt")).read().splitlines()
    props = torch.cuda.get_device_properties(0)
    assert lines[0] == f"braze-package {braze.package.FORMAT_VERSION}"
    assert f"device cuda {props.major * 10 + props.minor}" in lines
    assert any(l.startswith("cubin kernels/") for l in lines)
    assert any(l.startswith("cuda-library cublaslt ") for l in lines)
    run = braze.load(path)
    assert run.device == torch.device("cuda", 0)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    for batch in (1, 5, 64, 256):
        x = torch.randn(batch, 16, device="cuda", dtype=dtype)
        got = run(x)
        assert got.device.type == "cuda" and got.dtype == dtype
        with torch.no_grad():
            torch.testing.assert_close(got, model(x), **tol)
    # On another stream, as PyTorch's current one.
    side = torch.cuda.Stream()
    x = torch.randn(9, 16, device="cuda", dtype=dtype)
    with torch.cuda.stream(side), torch.no_grad():
        got, want = run(x), model(x)
    side.synchronize()
    torch.testing.assert_close(got, want, **tol)
    with pytest.raises(braze.RunError, match="is not on CUDA device 0"):
        run(torch.randn(3, 16, dtype=dtype, device="cpu"))
    with pytest.raises(braze.RunError, match="outside the range"):
        run(torch.randn(300, 16, device="cuda", dtype=dtype))
    bad = _copy(path, tmp_path)
    _flip(os.path.join(bad, "kernels", "0.cubin"), 200)
    with pytest.raises(braze.RunError, match="kernels/0.cubin is damaged"):
        braze.load(bad)
    _rewrite_manifest(bad, lambda ls: [l.replace("device cuda ", "device cuda 1") for l in ls])
    with pytest.raises(braze.RunError, match="export it again on this GPU"):
        braze.load(bad)


def test_a_cuda_language_model_with_dynamic_batch(tmp_path, device):
    _cuda_only(device)
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(6)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100,
                                  n_positions=64, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).eval().cuda()

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = model

        def forward(self, ids):
            return self.lm(input_ids=ids, use_cache=False).logits

    # GPT-2 pads its mask to a multiple of 8 keys on CUDA, which torch.export cannot state for
    # every sequence length: the batch alone is dynamic.
    ids = torch.randint(0, 100, (2, 24), device="cuda")
    braze.export(Logits().eval(), (ids,), str(tmp_path / "lm"),
                 dynamic_shapes={"ids": {0: Dim("batch", min=1, max=8)}})
    run = braze.load(str(tmp_path / "lm"))
    for b, s in ((2, 24), (5, 24)):
        ids = torch.randint(0, 100, (b, s), device="cuda")
        with torch.no_grad():
            want = model(input_ids=ids, use_cache=False).logits
        torch.testing.assert_close(run(ids), want, rtol=1e-3, atol=1e-3)


class TwoDevices(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2).cuda()
        self.register_buffer("count", torch.arange(4.0, device="cpu"))

    def forward(self, x):
        return self.lin(x), self.count * 2


def test_a_model_on_two_devices_is_refused(tmp_path, device):
    _cuda_only(device)
    with pytest.raises(braze.ExportError, match="on 2 devices"):
        braze.export(TwoDevices(), (torch.randn(2, 3, device="cuda"),), str(tmp_path / "p"))


@cpu
def test_a_cuda_package_without_a_gpu_is_an_error(mlp_package, tmp_path):
    if braze._C.cuda_driver_available():
        pytest.skip("this machine has a CUDA device")
    _, path = mlp_package
    pkg = _copy(path, tmp_path)
    _rewrite_manifest(pkg, lambda ls: [l.replace("device cpu", "device cuda 90") for l in ls])
    with pytest.raises(braze.RunError, match="no CUDA driver or device"):
        braze.load(pkg)


@cpu
def test_a_cnn_with_batch_norm_matches_eager(tmp_path):
    torch.manual_seed(3)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 16, 3, stride=2), torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(16, 5)).eval()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    braze.export(model, (torch.randn(2, 3, 32, 32),), str(tmp_path / "cnn"),
                 dynamic_shapes={"input": {0: Dim("batch", min=1, max=16)}})
    run = braze.load(str(tmp_path / "cnn"))
    for batch in (1, 6):
        x = torch.randn(batch, 3, 32, 32)
        torch.testing.assert_close(run(x), model(x).detach(), rtol=1e-4, atol=1e-4)


@cpu
def test_channels_last_weights_keep_their_layout(tmp_path):
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 4, 1)).eval()
    model = model.to(memory_format=torch.channels_last)
    path = str(tmp_path / "cl")
    braze.export(model, (torch.randn(2, 3, 16, 16),), path)
    text = open(os.path.join(path, "package.txt")).read()
    assert text.startswith(f"braze-package {braze.package.FORMAT_VERSION}\n")
    assert "input 0.weight f32 4 8 3 3 3 weight" in text and " strides 27 1 9 3" in text
    run = braze.load(path)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(run(x), model(x), rtol=1e-4, atol=1e-4)
    bad = _copy(path, tmp_path)
    _rewrite_manifest(bad, lambda ls: [l.replace(" strides 27 1 9 3", " strides 27 2 9 3")
                                       for l in ls])
    with pytest.raises(braze.RunError, match="not a dense layout"):
        braze.load(bad)


@cpu
def test_a_channels_last_input_is_taken_in_its_layout(tmp_path):
    torch.manual_seed(8)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU()).eval()
    x = torch.randn(2, 3, 16, 16).to(memory_format=torch.channels_last)
    path = str(tmp_path / "cl")
    braze.export(model, (x,), path)
    run = braze.load(path)
    assert run.signature["inputs"][0]["strides"] == [768, 1, 48, 3]
    with torch.no_grad():
        torch.testing.assert_close(run(x), model(x), rtol=1e-4, atol=1e-4)
    with pytest.raises(braze.RunError, match=r"input 0 \(input\) has strides \[768, 256, 16, "
                                             r"1\]; the package takes it laid out as it was "
                                             r"exported, with strides \[768, 1, 48, 3\]"):
        run(x.contiguous())


@cpu
def test_a_language_model_with_dynamic_batch_and_sequence(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(4)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100,
                                  n_positions=64, bos_token_id=0, eos_token_id=0)
    lm = transformers.GPT2LMHeadModel(cfg).eval()

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = lm

        def forward(self, ids, mask):
            return self.lm(input_ids=ids, attention_mask=mask, use_cache=False).logits

    model = Logits().eval()
    batch, seq = Dim("batch", min=1, max=8), Dim("seq", min=2, max=64)
    ids = torch.randint(0, 100, (2, 12))
    braze.export(model, (ids, torch.ones_like(ids)), str(tmp_path / "lm"),
                 dynamic_shapes={"ids": {0: batch, 1: seq}, "mask": {0: batch, 1: seq}})
    run = braze.load(str(tmp_path / "lm"))
    for b, s in ((2, 12), (3, 29)):
        ids = torch.randint(0, 100, (b, s))
        mask = torch.ones_like(ids)
        mask[0, : s // 3] = 0  # a left-padded sequence
        with torch.no_grad():
            want = model(ids, mask)
        torch.testing.assert_close(run(ids, mask), want, rtol=1e-4, atol=1e-4)
    with pytest.raises(braze.RunError, match="but an earlier input has"):
        run(torch.randint(0, 100, (2, 12)), torch.ones(2, 13, dtype=torch.int64))
