"""What braze's timing scripts share (benchmarks/cpu_suite.py, examples/demo.py): process set-up,
the seed example, and the measurement helpers of the methodology in /work/shared/ANCHORS.md.

prepare_process() must run before torch is imported, so this module imports torch only inside the
functions that need it.
"""
import atexit
import math
import os
import shutil
import statistics
import sys
import tempfile
import time

# glibc malloc returns big blocks to the OS (mmap/munmap, heap trimming) with a threshold that moves
# at run time, so eager's 16-128 MB temporaries cost a page fault per 4 KiB page in some runs and
# none in others (16 ms vs 1.8 ms for the seed example on one VM). Make every run the no-fault case,
# as jemalloc/tcmalloc would: the settings are read when the process starts, hence the re-exec.
MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}

# Other processes keeping more CPU cores busy than this while we time make the timings suspect.
BUSY_CORES_LIMIT = 0.15


def prepare_process(args, tmp_prefix):
    """Sets the process up for timing from the parsed command line (its .malloc, .threads and
    .warm_cache); call it before importing torch. Returns the fresh cache directory, or None with
    --warm-cache.

    * --malloc reuse: re-executes the running script with MALLOC_ENV if it is not set yet;
    * OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = --threads: the thread pools (torch's, the one
      braze's generated OpenMP code uses, and OpenBLAS's for braze's matrix products) must be
      sized before any is initialized;
    * unless --warm-cache: BRAZE_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR point into a fresh temporary
      directory (named tmp_prefix...), removed at exit, so both compiles are cold.
    """
    if args.malloc == "reuse" and any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):
        os.environ.update(MALLOC_ENV)
        sys.stdout.flush()
        script = os.path.abspath(sys.modules["__main__"].__file__)
        os.execv(sys.executable, [sys.executable, script] + sys.argv[1:])

    os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    if args.warm_cache:
        return None
    tmp = tempfile.mkdtemp(prefix=tmp_prefix)
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    os.environ["BRAZE_CACHE_DIR"] = os.path.join(tmp, "braze")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "inductor")
    return tmp


def seed_func(a, b):
    """The seed example."""
    x = a.ceil() + b.floor()
    y = x.sum(dim=-1)
    z = y.softmax(dim=-1)
    w = (z * 10) ** 3
    return w


# ----------------------------------------------------------------------------------------------
# Measurement


def call_s(fn, args):
    """Seconds one call fn(*args) takes."""
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def sample_s(fn, args, inner):
    """One sample: the mean seconds per call over `inner` back-to-back calls fn(*args)."""
    t = time.perf_counter()
    for _ in range(inner):
        fn(*args)
    return (time.perf_counter() - t) / inner


def eager_call_s(fn, args, calls):
    """Median seconds of `calls` calls: the "one eager call" subtracted from first compiled calls."""
    return statistics.median(call_s(fn, args) for _ in range(calls))


def inner_count(fn, args, warmup, min_sample_s):
    """Warms fn up with `warmup` calls; returns how many back-to-back calls make a sample last at
    least min_sample_s, judged by the fastest warm-up call."""
    per_call = max(min(call_s(fn, args) for _ in range(warmup)), 1e-7)
    return max(1, math.ceil(min_sample_s / per_call))


def prime_dynamo():
    """Dynamo and AOTAutograd have a one-time import/set-up cost in a process. Pay it on an
    unrelated function so it is charged to neither backend's compile time."""
    import torch

    torch._dynamo.reset()
    f = torch.compile(lambda x: (x * 2).relu(), backend="aot_eager")
    f(torch.randn(8, 8))
    torch._dynamo.reset()


def compile_s(first_call, eager_s):
    """Runs first_call() (the first call of a freshly compiled function); returns its result and
    the compile time: its seconds minus one eager call (eager_s)."""
    t = time.perf_counter()
    out = first_call()
    return out, time.perf_counter() - t - eager_s


def busy_cpu_s():
    """Seconds of CPU time the whole machine has spent busy, from /proc/stat (None elsewhere)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def own_cpu_s():
    t = os.times()
    return t.user + t.system


def settle(max_s=0.5, tick_s=0.005):
    """Waits, at most max_s, until this process's threads have stopped using CPU (less than a
    tenth of a core over tick_s). Thread pools that spin after a call returns would otherwise
    slow whatever runs next: OpenBLAS's workers, which braze's matrix products use, spin for
    2^28 cycles (~0.1 s of a core) by default; on GPT-2 (benchmarks/models.py) Inductor took
    36 ms alone and 80-115 ms right after a braze call."""
    deadline = time.perf_counter() + max_s
    while time.perf_counter() < deadline:
        c0 = time.process_time()
        time.sleep(tick_s)
        if time.process_time() - c0 < 0.1 * tick_s:
            return


def balanced_orders(names):
    """Every order of `names`, chained so that each one starts with the contender the one before
    ended with (and the last leads back to the first): taken in turn, each contender's samples
    follow each other contender's equally often, and otherwise its own."""
    import itertools
    perms = list(itertools.permutations(names))
    if len(perms) == 1:
        return perms
    # Hierholzer's walk over the graph whose edges are the orders, from their first name to
    # their last: every name has as many orders starting as ending with it.
    out = {n: [p for p in perms if p[0] == n] for n in names}
    stack, walk = [(None, names[0])], []
    while stack:
        order, at = stack[-1]
        if out[at]:
            nxt = out[at].pop()
            stack.append((nxt, nxt[-1]))
        else:
            stack.pop()
            if order is not None:
                walk.append(order)
    return walk[::-1]


def interleaved_samples(contenders, args, inner, repeats, settle_between=False):
    """Times the contenders named in `inner` (name -> calls per sample) interleaved: each repeat
    takes one sample_s of each in turn, so drift in the machine's state affects all alike. The
    repeats go through balanced_orders(), so each contender's samples follow each other
    contender's equally often: the calls after an eager sample are slower (on this 2-core machine
    the seed example took 0.32 ms a call right after eager and 0.19-0.21 otherwise, whichever
    backend it was), and a fixed order charged that to braze alone. (Rotating the order by one
    per repeat does not balance this: with three contenders the second one follows the first
    twice as often as the third does.) With settle_between, settle() runs before every
    sample, so no contender pays for threads another left spinning (each still pays for its own,
    within its sample).
    Returns (name -> list of seconds per call, foreign CPU cores), where foreign is how many cores
    other processes kept busy meanwhile (None where /proc/stat can't tell)."""
    samples = {k: [] for k in inner}
    busy0, own0, wall0 = busy_cpu_s(), own_cpu_s(), time.perf_counter()
    orders = balanced_orders(list(inner))
    for r in range(repeats):
        for k in orders[r % len(orders)]:
            if settle_between:
                settle()
            samples[k].append(sample_s(contenders[k], args, inner[k]))
    busy1, own1, wall1 = busy_cpu_s(), own_cpu_s(), time.perf_counter()
    if busy0 is None or busy1 is None:
        return samples, None
    return samples, max(0.0, (busy1 - busy0) - (own1 - own0)) / (wall1 - wall0)
