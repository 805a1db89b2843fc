"""The CPU side of the call path: a compiled CPU graph called with a flat list of tensors and,
for a static graph whose inputs Dynamo's guards have already checked, a lean call that passes
buffer addresses straight to the module (no DLPack view per tensor, no binding of sizes) with
outputs allocated by PyTorch; and the libraries CPU graphs call (MKL or OpenBLAS, oneDNN)."""
import ctypes
import functools
import os
import warnings

import torch


class CpuGraph:
    """A compiled CPU graph. __call__ checks every input against the compiled shapes and
    strides (the runtime names what does not match); guarded_call skips those checks."""

    def __init__(self, compiled, input_specs, output_dtypes):
        self.compiled = compiled
        self.output_dtypes = output_dtypes
        shapes = [list(s) for s, _ in input_specs]
        strides = [list(st) for _, st in input_specs]
        self.static = not any(isinstance(d, torch.SymInt) for s in shapes + strides for d in s)
        self.checks = False  # a CPU kernel's bad index comes back as the call's own RunError
        self.syms, self.layouts = [], None
        self.into = {}  # output -> the input it is computed in (the input's own memory)
        self.shapes = [tuple(s) for s in shapes]
        self.strides = [tuple(st) for st in strides]
        if self.static:
            self.syms = list(compiled.bind_shapes(shapes, strides))
            self.layouts = compiled.output_layouts(self.syms)

    def __call__(self, inputs):
        if not self.into:
            return self.compiled.run(inputs)
        c = self.compiled
        syms = list(c.bind_shapes([list(t.shape) for t in inputs],
                                  [list(t.stride()) for t in inputs]))
        outs = outputs_into(inputs, c.output_layouts(syms), self.output_dtypes, self.into,
                            inputs[0].device if inputs else torch.device("cpu"))
        c.run_bound([t.data_ptr() for t in inputs], [o.data_ptr() for o in outs], syms)
        return outs

    def guarded_call(self, positions, constants):
        """A callable taking the graph's positional arguments (tensor inputs at `positions`, then
        `constants`), for calls whose inputs have the compiled shapes and strides."""
        layouts = [(tuple(shape), tuple(stride), dt)
                   for (shape, stride), dt in zip(self.layouts, self.output_dtypes)]
        const_ptrs = [c.data_ptr() for c in constants]
        syms, run_bound, empty_strided = self.syms, self.compiled.run_bound, torch.empty_strided
        # Outputs computed in an argument's own memory (self.into): the argument position for
        # each, decided at the first call as outputs_into decides; the layouts cannot change
        # between calls, and every argument's dtype is the graph's.
        into_args = None

        def call(*args):
            nonlocal into_args
            if into_args is None:
                into_args = into_arguments(self.into, positions, args, layouts)
            outs = [args[into_args[k]] if k in into_args else empty_strided(s, st, dtype=dt)
                    for k, (s, st, dt) in enumerate(layouts)]
            run_bound([args[i].data_ptr() for i in positions] + const_ptrs,
                      [o.data_ptr() for o in outs], syms)
            return outs
        call.constants = constants  # const_ptrs stay valid while the closure holds these
        return call


def _holds(x, shape, stride, dtype):
    """Whether tensor x can be an output of this dtype and layout (computed in x's memory)."""
    return x.dtype == dtype and tuple(x.shape) == tuple(shape) and tuple(x.stride()) == tuple(stride)


def into_arguments(into, positions, args, layouts):
    """{output: argument position} for the outputs computed in an argument's memory: those
    whose input (into) is an argument with the output's dtype and layout."""
    return {k: positions[j] for k, j in into.items()
            if j < len(positions) and _holds(args[positions[j]], *layouts[k])}


def outputs_into(inputs, layouts, dtypes, into, device):
    """The output tensors of a call: output k is input into[k] itself where that input has
    output k's layout and dtype (the graph computes it in the input's memory), else new."""
    outs = []
    for k, ((shape, stride), dt) in enumerate(zip(layouts, dtypes)):
        if k in into and _holds(inputs[into[k]], shape, stride, dt):
            outs.append(inputs[into[k]])
        else:
            outs.append(torch.empty_strided(shape, stride, dtype=dt, device=device))
    return outs


@functools.lru_cache(maxsize=None)
def blas_library():
    """NumPy's OpenBLAS build (the scipy-openblas64 wheel) when installed; BRAZE_BLAS, read
    in C++, takes precedence. None: matrix products run as braze loop nests."""
    try:
        import scipy_openblas64
    except ImportError:
        return None
    path = os.path.join(scipy_openblas64.get_lib_dir(), "lib" + scipy_openblas64.get_library() + ".so")
    return path if os.path.exists(path) else None


@functools.lru_cache(maxsize=None)
def jit_blas_library():
    """The BLAS a compile for this process calls: PyTorch's own MKL where PyTorch was built with
    it (libtorch_cpu exports Fortran's ILP64 sgemm_64_ and dgemm_64_, which the generated code
    calls through row-major wrappers), else blas_library(). At a decoder's GEMM sizes on a
    Skylake-X core, single-threaded MKL ran 5-23% faster than scipy-openblas64. A package runs
    without PyTorch, so an export keeps blas_library(). BRAZE_BLAS, read in C++, takes
    precedence over both."""
    lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    if torch.backends.mkl.is_available() and os.path.exists(lib):
        try:
            handle = ctypes.CDLL(lib)
            if all(hasattr(handle, f) for f in ("sgemm_64_", "dgemm_64_")):
                return lib
        except OSError:
            pass
    return blas_library()


_MISSING = {
    "blas": ("scipy-openblas64", "BRAZE_BLAS",
             "matrix products on the CPU run as braze's own loop nests"),
    "dnnl": ("onednn-cpu-gomp", "BRAZE_DNNL",
             "CPU convolutions decompose into im2col and matrix products"),
}


@functools.lru_cache(maxsize=None)
def missing_library_notice(which):
    """Says once per process (a warning) that a CPU library braze declares as a dependency is
    missing, and what runs instead: a plain install without it still compiles, more slowly.
    Silent when BRAZE_BLAS / BRAZE_DNNL names one (read in C++). Returns the message or None."""
    package, env, instead = _MISSING[which]
    found = blas_library() if which == "blas" else dnnl_library()
    if found is not None or os.environ.get(env):
        return None
    msg = (f"braze: {package} is not installed, so {instead} (pip install {package}, or set "
           f"{env} to the library's path)")
    warnings.warn(msg)
    return msg


def say_missing_libraries(blas, dnnl):
    """missing_library_notice for each library a CPU compile asks for (Options.blas, .dnnl)."""
    for which, wanted in (("blas", blas), ("dnnl", dnnl)):
        if wanted:
            missing_library_notice(which)


def compile_graph(g, opts, log=None, portable=False):
    """Compiles braze graph `g` for the CPU as Options `opts` ask: matrix products through BLAS
    and convolutions through oneDNN where those are on and installed (a missing one is said
    once), half precision rounded as this machine's eager kernels round it. The BLAS is
    PyTorch's MKL where it has one (jit_blas_library), or for a `portable` module (a package's)
    OpenBLAS."""
    say_missing_libraries(opts.blas, opts.dnnl)
    blas = (blas_library() if portable else jit_blas_library()) if opts.blas else None
    return g.compile(log, opts.fuse, blas,
                     dnnl=dnnl_library() if opts.dnnl else None, one_dnn_half=one_dnn_half(),
                     autotune=opts.autotune_seconds(),
                     disabled_passes=opts.disabled_passes)


@functools.lru_cache(maxsize=None)
def one_dnn_half():
    """The half-precision dtypes PyTorch's CPU kernels run through oneDNN on this machine
    (braze rounds as they do: CompileOptions::oneDnnHalf)."""
    return [name for name, supported in (("bf16", torch.ops.mkldnn._is_mkldnn_bf16_supported),
                                         ("f16", torch.ops.mkldnn._is_mkldnn_fp16_supported))
            if supported()]


@functools.lru_cache(maxsize=None)
def dnnl_library():
    """oneDNN's GNU OpenMP build (the onednn-cpu-gomp wheel) when installed; BRAZE_DNNL, read
    in C++, takes precedence. None: convolutions decompose into im2col and matrix products."""
    import importlib.metadata
    try:
        files = importlib.metadata.files("onednn-cpu-gomp") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "libdnnl.so.3":
            path = str(f.locate())
            if os.path.exists(path):
                return os.path.realpath(path)
    return None
