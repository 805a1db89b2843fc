"""Failures never break the user's program, and never return a wrong answer silently."""
import warnings

import pytest
import torch

import braze


def fn(x):
    return (x.exp() + 1).sum(-1)


@pytest.mark.graph_fallback("an internal error sends the graph to eager")
def test_internal_error_falls_back_with_one_warning(monkeypatch):
    monkeypatch.setenv("BRAZE_CXX", "/bin/false")  # the host compiler "fails"
    monkeypatch.setenv("BRAZE_CACHE_DIR", "/tmp/braze-test-broken-cxx")
    x = torch.randn(8, 16)
    before = braze.counters()["fallback_graphs"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(fn, backend="braze")(x)
    torch.testing.assert_close(out, fn(x))
    assert braze.counters()["fallback_graphs"] == before + 1
    msgs = [str(w.message) for w in caught if "braze" in str(w.message)]
    assert len(msgs) == 1 and "running this graph in eager PyTorch" in msgs[0]


def test_strict_raises(monkeypatch):
    monkeypatch.setenv("BRAZE_CXX", "/bin/false")
    monkeypatch.setenv("BRAZE_CACHE_DIR", "/tmp/braze-test-broken-cxx")
    monkeypatch.setenv("BRAZE_STRICT", "1")
    with pytest.raises(Exception, match="host compiler '/bin/false' not found|failed to compile"):
        torch.compile(fn, backend="braze")(torch.randn(4, 4))


def test_compile_error_names_op_and_node():
    g = braze._C.Graph()
    x = g.input("x", "f32", [g.sym_const(2), g.sym_const(3)], [])
    g.set_name("view_7")
    with pytest.raises(braze.CompileError, match=r"reshape \(node 'view_7'\): 6 elements cannot become \[4, 2\]"):
        g.reshape(x, [g.sym_const(4), g.sym_const(2)])


def test_backend_registered_by_entry_point_once():
    from importlib.metadata import entry_points
    names = [e.name for e in entry_points(group="torch_dynamo_backends")]
    assert names.count("braze") == 1
    assert "braze" in torch._dynamo.list_backends()


def test_counters_have_the_documented_keys():
    c = braze.counters()
    for key in ("graphs", "partitions", "recompiles", "graphs_compiled", "kernels_generated",
                "cache_hits", "cache_misses", "fallback_ops", "fallback_graphs",
                "deferred_kernels_loaded"):
        assert isinstance(c[key], int)
    assert all(isinstance(n, int) for n in braze.fallback_ops_by_op().values())


def test_cache_hit_in_a_fresh_process(tmp_path):
    import subprocess
    import sys
    script = (
        "import torch, braze\n"
        "f = torch.compile(lambda x: (x * 2).sin().sum(-1), backend='braze', dynamic=False)\n"
        "x = torch.randn(8, 8)\n"
        "torch.testing.assert_close(f(x), (x * 2).sin().sum(-1))\n"
        "c = braze.counters(); print(c['cache_hits'], c['cache_misses'])\n")
    env = dict(__import__("os").environ, BRAZE_CACHE_DIR=str(tmp_path), BRAZE_LOG="cache")
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert first.stdout.split() == ["0", "1"], first.stderr
    assert second.stdout.split() == ["1", "0"], second.stderr
    # The second process loads the graph through the first one's manifest: no lowering, and
    # no lookup of the library by its source.
    said = [line.split()[0] for line in second.stderr.splitlines()
            if line.startswith(("hit ", "miss "))]
    assert "miss" in first.stderr and said == ["hit"], second.stderr
    assert "(manifest)" in second.stderr


def test_a_second_install_of_the_same_build_hits_the_cache(tmp_path):
    """The cache names braze's build by content: a copy of the package in another directory,
    with a newer modification time (a reinstall, another machine), loads what the first
    install compiled."""
    import os
    import shutil
    import subprocess
    import sys
    copy = tmp_path / "elsewhere" / "braze"
    shutil.copytree(os.path.dirname(braze.__file__), copy,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for f in copy.iterdir():
        os.utime(f)  # now: not the installed files' times
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]) if sys.argv[1] else None\n"
        "import torch, braze\n"
        "print(braze.__file__, file=sys.stderr)\n"
        "f = torch.compile(lambda x: (x * 3).cos().sum(-1), backend='braze', dynamic=False)\n"
        "x = torch.randn(8, 8)\n"
        "torch.testing.assert_close(f(x), (x * 3).cos().sum(-1))\n"
        "c = braze.counters(); print(c['cache_hits'], c['cache_misses'])\n")
    env = dict(os.environ, BRAZE_CACHE_DIR=str(tmp_path / "cache"), BRAZE_LOG="cache")
    first = subprocess.run([sys.executable, "-c", script, ""], env=env, capture_output=True,
                           text=True)
    second = subprocess.run([sys.executable, "-c", script, str(copy.parent)], env=env,
                            capture_output=True, text=True)
    assert first.stdout.split() == ["0", "1"], first.stderr
    assert str(copy) in second.stderr, second.stderr  # the copy ran
    assert second.stdout.split() == ["1", "0"], second.stderr
    assert "(manifest)" in second.stderr


_SHARED_SCRIPT = (
    "import torch, braze\n"
    "f = torch.compile(lambda x: (x * 5).tanh().sum(-1), backend='braze', dynamic=False)\n"
    "x = torch.randn(8, 8)\n"
    "torch.testing.assert_close(f(x), (x * 5).tanh().sum(-1))\n"
    "c = braze.counters(); print(c['cache_hits'], c['cache_misses'])\n")


def _run_with_caches(local, remote, install=None):
    """The shared-cache script in a new process; with `install`, a folder holding another copy
    of the braze package, imported from there."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, BRAZE_CACHE_DIR=str(local), BRAZE_REMOTE_CACHE=remote,
               BRAZE_LOG="cache")
    script = _SHARED_SCRIPT
    if install is not None:
        env["PYTHONPATH"] = str(install) + os.pathsep + env.get("PYTHONPATH", "")
        script = (f"import braze; assert braze.__file__.startswith({str(install)!r}), "
                  f"braze.__file__\n" + script)
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True)


def test_a_shared_cache_serves_a_process_with_an_empty_local_cache(tmp_path):
    """BRAZE_REMOTE_CACHE=file:///folder: the first process compiles and stores its entry in
    its own cache and in the shared one; a second process, with an empty cache of its own,
    copies the entry in and compiles nothing. A damaged shared entry is a miss, not a crash."""
    shared = tmp_path / "shared"
    first = _run_with_caches(tmp_path / "a", f"file://{shared}")
    second = _run_with_caches(tmp_path / "b", f"file://{shared}")
    assert first.stdout.split() == ["0", "1"], first.stderr
    assert second.stdout.split() == ["1", "0"], second.stderr
    assert f"from {shared}" in second.stderr and "(manifest)" in second.stderr
    # Flip a byte of every shared library: a third process, again with an empty local cache,
    # finds the shared entry damaged and compiles (and stores a good one again).
    for lib in shared.rglob("*.so"):
        data = bytearray(lib.read_bytes())
        data[len(data) // 2] ^= 0xFF
        lib.write_bytes(bytes(data))
    third = _run_with_caches(tmp_path / "c", f"file://{shared}")
    assert third.returncode == 0 and third.stdout.split()[1] == "1", third.stderr


def test_a_shared_cache_that_cannot_be_used_is_said_once(tmp_path):
    """A URL braze does not take, or a shared folder that is a file: the compile works with the
    local cache alone, and says why once."""
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("x")
    for i, (remote, said) in enumerate(((f"redis://127.0.0.1:1", "does not answer"),
                                        ("http://127.0.0.1:1", "expected file:///path"),
                                        (f"file://{blocked}", "cannot be used"))):
        run = _run_with_caches(tmp_path / f"local{i}", remote)
        assert run.returncode == 0 and run.stdout.split() == ["0", "1"], run.stderr
        assert run.stderr.count(said) == 1, run.stderr


class _Redis:
    """A redis-server of its own on a free port (Debian's; the Makefile installs it)."""

    def __init__(self, tmp_path):
        import shutil
        import socket
        import subprocess
        import time
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.skip("no redis-server on PATH")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen([exe, "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.1).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        pytest.skip("redis-server did not start")

    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def command(self, *words):
        """One command's raw reply (RESP)."""
        import socket
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
            req = f"*{len(words)}\r\n" + "".join(f"${len(w)}\r\n{w}\r\n" for w in words)
            s.sendall(req.encode())
            return s.recv(1 << 20)

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def test_a_redis_cache_serves_a_process_with_an_empty_local_cache(tmp_path):
    """BRAZE_REMOTE_CACHE=redis://host:port: the first process compiles and stores its entry
    in Redis; a second one, with an empty local cache of its own, compiles nothing (a cache hit
    copied from the server). A damaged value in Redis is a miss, and a server killed before a
    process starts costs one timeout, said once: the process compiles and is right."""
    import os
    import shutil
    redis = _Redis(tmp_path)
    # The second process runs another install of braze, in another directory.
    other = tmp_path / "other-install"
    shutil.copytree(os.path.dirname(braze.__file__), other / "braze")
    try:
        first = _run_with_caches(tmp_path / "a", redis.url())
        second = _run_with_caches(tmp_path / "b", redis.url(), install=other)
        assert first.stdout.split() == ["0", "1"], first.stderr
        assert "stored" in first.stderr and "in remote redis://" in first.stderr
        assert second.stdout.split() == ["1", "0"], second.stderr
        assert "from remote redis://" in second.stderr
        # Damage every stored library: a third process finds the entry bad and compiles.
        keys = redis.command("KEYS", "braze:*:file:*.so").decode().split("\r\n")
        libs = [k for k in keys if k.startswith("braze:")]
        assert libs
        for k in libs:
            redis.command("SET", k, "not a library")
        third = _run_with_caches(tmp_path / "c", redis.url())
        assert third.returncode == 0 and third.stdout.split() == ["0", "1"], third.stderr
    finally:
        redis.stop()
    fourth = _run_with_caches(tmp_path / "d", redis.url())
    assert fourth.returncode == 0 and fourth.stdout.split() == ["0", "1"], fourth.stderr
    assert fourth.stderr.count("does not answer") == 1, fourth.stderr


class _BrokenRedis:
    """A server that takes Redis connections and fails in the middle of a reply: it reads the
    request, then sends nothing (`hang`), half a value before closing (`cut`), a reply no Redis
    sends (`garbage`), or a value longer than any braze stores (`huge`)."""

    def __init__(self, mode):
        import socket
        import threading
        self.mode, self.stopped = mode, threading.Event()
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(8)
        self.server.settimeout(0.1)
        self.port = self.server.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        import socket
        held = []
        while not self.stopped.is_set():
            try:
                conn, _ = self.server.accept()
            except socket.timeout:
                continue
            conn.settimeout(2)
            try:
                conn.recv(1 << 16)
                if self.mode == "cut":
                    conn.sendall(b"$1000\r\nhalf a value")
                    conn.close()
                elif self.mode == "garbage":
                    conn.sendall(b"*not a reply\r\n")
                elif self.mode == "huge":
                    conn.sendall(b"$4611686018427387904\r\nxx")
                held.append(conn)  # `hang`: open and silent
            except OSError:
                pass
        for c in held:
            c.close()

    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def stop(self):
        self.stopped.set()
        self.thread.join()
        self.server.close()


@pytest.mark.parametrize("mode", ["hang", "cut", "garbage", "huge"])
def test_a_redis_server_failing_mid_reply_costs_one_message(tmp_path, mode):
    """A Redis server that stops answering, closes, or answers nonsense in the middle of a reply:
    the process gives up on it once (a timeout at most), says so once, compiles with its local
    cache alone, and is right."""
    server = _BrokenRedis(mode)
    try:
        run = _run_with_caches(tmp_path / "local", server.url())
    finally:
        server.stop()
    assert run.returncode == 0 and run.stdout.split() == ["0", "1"], run.stderr
    assert run.stderr.count("does not answer") == 1, run.stderr
    if mode == "huge":  # refused at once, not buffered
        assert "over braze's limit" in run.stderr, run.stderr


def test_gather_index_longer_than_input_is_rejected():
    g = braze._C.Graph()
    two, three, four, five = (g.sym_const(n) for n in (2, 3, 4, 5))
    x = g.input("x", "f32", [three, four], [four, g.sym_const(1)])
    i = g.input("i", "i64", [five, two], [two, g.sym_const(1)])
    g.set_name("gather_1")
    with pytest.raises(braze._C.CompileError, match=r"gather \(node 'gather_1'\): index dim 0 is 5"):
        g.gather(x, 1, i)


def test_overflowing_sizes_are_a_clear_error():
    """Size arithmetic that overflows int64 raises, naming the operands, instead of wrapping
    around to a small or negative size."""
    g = braze._C.Graph()
    big = g.sym_const(2**62)
    with pytest.raises(braze.CompileError,
                       match=r"integer overflow: 4611686018427387904 \* 4611686018427387904 does "
                             r"not fit in 64 bits"):
        g.sym_binary("mul", big, big)


def test_negative_dims_are_a_clear_error():
    g = braze._C.Graph()
    with pytest.raises(braze.CompileError, match=r"input \(node 'x'\): dim 1 is -3; sizes must be "
                                                 r"non-negative"):
        g.input("x", "f32", [g.sym_const(2), g.sym_const(-3)], [])


def test_an_op_kind_of_the_wrong_family_is_a_clear_error():
    """The graph API takes op kinds (Ops.def's enum); one of another family, or an unknown text
    name, is a CompileError naming it."""
    K = braze._C.OpKind
    g = braze._C.Graph()
    x = g.input("x", "f32", [g.sym_const(3)], [])
    with pytest.raises(braze.CompileError, match=r"sum: is not an elementwise op"):
        g.elementwise(K.Sum, [x])
    with pytest.raises(braze.CompileError, match=r"exp: is not a reduction"):
        g.reduce(K.Exp, x, [], False, None)
    with pytest.raises(braze.CompileError, match=r"exp: is not a scan"):
        g.scan(K.Exp, x, 0, None)
    with pytest.raises(braze.CompileError, match=r"frob: unknown op"):
        braze._C.op_kind("frob")
    assert braze._C.op_kind("bessel_i0") == K.BesselI0


@pytest.mark.cpu_only("the graph API does not touch a device")
@pytest.mark.parametrize("use", ["print", "check_supported", "builder", "shape", "output",
                                 "sym_const"])
def test_a_compiled_graph_object_raises_on_every_later_use(use):
    """compile() consumes the graph: a later call raises instead of using freed memory."""
    g = braze._C.Graph()
    a = g.input("a", "f32", [g.sym_const(4)], [])
    g.output([g.elementwise(braze._C.OpKind.Exp, [a])])
    g.compile()
    calls = {"print": lambda: g.print(), "check_supported": lambda: g.check_supported(),
             "builder": lambda: g.elementwise(braze._C.OpKind.Exp, [a]), "shape": lambda: g.shape(a),
             "output": lambda: g.output([a]), "sym_const": lambda: g.sym_const(3)}
    with pytest.raises(braze.CompileError, match="consumed by compile"):
        calls[use]()


@pytest.mark.cpu_only("the host-side cache is the same for every device")
def test_an_unusable_cache_directory_compiles_without_it(monkeypatch, tmp_path, capfd):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(blocker / "cache"))  # cannot be created
    before = braze.counters()
    for k, op in enumerate((torch.sin, torch.cos, torch.tanh)):
        torch._dynamo.reset()
        x = torch.randn(8)
        f = torch.compile(lambda x: op(x) * (k + 2), backend="braze")
        torch.testing.assert_close(f(x), op(x) * (k + 2))
    after = braze.counters()
    assert after["fallback_graphs"] == before["fallback_graphs"]
    assert after["graphs_compiled"] - before["graphs_compiled"] == 3
    err = capfd.readouterr().err
    assert err.count("cannot be used") == 1, err  # said once, not per graph
