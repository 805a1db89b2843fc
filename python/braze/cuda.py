"""The CUDA side of the backend: finding NVRTC and cuBLASLt (PyTorch's CUDA wheels install
both), describing the device to the compiler, and the callable that runs a compiled CUDA graph
on PyTorch's current stream with outputs PyTorch allocates (and so owns and frees)."""
import ctypes
import functools
import glob
import os
import site
import sys

import torch

from braze import _C
from braze.cpu import blas_library, into_arguments, outputs_into


def _library_dirs():
    dirs = []
    roots = list(site.getsitepackages()) + [site.getusersitepackages()]
    roots += [p for p in sys.path if p.endswith("site-packages")]
    for root in dict.fromkeys(roots):
        dirs += sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib")))
        dirs.append(os.path.join(root, "torch", "lib"))
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    dirs += [os.path.join(cuda_home, "lib64"), os.path.join(cuda_home, "lib")]
    return [d for d in dirs if os.path.isdir(d)]


def _version_key(path):
    digits = [int(p) for p in os.path.basename(path).split(".so")[-1].split(".") if p.isdigit()]
    return digits


def find_library(stem, env):
    """The path of lib<stem>.so.N: $env if set, else the newest found beside PyTorch's CUDA
    wheels or in CUDA_HOME; None when there is none."""
    if os.environ.get(env):
        return os.environ[env]
    found = []
    for d in _library_dirs():
        for path in glob.glob(os.path.join(d, f"lib{stem}.so*")):
            name = os.path.basename(path)
            if name.startswith(f"lib{stem}.so") and "alt" not in name:
                found.append(path)
    if not found:
        return None
    want = (torch.version.cuda or "").split(".")[0]
    matching = [p for p in found if want and os.path.basename(p).startswith(f"lib{stem}.so.{want}")]
    return max(matching or found, key=_version_key)


@functools.lru_cache(maxsize=None)
def nvrtc_library():
    return find_library("nvrtc", "BRAZE_NVRTC")


@functools.lru_cache(maxsize=None)
def cublaslt_library():
    return find_library("cublasLt", "BRAZE_CUBLASLT")


@functools.lru_cache(maxsize=None)
def cudnn_library():
    """cuDNN for convolutions and attention, when PyTorch's CUDA wheels installed it;
    BRAZE_CUDNN="" keeps both on braze's own kernels."""
    if os.environ.get("BRAZE_CUDNN") == "":
        return None
    return find_library("cudnn", "BRAZE_CUDNN")


@functools.lru_cache(maxsize=None)
def device_options(index):
    """What the compiler needs to know of CUDA device `index`."""
    props = torch.cuda.get_device_properties(index)
    return {
        "device": index,
        "cc": props.major * 10 + props.minor,
        "sms": props.multi_processor_count,
        "registers": 4 * getattr(props, "regs_per_multiprocessor", 65536),
        "kernel_arg_bytes": kernel_arg_bytes(),
        "nvrtc": nvrtc_library() or "",
        "cublaslt": cublaslt_library() or "",
        "cudnn": cudnn_library() or "",
    }


def driver_version():
    """The CUDA driver's version (12010 for 12.1), or 0 where it cannot be read."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(0)
        return v.value if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 else 0
    except (OSError, AttributeError):
        return 0


def _version(text):
    """(major, minor) of "12.9"; (0, 0) for anything else."""
    try:
        major, minor = text.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return 0, 0


@functools.lru_cache(maxsize=None)
def kernel_arg_bytes():
    """The bytes of arguments a kernel launch may pass: 32764 where NVRTC and the driver are
    both CUDA 12.1 or later, else 4096. It bounds how many buffers a fused kernel may name."""
    nvrtc = nvrtc_library()
    if not nvrtc or nvrtc_load_error(nvrtc) is not None:
        return 4096
    if _version(_C.nvrtc_version(nvrtc)) >= (12, 1) and driver_version() >= 12010:
        return 32764
    return 4096


def precision_options():
    """PyTorch's flags as they are now: f32 products and convolutions may use TF32 where
    eager's would; attention runs on cuDNN where eager's may
    (torch.backends.cuda.enable_cudnn_sdp)."""
    return {"matmul_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "conv_tf32": bool(torch.backends.cudnn.allow_tf32),
            "cudnn_attention": bool(torch.backends.cuda.cudnn_sdp_enabled())}


def compile_options(index):
    """device_options plus precision_options."""
    return {**device_options(index), **precision_options()}


@functools.lru_cache(maxsize=None)
def compile_graph(g, opts, device, log=None):
    """Compiles braze graph `g` for CUDA `device` as Options `opts` ask."""
    return g.compile(log, opts.fuse, blas_library() if opts.blas else None,
                     compile_options(device.index), autotune=opts.autotune_seconds(),
                     disabled_passes=opts.disabled_passes)


def nvrtc_load_error(path):
    """None when the NVRTC library at `path` loads, else why not (it is missing, is not a
    shared library, or lacks an entry point)."""
    try:
        _C.nvrtc_version(path)
    except _C.CompileError as e:
        return str(e)
    return None


@functools.lru_cache(maxsize=None)
def preload(index):
    """Starts loading, on a thread of its own, the libraries the first compiled module of CUDA
    device `index` loads (cuBLASLt, cuDNN), so that this overlaps AOTAutograd's tracing rather
    than following it. Once per device; a library that fails is reported where it is used."""
    if unavailable_reason(torch.device("cuda", index)):
        return
    import threading
    options = device_options(index)
    threading.Thread(target=_C.cuda_preload, args=(index, options["cublaslt"], options["cudnn"]),
                     name="braze-preload", daemon=True).start()


def unavailable_reason(device):
    """None when braze can compile for `device`, else why not."""
    if not torch.cuda.is_available():
        return "PyTorch sees no CUDA device"
    if nvrtc_library() is None:
        return "NVRTC (libnvrtc.so) was not found; set BRAZE_NVRTC to its path"
    why = nvrtc_load_error(nvrtc_library())
    if why:
        return why
    if not _C.cuda_driver_available():
        return "the CUDA driver (libcuda.so.1) cannot be loaded"
    return None


class CudaGraph:
    """A compiled CUDA graph called with a flat list of device tensors. Static graphs keep their
    output layouts and arena size; a call whose inputs differ from the compiled shapes or
    strides goes through bind_shapes, which names what does not match. Graphs whose kernels
    check indices (gather, indexing, scatter) either wait for them and raise a bad index at
    once (sync_checks) or end each call with a device-side assertion on one."""

    def __init__(self, compiled, device, input_specs, output_dtypes, sync_checks=True):
        self.compiled = compiled
        self.device = device
        self.index = device.index if device.index is not None else torch.cuda.current_device()
        self.output_dtypes = output_dtypes
        # Kernels that bounds-check indices report through a flag. With sync_checks such graphs
        # wait for their kernels so that a bad index raises from the call that had it; without,
        # the module ends each call with a device-side assertion on a bad index (never a
        # silent answer either way).
        self.checks = compiled.checks_indices and sync_checks
        if compiled.checks_indices and not sync_checks:
            compiled.set_assert_indices(True)
        # Set by a partitioned graph whose other partitions follow this one: it checks once
        # after its last partition (check()), so the stream is not drained between them.
        self.deferred = False
        self.shapes = [s for s, _ in input_specs]
        self.strides = [st for _, st in input_specs]
        self.static = not any(isinstance(d, torch.SymInt) for s in self.shapes for d in s)
        self.layouts = self.arena = None
        self.into = {}  # output -> the input it is computed in (the input's own memory)
        self.syms = []
        if self.static:
            self.syms = list(compiled.bind_shapes([list(s) for s in self.shapes],
                                                  [list(st) for st in self.strides]))
            self.layouts = compiled.output_layouts(self.syms)
            self.arena = compiled.arena_bytes(self.syms)

    def __call__(self, inputs):
        if self.static and all(t.shape == s and t.stride() == st
                               for t, s, st in zip(inputs, self.shapes, self.strides)):
            syms, layouts, arena_bytes = self.syms, self.layouts, self.arena
        else:
            syms = list(self.compiled.bind_shapes([list(t.shape) for t in inputs],
                                                  [list(t.stride()) for t in inputs]))
            layouts = self.compiled.output_layouts(syms)
            arena_bytes = self.compiled.arena_bytes(syms)
        dev = self.device
        outs = outputs_into(inputs, layouts, self.output_dtypes, self.into, dev)
        arena = torch.empty(arena_bytes, dtype=torch.uint8, device=dev) if arena_bytes else None
        stream = torch._C._cuda_getCurrentRawStream(self.index)
        self.compiled.run_cuda([t.data_ptr() for t in inputs], [o.data_ptr() for o in outs],
                               arena.data_ptr() if arena is not None else 0, syms, stream)
        if self.checks and not self.deferred and not torch.cuda.is_current_stream_capturing():
            # A bad index is an error of this call; under capture, the replays check it.
            self.compiled.synchronize(stream)
        return outs

    def check(self):
        """Waits for this graph's kernels on the current stream and raises a bad index."""
        self.compiled.synchronize(torch._C._cuda_getCurrentRawStream(self.index))

    def guarded_call(self, positions, constants):
        """For a static graph whose inputs Dynamo's guards have already checked: a callable taking
        the graph's positional arguments (tensor inputs at `positions`, then `constants`) that
        skips the checks of __call__ and precomputes what it can."""
        device, index = self.device, self.index
        const_ptrs = [c.data_ptr() for c in constants]
        layouts = [(tuple(shape), tuple(stride), dt)
                   for (shape, stride), dt in zip(self.layouts, self.output_dtypes)]
        arena_bytes, syms, run_cuda = self.arena, self.syms, self.compiled.run_cuda
        empty_strided = torch.empty_strided
        stream, current = torch._C._cuda_getCurrentRawStream, torch._C._cuda_getDevice
        # PyTorch's allocation on the current CUDA device without the dispatcher (the one
        # TorchInductor's generated code calls): a partition allocating a dozen saved activations
        # per call spent more host time on them than its GPU spent on its kernels.
        direct = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
        direct = getattr(direct, "_empty_strided_cuda", None)
        # Outputs computed in an argument's own memory (self.into, an optimizer's parameters
        # and moments): the argument position for each, decided at the first call as
        # outputs_into decides (Dynamo's guards keep the layouts and dtypes from call to call).
        into_args = None
        outputs = len(layouts)
        if arena_bytes:
            layouts.append(((arena_bytes,), (1,), torch.uint8))

        def dispatched(shape, stride, dtype):
            return empty_strided(shape, stride, dtype=dtype, device=device)

        def call(*args):
            nonlocal into_args
            if into_args is None:
                into_args = into_arguments(self.into, positions, args, layouts[:outputs])
            new = direct if direct is not None and current() == index else dispatched
            outs = [args[into_args[k]] if k in into_args else new(s, st, dt)
                    for k, (s, st, dt) in enumerate(layouts)]
            arena = outs.pop() if arena_bytes else None
            run_cuda([args[i].data_ptr() for i in positions] + const_ptrs,
                     [o.data_ptr() for o in outs], arena.data_ptr() if arena_bytes else 0, syms,
                     stream(index))
            return outs
        call.constants = constants  # const_ptrs stay valid while the closure holds these
        return call


def checking_runs(graphs):
    """The calls of those braze graphs whose kernels check indices and that wait for them
    (index_checks="sync")."""
    return [g.run for g in graphs if getattr(g.run, "checks", False)]


def check_runs(runs):
    """A callable that waits for the kernels of `runs` and raises a bad index; None for none."""
    if not runs:
        return None

    def check():
        for run in runs:
            run.check()
    return check


def checked_once(forward, graphs):
    """forward, a partitioned graph's call, with the bad-index checks of its partitions made
    once, after the last one: each would otherwise wait for its kernels in the middle of the
    graph, and the GPU would idle while the host launches what follows. A bad index still
    raises from the call that had it, before any result reaches the caller."""
    runs = checking_runs(graphs)
    if not runs:
        return forward
    for run in runs:
        run.deferred = True
    check = check_runs(runs)

    def call(*args):
        out = forward(*args)
        if not torch.cuda.is_current_stream_capturing():  # under capture, the replays check
            check()
        return out
    return call


def check_codegen(graph):
    """Generates the graph's CUDA sources and compiles them (Options.cuda_codegen_only): the
    kernels with NVRTC for sm_90, the host code with the host compiler (syntax only). Raises on
    any error; returns the device and host sources."""
    import subprocess
    import tempfile
    nvrtc = nvrtc_library()
    if nvrtc is None:
        raise RuntimeError("cuda_codegen_only needs NVRTC (libnvrtc.so), which was not found")
    device, host, deferred = graph.generate_cuda({"cc": 90, "sms": 132, **precision_options()})
    with tempfile.TemporaryDirectory(prefix="braze-nvrtc-") as tmp:
        for program in [device, *deferred]:
            _C.nvrtc_compile(program, nvrtc, 90, tmp)
        path = os.path.join(tmp, "host.cpp")
        with open(path, "w") as f:
            f.write(host)
        r = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-w", path],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"generated CUDA host code does not compile:\n{r.stderr[:4000]}")
    return device + "\n" + host
