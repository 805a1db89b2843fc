"""Faults of the machine braze runs on are survived: a cache that cannot be written, two
processes building the same entry, a damaged entry, and a missing or broken NVRTC, cuBLASLt or
host compiler. Each ends in a compiled graph, or in eager PyTorch with a message that names
what was wrong; never in a crash or a wrong answer."""
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import time
import warnings

import pytest
import torch

import braze
from braze import cuda as cuda_support
from braze.backend import Options

HOST = "the host-side cache and compiler are the same for every device"

# Compiles two graphs (each a cache entry) in a fresh process and prints braze's counters.
TWO_GRAPHS = """
import torch, braze
for k, op in enumerate((torch.sin, torch.cos)):
    torch._dynamo.reset()
    x = torch.randn(8)
    f = torch.compile(lambda x: op(x) * (k + 2), backend="braze")
    torch.testing.assert_close(f(x), op(x) * (k + 2))
c = braze.counters()
print(c["graphs_compiled"], c["fallback_graphs"], c["cache_misses"], c["cache_hits"])
"""


def _python(script, cache, *args, wrap=()):
    """Runs `script` in a fresh Python (under the command `wrap`) compiling into `cache`."""
    env = dict(os.environ, BRAZE_CACHE_DIR=str(cache))
    return subprocess.run([*wrap, sys.executable, "-c", script, *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=300)


@functools.lru_cache(maxsize=None)
def _can_mount():
    """Whether this machine lets a process mount file systems in a mount namespace of its own."""
    if shutil.which("unshare") is None:
        return False
    r = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                        "mount -t tmpfs tmpfs /mnt"], capture_output=True)
    return r.returncode == 0


def _with_mount(mount, folder):
    """A command prefix: a mount namespace of its own where the shell command `mount` (given
    `folder` as $1) has run."""
    if not _can_mount():
        pytest.skip("this machine does not allow mount namespaces (unshare --user --mount)")
    return ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
            mount + ' && shift && exec "$@"', "sh", str(folder)]


def _entries(cache, suffix=".so"):
    return sorted(p for p in cache.rglob("*" + suffix) if ".tmp" not in p.name)


def _checksum_holds(entry):
    sum_file = entry.with_name(entry.name[:-len(".so")] + ".sha256") if entry.suffix == ".so" \
        else entry.with_name(entry.name + ".sha256")
    return sum_file.read_text() == hashlib.sha256(entry.read_bytes()).hexdigest()


def _compile(fn, *args, options=None):
    """fn compiled by braze and called; (result, braze's warnings)."""
    backend = "braze" if options is None else (
        lambda gm, ex: braze.braze_backend(gm, ex, options))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(fn, backend=backend)(*args)
    return out, [str(w.message) for w in caught if "braze" in str(w.message)]


# --- a cache directory that cannot be used ------------------------------------------------


@pytest.mark.cpu_only(HOST)
def test_a_read_only_cache_directory_compiles_without_it(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    wrap = _with_mount('mount --bind "$1" "$1" && mount -o remount,ro,bind "$1"', cache)
    r = _python(TWO_GRAPHS, cache, wrap=wrap)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2", "0", "2", "0"], r.stderr  # both compiled, none in eager
    said = [line for line in r.stderr.splitlines() if "cannot be used" in line]
    assert len(said) == 1, r.stderr  # once, not per graph
    assert said[0].startswith(f"braze: the cache directory {cache} cannot be used (")
    assert "Read-only file system); compiling without it, into " in said[0]
    assert not any(cache.iterdir())


@pytest.mark.cpu_only(HOST)
def test_a_full_cache_directory_compiles_without_it(tmp_path):
    """A file system with room for the probe braze writes first, not for a compiled library:
    the first entry's write fails with ENOSPC, and braze goes on without the cache."""
    cache = tmp_path / "cache"
    cache.mkdir()
    wrap = _with_mount('mount -t tmpfs -o size=8k tmpfs "$1"', cache)
    r = _python(TWO_GRAPHS, cache, wrap=wrap)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2", "0", "2", "0"], r.stderr
    said = [line for line in r.stderr.splitlines() if "cannot be used" in line]
    assert len(said) == 1, r.stderr
    assert said[0].startswith(f"braze: the cache directory {cache} cannot be used (cannot write "
                              f"{cache}/"), said[0]
    assert "No space left on device); compiling without it, into " in said[0]
    scratch = said[0].split("compiling without it, into ")[1]
    assert not os.path.exists(scratch)  # its entries are of no use once the process ends


@pytest.mark.cpu_only(HOST)
def test_a_process_leaves_no_empty_scratch_folder(tmp_path):
    """The compilers' scratch folder (TMPDIR/braze-cache-<pid>) is removed when the process
    ends; each process used to leave one behind."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, BRAZE_CACHE_DIR=str(tmp_path / "cache"), TMPDIR=str(tmp))
    r = subprocess.run([sys.executable, "-c", TWO_GRAPHS], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2", "0", "2", "0"], r.stderr  # both compiled, through scratch
    assert len(_entries(tmp_path / "cache")) == 2
    assert not list(tmp.iterdir())


@pytest.mark.cpu_only(HOST)
def test_a_cache_directory_deleted_during_a_run_is_made_again(monkeypatch, tmp_path, capfd):
    cache = tmp_path / "cache"
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(cache))
    before = braze.counters()
    x = torch.randn(8)
    torch.testing.assert_close(_compile(lambda x: x.sin() * 5, x)[0], x.sin() * 5)
    shutil.rmtree(cache)
    torch._dynamo.reset()
    torch.testing.assert_close(_compile(lambda x: x.cos() * 5, x)[0], x.cos() * 5)
    after = braze.counters()
    assert after["graphs_compiled"] - before["graphs_compiled"] == 2
    assert after["fallback_graphs"] == before["fallback_graphs"]
    entries = _entries(cache)
    assert len(entries) == 1 and _checksum_holds(entries[0])  # the second graph's
    assert "cannot be used" not in capfd.readouterr().err


@pytest.mark.cpu_only(HOST)
def test_a_cache_directory_deleted_and_blocked_during_a_run_compiles_without_it(
        monkeypatch, tmp_path, capfd):
    cache = tmp_path / "cache"
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(cache))
    before = braze.counters()
    x = torch.randn(8)
    torch.testing.assert_close(_compile(lambda x: x.sin() * 6, x)[0], x.sin() * 6)
    shutil.rmtree(cache)
    cache.write_text("a file where the cache was")  # the folder cannot be made again
    for k, op in enumerate((torch.cos, torch.tanh)):
        torch._dynamo.reset()
        out, said = _compile(lambda x: op(x) * (k + 6), x)
        torch.testing.assert_close(out, op(x) * (k + 6))
        assert said == []
    after = braze.counters()
    assert after["graphs_compiled"] - before["graphs_compiled"] == 3
    assert after["fallback_graphs"] == before["fallback_graphs"]
    err = capfd.readouterr().err
    assert err.count(f"braze: the cache directory {cache} cannot be used (") == 1, err


# --- two processes, one cache --------------------------------------------------------------

# Traces a graph, waits at a barrier (argv[1] + ".ready", then argv[2] exists), compiles and
# checks it, and prints its cache misses and hits.
RACE = """
import os, sys, time, torch, braze
f = torch.compile(lambda x: (x * 3).sin().sum(-1) + 1, backend="braze", dynamic=False)
x = torch.randn(16, 8)
open(sys.argv[1] + ".ready", "w").close()
while not os.path.exists(sys.argv[2]):
    time.sleep(0.005)
torch.testing.assert_close(f(x), (x * 3).sin().sum(-1) + 1)
c = braze.counters()
print(c["cache_misses"], c["cache_hits"], c["fallback_graphs"])
"""


@pytest.mark.cpu_only(HOST)
def test_two_processes_compiling_one_graph_into_one_cache_build_it_once(tmp_path):
    cache, go = tmp_path / "cache", tmp_path / "go"
    env = dict(os.environ, BRAZE_CACHE_DIR=str(cache))
    procs = [subprocess.Popen([sys.executable, "-c", RACE, str(tmp_path / f"p{i}"), str(go)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"p{i}.ready").exists() for i in range(2)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.005)
    go.touch()  # both compile now
    results = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
    counts = sorted(tuple(map(int, out.split())) for out, _ in results)
    assert counts == [(0, 1, 0), (1, 0, 0)], results  # one built it, the other found it
    entries = _entries(cache)
    assert len(entries) == 1 and _checksum_holds(entries[0])


# --- a damaged cache entry -----------------------------------------------------------------


def _damage(path, how):
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[:len(data) // 2])
    elif how == "flipped byte":
        i = len(data) // 2
        path.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:])
    elif how == "checksum removed":
        path.unlink()
    elif how == "checksum of another file":
        path.write_text(hashlib.sha256(b"another file").hexdigest())


@pytest.fixture(scope="module")
def two_entries(tmp_path_factory):
    """A cache holding TWO_GRAPHS' two entries."""
    cache = tmp_path_factory.mktemp("two-entries")
    first = _python(TWO_GRAPHS, cache)
    assert first.stdout.split() == ["2", "0", "2", "0"], first.stderr
    return cache


@pytest.mark.cpu_only(HOST)
@pytest.mark.parametrize("how", ["truncated", "flipped byte", "checksum removed",
                                 "checksum of another file"])
def test_a_damaged_cache_entry_is_compiled_again_not_loaded(two_entries, tmp_path, how):
    """The damaged entry is found in a fresh process, which would crash or compute garbage if it
    loaded it."""
    cache = tmp_path / "cache"
    shutil.copytree(two_entries, cache)
    entries = _entries(cache)
    assert len(entries) == 2
    victim = entries[0]
    _damage(victim if how in ("truncated", "flipped byte") else victim.with_suffix(".sha256"), how)
    second = _python(TWO_GRAPHS, cache)
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == ["2", "0", "1", "1"], second.stderr  # the damaged one rebuilt
    assert all(_checksum_holds(e) for e in _entries(cache))


@pytest.mark.cpu_only(HOST)
@pytest.mark.parametrize("how", ["truncated", "flipped byte", "checksum removed"])
def test_a_damaged_manifest_is_lowered_again(two_entries, tmp_path, how):
    """A manifest that fails its checksum is a miss: the graph is lowered again and finds its
    library in the cache, and the manifest is written anew."""
    cache = tmp_path / "cache"
    shutil.copytree(two_entries, cache)
    manifests = _entries(cache, ".manifest")
    assert len(manifests) == 2
    victim = manifests[0]
    _damage(victim if how != "checksum removed" else victim.with_name(victim.name + ".sha256"),
            how)
    env = dict(os.environ, BRAZE_CACHE_DIR=str(cache), BRAZE_LOG="cache")
    second = subprocess.run([sys.executable, "-c", TWO_GRAPHS], env=env, capture_output=True,
                            text=True)
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == ["2", "0", "0", "2"], second.stderr
    said = [line for line in second.stderr.splitlines() if line.endswith("(manifest)")]
    assert [line.split()[0] for line in said] == ["miss", "hit"] or \
        [line.split()[0] for line in said] == ["hit", "miss"], said
    assert all(_checksum_holds(m) for m in _entries(cache, ".manifest"))


NVRTC_SOURCE = 'extern "C" __global__ void twice(float *x) { x[threadIdx.x] *= 2.0f; }'


@pytest.mark.cpu_only("NVRTC runs on the host")
@pytest.mark.skipif(cuda_support.nvrtc_library() is None, reason="NVRTC not installed")
@pytest.mark.parametrize("how", ["truncated", "flipped byte"])
def test_a_damaged_cubin_is_compiled_again(tmp_path, how):
    (path,) = braze._C.nvrtc_compile(NVRTC_SOURCE, cuda_support.nvrtc_library(), 90,
                                     str(tmp_path))
    cubin = type(tmp_path)(path)
    good = cubin.read_bytes()
    _damage(cubin, how)
    assert braze._C.nvrtc_compile(NVRTC_SOURCE, cuda_support.nvrtc_library(), 90,
                                  str(tmp_path)) == [path]
    assert cubin.read_bytes() == good and _checksum_holds(cubin)


# --- NVRTC, cuBLASLt and the host compiler missing or failing --------------------------------


def _bad_libraries(tmp_path):
    """BRAZE_NVRTC values that cannot serve as NVRTC, with what the message says of each."""
    text = tmp_path / "libnvrtc.so.12"
    text.write_text("not a shared library")
    missing = tmp_path / "nowhere" / "libnvrtc.so.12"
    return {"missing": (str(missing), f"{missing}: cannot open shared object file: No such file"),
            "not a library": (str(text), f"{text}: "),
            "no NVRTC inside": ("libm.so.6", "it lacks nvrtcVersion")}


@pytest.fixture
def nvrtc_from_environment(monkeypatch):
    """cuda.nvrtc_library() reads BRAZE_NVRTC again while the test runs, and after it."""
    cuda_support.nvrtc_library.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    cuda_support.nvrtc_library.cache_clear()


@pytest.mark.graph_fallback("without NVRTC the graph runs in eager")
@pytest.mark.cpu_only("cuda_codegen_only compiles CUDA code on the host")
@pytest.mark.parametrize("what", ["missing", "not a library", "no NVRTC inside"])
def test_an_nvrtc_that_does_not_load_is_named_and_the_graph_runs_in_eager(
        nvrtc_from_environment, tmp_path, capfd, what):
    library, detail = _bad_libraries(tmp_path)[what]
    nvrtc_from_environment.setenv("BRAZE_NVRTC", library)
    nvrtc_from_environment.setenv("BRAZE_LOG", "fallback")
    expected = f"compile: cannot load NVRTC from {library}: "
    why = cuda_support.nvrtc_load_error(library)  # what unavailable_reason says on a GPU machine
    assert why.startswith(expected) and detail in why and why.endswith(
        "; set BRAZE_NVRTC to the path of libnvrtc.so"), why
    before = braze.counters()["fallback_graphs"]
    x = torch.randn(4, 8)
    out, said = _compile(lambda x: x.exp() + 1, x, options=Options(cuda_codegen_only=True))
    torch.testing.assert_close(out, x.exp() + 1)
    assert said == [f"braze cannot compile this graph: {why}; running this graph in eager "
                    "PyTorch"]
    assert braze.counters()["fallback_graphs"] == before + 1
    assert f"===== braze: fallback =====\nbraze cannot compile this graph: {why}" in \
        capfd.readouterr().err


def _compiler(tmp_path, what):
    """A BRAZE_CXX that is missing or fails, with the message braze gives for it."""
    if what == "missing":
        path = tmp_path / "no-such-g++"
        return path, (f"compile: host compiler '{path}' not found or not working: '{path} "
                      "--version' exit status 127; set BRAZE_CXX to a C++ compiler")
    path = tmp_path / "broken-g++"
    body = {"fails": 'echo "broken-g++: internal compiler error: out of memory" >&2; exit 4',
            "writes nothing": "exit 0"}[what]
    path.write_text(f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "broken-g++ 1.0"; exit 0; }}\n'
                    f"{body}\n")
    path.chmod(0o755)
    status = {"fails": "exit status 4", "writes nothing": "it wrote no library"}[what]
    return path, (f"compile: the host compiler '{path}' failed to compile the generated code "
                  f"({status}; the source is ")


@pytest.mark.graph_fallback("without a host compiler the graph runs in eager")
@pytest.mark.cpu_only(HOST)
@pytest.mark.parametrize("what", ["missing", "fails", "writes nothing"])
def test_a_missing_or_failing_host_compiler_is_named_and_the_graph_runs_in_eager(
        monkeypatch, tmp_path, capfd, what):
    compiler, message = _compiler(tmp_path, what)
    monkeypatch.setenv("BRAZE_CXX", str(compiler))
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("BRAZE_LOG", "fallback")
    before = braze.counters()["fallback_graphs"]
    x = torch.randn(4, 8)
    out, said = _compile(lambda x: x.exp() * 3, x)
    torch.testing.assert_close(out, x.exp() * 3)
    assert braze.counters()["fallback_graphs"] == before + 1
    assert len(said) == 1 and said[0].startswith(f"braze cannot compile this graph: {message}"), said
    assert said[0].endswith("; running this graph in eager PyTorch")
    if what == "fails":
        assert "broken-g++: internal compiler error: out of memory" in said[0]
    err = capfd.readouterr().err
    assert f"===== braze: fallback =====\nbraze cannot compile this graph: {message}" in err
    assert not _entries(tmp_path / "cache")


@pytest.mark.graph_fallback("without a host compiler the graph runs in eager")
@pytest.mark.cpu_only(HOST)
def test_a_graph_that_does_not_compile_runs_the_users_ops_not_brazes_decompositions(
        monkeypatch, tmp_path):
    """When a forward graph cannot compile, eager runs Dynamo's graph (the user's ops), not
    AOTAutograd's: braze's decompositions are written to be compiled, and a grouped product's
    (rows times every expert's weights, broadcast) would be far larger in eager. Here the
    grouped product runs as transformers' op itself, equal to eager."""
    compiler, _ = _compiler(tmp_path, "fails")
    monkeypatch.setenv("BRAZE_CXX", str(compiler))
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path / "cache"))
    pytest.importorskip("transformers.integrations.moe")  # registers the op
    grouped = torch.ops.transformers.grouped_mm_fallback
    x, w = torch.randn(40, 16), torch.randn(3, 16, 24)
    offs = torch.tensor([10, 25, 40], dtype=torch.int32)

    def fn(x, w, offs):
        return grouped(x, w, offs).sort(dim=0).values

    compiled = torch.compile(fn, backend="braze")
    before = braze.counters()["fallback_graphs"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled(x, w, offs)  # compiles, fails, falls back
    assert braze.counters()["fallback_graphs"] == before + 1
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = compiled(x, w, offs)
    torch.testing.assert_close(out, fn(x, w, offs))
    ran = {e.name for e in prof.events()}
    assert "transformers::grouped_mm_fallback" in ran, sorted(ran)
    assert not {"aten::searchsorted", "aten::mul"} & ran, sorted(ran)


# Compiles a matrix product on the GPU with BRAZE_CUBLASLT set to a missing library (in a fresh
# process: cuBLASLt is loaded once per process) and prints the fallback count and the warnings.
CUBLASLT = """
import warnings, torch, braze
a, b = torch.randn(64, 32, device="cuda"), torch.randn(32, 48, device="cuda")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = torch.compile(lambda a, b: a @ b, backend="braze")(a, b)
torch.testing.assert_close(out, a @ b)
print(braze.counters()["fallback_graphs"])
print("\\n".join(str(w.message) for w in caught if "braze" in str(w.message)))
"""


def test_a_cublaslt_that_does_not_load_is_named_and_the_graph_runs_in_eager(device, tmp_path):
    if device != "cuda":
        pytest.skip("cuBLASLt is loaded with a CUDA module")
    missing = tmp_path / "nowhere" / "libcublasLt.so.12"
    env = dict(os.environ, BRAZE_CACHE_DIR=str(tmp_path / "cache"), BRAZE_CUBLASLT=str(missing))
    r = subprocess.run([sys.executable, "-c", CUBLASLT], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    count, *said = r.stdout.splitlines()
    assert count == "1", r.stdout
    assert said == [f"braze cannot compile this graph: cannot load cuBLASLt library {missing}: "
                    f"{missing}: cannot open shared object file: No such file or directory; "
                    "running this graph in eager PyTorch"], r.stdout


@pytest.mark.graph_fallback("without NVRTC the graph runs in eager")
def test_an_nvrtc_that_does_not_load_sends_cuda_graphs_to_eager(device, nvrtc_from_environment,
                                                                tmp_path):
    if device != "cuda":
        pytest.skip("a graph on a CUDA device")
    missing = tmp_path / "nowhere" / "libnvrtc.so.12"
    nvrtc_from_environment.setenv("BRAZE_NVRTC", str(missing))
    why = cuda_support.unavailable_reason(torch.device("cuda", 0))
    assert why == (f"compile: cannot load NVRTC from {missing}: {missing}: cannot open shared "
                   "object file: No such file or directory; set BRAZE_NVRTC to the path of "
                   "libnvrtc.so")
    before = braze.counters()["fallback_graphs"]
    x = torch.randn(4, 8)
    out, said = _compile(lambda x: x.exp() + 2, x)
    torch.testing.assert_close(out, x.exp() + 2)
    assert braze.counters()["fallback_graphs"] == before + 1
