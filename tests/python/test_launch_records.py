"""Launch records as schedule data: CUDA's (plan-cuda, sched::CudaLaunch) and the CPU's
(plan-cpu, sched::CpuLaunch). --print=schedule writes each loop kernel's record, braze-opt
--launch reads records back, and code generation follows them. Read back unedited they give the
same code, for every lit graph; edited by hand they steer the code within what each kernel's
code can do (NVRTC compiles it; the CPU's still computes eager's answer), and a record asking for
more is an error that names the kernel, the field and the rule."""
import glob
import os
import re
import subprocess

import pytest

import braze
from braze import cuda as cuda_support
from _device import braze_opt

pytestmark = pytest.mark.cpu_only("braze-opt text: the schedule and the CUDA source")

LIT = os.path.join(os.path.dirname(__file__), "..", "lit")

# A sum of two aligned matrices (lanes), a softmax over rows of 768 (persistent rows) and sums
# per column (column mode, split in two stages).
GRAPH = """graph(%a: f32[1024, 1024], %b: f32[1024, 1024], %x: f32[4096, 768], %g: f32[8192, 512]) {
  %p = add(%a, %b) : f32[1024, 1024]
  %m = amax(%x) {dims=[1], keepdim=true} : f32[4096, 1]
  %c = sub(%x, %m) : f32[4096, 768]
  %e = exp(%c) : f32[4096, 768]
  %s = sum(%e) {dims=[1], keepdim=true} : f32[4096, 1]
  %y = div(%e, %s) : f32[4096, 768]
  %k = sum(%g) {dims=[0], keepdim=false} : f32[512]
  return %p, %y, %k
}
"""


def _opt(*args):
    return subprocess.run([braze_opt(), *args], capture_output=True, text=True)


def _record(schedule, kernel, kind="launch"):
    return re.search(rf"^{kernel} .*({kind}\{{[^}}]*\}})", schedule, re.M).group(1)


@pytest.mark.parametrize("flags, kind, least", [(["--cuda"], "launch", 60), ([], "cpu", 100)])
def test_records_read_back_give_the_same_code_for_every_lit_graph(tmp_path, flags, kind, least):
    compared = 0
    for path in sorted(glob.glob(os.path.join(LIT, "*.txt"))):
        schedule = _opt(path, *flags, "--print=schedule")
        if schedule.returncode != 0 or kind + "{" not in schedule.stdout:
            continue  # a graph braze refuses (the hostile-input tests), or no loop kernels
        records = tmp_path / "schedule.txt"
        records.write_text(schedule.stdout)
        planned = _opt(path, *flags, "--print=code")
        replayed = _opt(path, *flags, f"--launch={records}", "--print=code")
        assert planned.returncode == 0 and replayed.returncode == 0, replayed.stderr
        assert planned.stdout == replayed.stdout, os.path.basename(path)
        compared += 1
    assert compared >= least, compared


def _edited(tmp_path, edits, kind="launch"):
    """GRAPH's schedule (for CUDA, or the CPU with kind "cpu") with the records of `edits`."""
    graph = tmp_path / "g.txt"
    graph.write_text(GRAPH)
    flags = ["--cuda"] if kind == "launch" else []
    schedule = _opt(str(graph), *flags, "--print=schedule").stdout
    for kernel, record in edits.items():
        schedule = schedule.replace(_record(schedule, kernel, kind), record)
    records = tmp_path / "edited.txt"
    records.write_text(schedule)
    return graph, records


def test_the_planned_records(tmp_path):
    schedule = _opt(str(_edited(tmp_path, {})[0]), "--cuda", "--print=schedule").stdout
    assert _record(schedule, "kernel0") == "launch{block=256 vec=4}"
    assert _record(schedule, "kernel1") == \
        "launch{block=256 threads=64 vec=4 persistent iters=3}"
    assert _record(schedule, "kernel2") == "launch{block=256 threads=64 vec=4 columns=4}"


@pytest.mark.skipif(cuda_support.nvrtc_library() is None, reason="NVRTC not installed")
def test_edited_records_steer_the_code_and_it_compiles(tmp_path):
    graph, records = _edited(tmp_path, {
        "kernel0": "launch{block=128 vec=2}",
        "kernel1": "launch{block=128 threads=128 vec=2 persistent iters=3}",
        "kernel2": "launch{block=512 threads=32 vec=1 columns=16 persistent iters=16}",
    })
    printed = _opt(str(graph), "--cuda", f"--launch={records}", "--print=schedule")
    assert printed.returncode == 0, printed.stderr
    assert "launch{block=128 threads=128 vec=2 persistent iters=3}" in printed.stdout
    code = _opt(str(graph), "--cuda", f"--launch={records}", "--print=code")
    assert code.returncode == 0, code.stderr
    text = code.stdout
    assert "__launch_bounds__(128) kernel0(" in text and "__launch_bounds__(128) kernel1(" in text
    assert "__launch_bounds__(512) kernel2(" in text
    assert "const int64_t row_raw = (int64_t)blockIdx.x * 16 + threadIdx.x % 16;" in text
    assert "for (int it = 0; it < 16; ++it) {" in text
    device = text.split("\n#include <stdint.h>\n")[0]  # the host source follows
    paths = braze._C.nvrtc_compile(device, cuda_support.nvrtc_library(), 90, str(tmp_path))
    assert paths


@pytest.mark.skipif(cuda_support.nvrtc_library() is None, reason="NVRTC not installed")
@pytest.mark.parametrize("record, first_row", [
    ("launch{block=256 threads=64 vec=2 columns=4}", "(int64_t)(threadIdx.x % 4) * 2"),
    ("launch{block=1024 threads=32 vec=4 columns=32}", "(int64_t)(threadIdx.x % 32) * 4"),
])
def test_column_lanes_compile(tmp_path, record, first_row):
    """Column lanes (vec neighbouring columns a thread) under records other than the plan's."""
    graph, records = _edited(tmp_path, {"kernel2": record})
    code = _opt(str(graph), "--cuda", f"--launch={records}", "--print=code")
    assert code.returncode == 0, code.stderr
    assert first_row in code.stdout and "_l1 +=" in code.stdout
    device = code.stdout.split("\n#include <stdint.h>\n")[0]
    assert braze._C.nvrtc_compile(device, cuda_support.nvrtc_library(), 90, str(tmp_path))


@pytest.mark.parametrize("kernel, record, says", [
    ("kernel1", "launch{block=100 threads=64 vec=4 persistent iters=3}", "multiple of 32"),
    ("kernel1", "launch{block=2048 threads=64 vec=4 persistent iters=3}", "up to 1024"),
    ("kernel1", "launch{block=256 threads=64 vec=8 persistent iters=2}", "dividing 4"),
    ("kernel1", "launch{block=256 threads=512 vec=4}", "divides block"),
    ("kernel1", "launch{block=256 threads=48 vec=4}", "power of two"),
    ("kernel1", "launch{block=256 threads=64 vec=4 persistent iters=5}", "takes iters=3"),
    ("kernel1", "launch{block=256 threads=64 vec=4 iters=3}", "go with persistent"),
    ("kernel1", "launch{block=256 threads=64 vec=4 spread=4}", "pointwise kernels"),
    ("kernel1", "launch{block=256 threads=32 vec=1 columns=8}", "not neighbouring columns"),
    ("kernel1", "launch{block=1024 threads=1 vec=1 persistent iters=768}", "at most 64"),
    ("kernel0", "launch{block=256 threads=32 vec=4}", "kernels with an inner loop"),
    ("kernel0", "launch{block=256 vec=2 spread=4}", "spread needs vec=1"),
    ("kernel0", "launch{block=256 vec=4 groups=2}", "this kernel has one"),
    ("kernel1", "launch{block=256 threads=64 vec=4 spread=2 persistent iters=3}",
     "spread applies to pointwise kernels"),
    ("kernel1", "launch{block=256 threads=64 vec=4 groups=2 persistent iters=3}",
     "groups needs independent member groups"),
    ("kernel2", "launch{block=1024 threads=64 vec=1 columns=8 persistent iters=32}",
     "block = R x threads"),
    ("kernel2", "launch{block=1024 threads=128 vec=8 columns=8}", "dividing 4"),
    ("kernel2", "launch{block=512 threads=256 vec=4 columns=2 persistent iters=8}",
     "not persistent"),
    ("kernel1", "launch{block=256 threads=64 vec=4 persistent iters=3 colour=2}",
     "unknown field 'colour'"),
    ("kernel1", "launch{block=256 threads=64 vec=four}", "positive number, got 'four'"),
    ("kernel1", "launch{threads=64 vec=4}", "needs block= and vec="),
    ("kernel1", "launch{block=256 threads=64 vec=4 persistent iters=3 quickly}",
     "unknown word 'quickly'"),
])
def test_a_record_beyond_its_kernel_is_an_error(tmp_path, kernel, record, says):
    graph, records = _edited(tmp_path, {kernel: record})
    run = _opt(str(graph), "--cuda", f"--launch={records}", "--print=code")
    assert run.returncode != 0 and says in run.stderr, run.stderr
    assert "--launch" in run.stderr and kernel in run.stderr


# Three independent pointwise groups (an optimizer's same-sized parameters, in small).
GROUPS = """graph(%a: f32[4096], %b: f32[4096], %c: f32[4096], %s: f32[]) {
  %x = mul(%a, %s) : f32[4096]
  %y = add(%b, %s) : f32[4096]
  %w = mul(%c, %c) : f32[4096]
  return %x, %y, %w
}
"""


def test_member_groups_are_a_record_field(tmp_path):
    """plan-cuda gives each independent group blocks of its own (groups=3); a record may turn
    that off (groups=1: every block runs every member) but not ask for another count."""
    graph = tmp_path / "g.txt"
    graph.write_text(GROUPS)
    schedule = _opt(str(graph), "--cuda", "--print=schedule").stdout
    assert _record(schedule, "kernel0") == "launch{block=256 vec=4 groups=3}"
    records = tmp_path / "r.txt"
    for record, ok in [("launch{block=256 vec=4}", True), ("launch{block=128 vec=4 groups=3}", True),
                       ("launch{block=256 vec=4 groups=2}", False)]:
        records.write_text(schedule.replace(_record(schedule, "kernel0"), record))
        run = _opt(str(graph), "--cuda", f"--launch={records}", "--print=code")
        assert (run.returncode == 0) == ok, run.stderr
        if not ok:
            assert "groups must be 1 or 3" in run.stderr
            continue
        grouped = "groups=3" in record
        assert ("const int64_t group = (int64_t)blockIdx.x / group_blocks;" in run.stdout) == grouped
        block = re.search(r"__launch_bounds__\((\d+)\) kernel0", run.stdout).group(1)
        # the kernel's points per block follow the record's block, as its launch does
        assert f"* {block} + threadIdx.x) * 4;" in run.stdout
        assert f"{block} * 4 - 1) / ({block} * 4)" in run.stdout


# Two layer norms' weight and bias gradients over one row space: two independent groups of
# column sums, too long to keep in registers.
ROW_GROUPS = """graph(%g1: f32[32768, 768], %g2: f32[32768, 768], %x1: f32[32768, 768]) {
  %b1 = sum(%g1) {dims=[0], keepdim=false} : f32[768]
  %p1 = mul(%g1, %x1) : f32[32768, 768]
  %w1 = sum(%p1) {dims=[0], keepdim=false} : f32[768]
  %b2 = sum(%g2) {dims=[0], keepdim=false} : f32[768]
  return %b1, %w1, %b2
}
"""


def test_row_kernels_take_member_groups_too(tmp_path):
    """A row kernel's independent groups of reductions run over blocks of their own (groups=2);
    a record may turn that off, but not ask for another count, nor groups with persistent
    rows. (The values each way are checked on a GPU, in test_nn and test_models.)"""
    graph = tmp_path / "g.txt"
    graph.write_text(ROW_GROUPS)
    schedule = _opt(str(graph), "--cuda", "--print=schedule").stdout
    planned = _record(schedule, "kernel0")
    assert "groups=2" in planned and "persistent" not in planned, planned
    records = tmp_path / "r.txt"
    for record, says in [(planned, None), (planned.replace(" groups=2", ""), None),
                         (planned.replace("groups=2", "groups=3"), "groups must be 1 or 2"),
                         (planned.replace("}", " persistent iters=128}"),
                          "groups needs rows that are not persistent")]:
        records.write_text(schedule.replace(planned, record))
        run = _opt(str(graph), "--cuda", f"--launch={records}", "--print=code")
        assert (run.returncode == 0) == (says is None), run.stderr
        if says:
            assert says in run.stderr, run.stderr
            continue
        grouped = "groups=2" in record
        assert ("switch (group) {" in run.stdout) == grouped
        assert ("const int64_t blocks = 2 * (" in run.stdout) == grouped


def test_records_for_kernels_the_schedule_does_not_have_are_errors(tmp_path):
    graph = tmp_path / "g.txt"
    graph.write_text(GRAPH)
    for text, says in [("kernel9 outer [] launch{block=256 vec=1}\n", "no kernel kernel9"),
                       ("kernel1 outer [] launch{block=256 vec=1\n", "no closing '}'"),
                       ("kernel1 a launch{block=256 threads=64 vec=4 persistent iters=3}\n" * 2,
                        "a second record for kernel1"),
                       ("no records here\n", "has no launch record")]:
        records = tmp_path / "r.txt"
        records.write_text(text)
        run = _opt(str(graph), "--cuda", f"--launch={records}", "--print=code")
        assert run.returncode != 0 and says in run.stderr, (text, run.stderr)
    run = _opt(str(graph), f"--launch={records}", "--print=code")
    assert run.returncode != 0 and "has no cpu record" in run.stderr


def test_help_lists_the_back_half_steps_in_order():
    """The back half is Pipeline.def's LOOP_STEP rows, which lowering walks in order."""
    text = _opt("--help").stdout
    back = text.split("the back half's steps")[1]
    names = [line.split()[0] for line in back.splitlines()[1:] if line.strip()]
    assert names == ["schedule", "plan-cuda", "plan-cpu", "codegen"], back


# ---- the CPU's records ---------------------------------------------------------------------

def test_the_planned_cpu_records(tmp_path):
    schedule = _opt(str(_edited(tmp_path, {}, "cpu")[0]), "--print=schedule").stdout
    assert _record(schedule, "kernel0", "cpu") == "cpu{parallel=1 simd}"
    assert _record(schedule, "kernel1", "cpu") == "cpu{parallel=1}"
    assert _record(schedule, "kernel2", "cpu") == "cpu{lanes=16 along=x0}"


def test_edited_cpu_records_steer_the_code_and_it_still_computes(tmp_path):
    import torch
    from safetensors.torch import save_file
    graph, records = _edited(tmp_path, {"kernel0": "cpu{parallel=0}",
                                        "kernel1": "cpu{parallel=0}",
                                        "kernel2": "cpu{lanes=4 along=x0}"}, "cpu")
    printed = _opt(str(graph), f"--launch={records}", "--print=schedule")
    assert printed.returncode == 0, printed.stderr
    assert "cpu{lanes=4 along=x0}" in printed.stdout
    code = _opt(str(graph), f"--launch={records}", "--print=code")
    assert code.returncode == 0, code.stderr
    kernels = code.stdout.split("static void kernel")
    assert "#pragma omp parallel" not in kernels[1] and "#pragma omp simd" in kernels[1]
    assert "#pragma omp parallel" not in kernels[2]
    assert "x0b += 4) {" in kernels[3] and "[4];" in kernels[3]
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(1024, 1024, generator=g), torch.randn(1024, 1024, generator=g)
    x, k = torch.randn(4096, 768, generator=g), torch.randn(8192, 512, generator=g)
    tensors = {"a": a, "b": b, "x": x, "g": k, "expected:0": a + b,
               "expected:1": torch.softmax(x, 1), "expected:2": k.sum(0)}
    save_file(tensors, str(tmp_path / "t.safetensors"), metadata={"atol": "1e-4", "rtol": "1e-4"})
    run = _opt(str(graph), f"--launch={records}", f"--run={tmp_path / 't.safetensors'}")
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("kernel, record, says", [
    ("kernel0", "cpu{region}", "region is for kernels without outer loops"),
    ("kernel1", "cpu{parallel=3}", "parallel must be at most 1"),
    ("kernel1", "cpu{parallel=1 simd}", "simd needs every outer loop parallel"),
    ("kernel0", "cpu{groups}", "groups needs one outer loop"),
    ("kernel0", "cpu{lanes=16 along=x0}", "lanes apply to loop kernels with an inner loop"),
    ("kernel2", "cpu{lanes=12 along=x0}", "power of two"),
    ("kernel2", "cpu{lanes=16 along=x3}", "along must be an outer variable"),
    ("kernel2", "cpu{lanes=16 along=y0}", "must name an outer variable"),
    ("kernel1", "cpu{parallel=1 fast}", "unknown word 'fast'"),
    ("kernel1", "cpu{threads=4}", "unknown field 'threads'"),
    ("kernel1", "cpu{lanes=16}", "needs exactly one of"),
    ("kernel1", "cpu{parallel=1 region}", "needs exactly one of"),
    ("kernel1", "cpu{parallel=1 along=x0}", "along= with lanes="),
    ("kernel1", "cpu{parallel=-1}", "non-negative number, got '-1'"),
])
def test_a_cpu_record_beyond_its_kernel_is_an_error(tmp_path, kernel, record, says):
    graph, records = _edited(tmp_path, {kernel: record}, "cpu")
    run = _opt(str(graph), f"--launch={records}", "--print=code")
    assert run.returncode != 0 and says in run.stderr, run.stderr
    assert "--launch" in run.stderr and kernel in run.stderr
