"""The compile report (BRAZE_REPORT, Options(report=...), braze.write_report): one HTML page
with a section per FX graph (its code and source lines, the ops left to eager with the reasons,
each partition's stages, fusion picture and kernels, the compile split, recompiles and CUDA-graph
decisions), every in-page link resolving, nothing fetched from elsewhere."""
import html.parser
import os
import subprocess
import sys
import warnings

import pytest
import torch

import braze

pytestmark = pytest.mark.cpu_only("the report's content; its CUDA notes come from the same code")


class _Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.links, self.sources, self.tags = [], [], [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if "id" in a:
            self.ids.append(a["id"])
        if tag == "a" and "href" in a:
            self.links.append(a["href"])
        for key in ("src", "srcset"):
            if key in a:
                self.sources.append(a[key])
        if tag == "link" and "href" in a:
            self.sources.append(a["href"])


def _parse(path):
    page = _Page()
    text = open(path).read()
    page.feed(text)
    return page, text


def _check_links(page):
    assert len(page.ids) == len(set(page.ids)), "duplicate ids"
    for href in page.links:
        assert href.startswith("#") and href[1:] in page.ids, f"broken link {href}"
    assert page.sources == [] and "script" not in page.tags  # self-contained


def test_a_report_with_a_partition_and_an_op_left_to_eager(tmp_path):
    torch._dynamo.reset()

    def f(a, b):
        x = torch.ceil(a) + torch.floor(b)
        z = torch.softmax(x.sum(1), 0)
        return (z * 10) ** 3 + torch.linalg.det(a[:, :4, :4].reshape(-1, 4, 4)).sum()
    g = torch.compile(f, backend="braze", options={"report": str(tmp_path)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g(torch.rand(8, 4, 4) + 1, torch.rand(8, 4, 4) + 1)
    path = braze.write_report(str(tmp_path / "page.html"))
    page, text = _parse(path)
    _check_links(page)
    graphs = [i for i in page.ids if i.startswith("graph-") and i.count("-") == 1]
    assert graphs, "no graph section"
    n = graphs[-1]
    for section in ("fx", "eager", "partitions", "times", "notes"):
        assert f"{n}-{section}" in page.ids
    assert "_linalg_det" in text and "class='fallback'" in text  # the op left to eager, why
    assert "x = torch.ceil(a) + torch.floor(b)" in text  # a node's source line
    assert "<svg" in text and "kernel0" in text
    assert any(i.endswith("-schedule") for i in page.ids)
    assert any(i.endswith("-kernel0") for i in page.ids)
    assert "static void kernel0(" in text  # generated code per kernel
    assert "host_compile" in text  # the compile split
    assert any(i.endswith("-signature") for i in page.ids)  # how each output is made
    assert "outputs:" in text and "inputs:" in text


def test_a_recompile_names_the_guard_that_failed(tmp_path):
    torch._dynamo.reset()
    g = torch.compile(lambda x: (x * 2).sin(), backend="braze",
                      options={"report": str(tmp_path)}, dynamic=False)
    g(torch.rand(8, 4))
    g(torch.rand(8, 4, dtype=torch.float64))  # a dtype guard fails: Dynamo compiles again
    page, text = _parse(braze.write_report(str(tmp_path / "page.html")))
    _check_links(page)
    notes = text[text.rindex("Recompiles and CUDA graphs"):]
    assert "recompile: Dynamo recompiled" in notes and "guard failed" in notes, notes[:2000]
    assert "dtype" in notes, notes[:2000]


def test_the_report_of_a_language_model(tmp_path):
    sys.path.insert(0, os.path.dirname(__file__))
    import zoo
    pytest.importorskip("transformers")
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, kwargs, _ = zoo.ENTRIES["gpt2"].build()
    before = braze.counters()["graphs"]
    g = torch.compile(model.eval(), backend="braze", options={"report": str(tmp_path)})
    with torch.no_grad():
        g(**kwargs)
    path = braze.write_report(str(tmp_path / "gpt2.html"))
    page, text = _parse(path)
    _check_links(page)
    sections = [i for i in page.ids if i.startswith("graph-") and i.count("-") == 1]
    assert len(sections) >= braze.counters()["graphs"] - before >= 1
    assert "none: braze compiled every op." in text
    dom = _browser_dom(path, tmp_path)
    if dom is not None:
        assert all(f'id="{s}"' in dom for s in sections) and "<svg" in dom


def _browser_dom(path, tmp_path):
    """The DOM headless chromium builds from the page at `path`, or None without chromium."""
    import shutil
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        return None
    run = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                          "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
                          "--dump-dom", f"file://{path}"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def test_braze_report_writes_a_page_at_exit(tmp_path):
    script = ("import torch, braze\n"
              "f = torch.compile(lambda x: torch.relu(x) * 2, backend='braze')\n"
              "f(torch.randn(5))\n")
    env = dict(os.environ, BRAZE_REPORT=str(tmp_path))
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=300)
    pages = [p for p in os.listdir(tmp_path) if p.startswith("braze-report-")]
    assert len(pages) == 1
    page, text = _parse(str(tmp_path / pages[0]))
    _check_links(page)
    assert "graph-1" in page.ids


def test_the_report_in_a_headless_browser(tmp_path):
    """Debian's chromium, headless (the Makefile installs it): the DOM it builds from the page
    has every section, and it renders a screenshot."""
    import shutil
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium on PATH")
    torch._dynamo.reset()
    g = torch.compile(lambda a, b: torch.softmax(torch.ceil(a) + torch.floor(b), -1) * 3,
                      backend="braze", options={"report": str(tmp_path)})
    g(torch.randn(4, 8), torch.randn(4, 8))
    path = braze.write_report(str(tmp_path / "seed.html"))
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([browser, *flags, "--dump-dom", f"file://{path}"],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    for needle in ("<h1>braze compile report</h1>", 'id="contents"', 'id="summary"',
                   "<svg", "kernel0", "Compile split"):
        assert needle in dom.stdout, needle
    shot = tmp_path / "page.png"
    subprocess.run([browser, *flags, f"--screenshot={shot}", "--window-size=1400,2000",
                    f"file://{path}"], capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 10000


def test_tlparse_shows_braze_code_next_to_dynamo_graphs(tmp_path):
    """Each partition's source goes to torch's structured trace (TORCH_TRACE): tlparse lists it
    as braze_output_code beside Dynamo's graphs."""
    import glob
    import shutil
    tlparse = shutil.which("tlparse") or os.path.join(os.path.dirname(sys.executable), "tlparse")
    if not os.path.exists(tlparse):
        pytest.skip("no tlparse")
    script = ("import torch, braze\n"
              "f = torch.compile(lambda a: torch.tanh(a * 3).sum(-1), backend='braze')\n"
              "f(torch.randn(4, 8))\n")
    env = dict(os.environ, TORCH_TRACE=str(tmp_path / "trace"))
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=300)
    logs = glob.glob(str(tmp_path / "trace" / "*.log"))
    assert logs
    subprocess.run([tlparse, logs[0], "-o", str(tmp_path / "out"), "--no-browser"], check=True,
                   capture_output=True, timeout=120)
    found = glob.glob(str(tmp_path / "out" / "**" / "braze_output_code_*.txt"), recursive=True)
    assert found and "static void kernel0(" in open(found[0]).read()
    assert "braze_output_code" in open(tmp_path / "out" / "index.html").read()
    assert glob.glob(str(tmp_path / "out" / "**" / "dynamo_output_graph_*.txt"), recursive=True)
