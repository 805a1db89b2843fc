"""braze's per-compile options: torch.compile's `options` dict, read into an Options."""
import dataclasses
import os


@dataclasses.dataclass(frozen=True)
class Options:
    """Per-compile options: `torch.compile(fn, backend="braze", options={"strict": True})`, or
    an Options given to braze.braze_backend(gm, example_inputs, options)."""
    strict: bool = False
    log: str = None  # e.g. "graph,loops,output_code"; None reads BRAZE_LOG
    fuse: bool = True
    blas: bool = True  # matrix products through OpenBLAS when installed; False: loop nests
    # CPU f32 convolutions through oneDNN when installed (onednn-cpu-gomp); False: im2col and
    # matrix products.
    dnnl: bool = True
    # Tests on machines without a GPU: generate each graph's CUDA sources and compile them with
    # NVRTC and the host compiler (nothing runs on a GPU; the graph itself runs in eager).
    cuda_codegen_only: bool = False
    # Replay static CUDA graphs as CUDA graphs (braze/cudagraphs.py). None: BRAZE_CUDA_GRAPHS
    # decides (on unless "0"), and graphs of very few launches are left uncaptured; True: every
    # graph where it is safe.
    cuda_graphs: bool = None
    # A graph with dynamic shapes is captured per concrete size: at most this many sizes per
    # graph (each capture holds its own memory; see braze/cudagraphs.py). None: 64; 0: graphs
    # with dynamic shapes are not captured.
    cuda_graph_sizes: int = None
    # CUDA graphs whose kernels bounds-check indices (gather, indexing, scatter). "assert": a
    # bad index stops the CUDA stream with a device-side assertion, as eager's own kernels do,
    # and no call waits for its kernels (CUDA is then unusable in this process, as after
    # eager's assertion). "sync": each call waits for its kernels and raises braze.RunError
    # naming the bad index; CUDA stays usable. None: BRAZE_INDEX_CHECKS, else "assert".
    index_checks: str = None
    # Training: True compiles each backward graph on a background thread as soon as
    # AOTAutograd has it, with its forward, rather than at the first backward call; the compile
    # overlaps the forward's run and the graphs that follow a graph break, and the first
    # backward call waits for what is left of it. A forward with grad enabled whose backward
    # never runs then compiles its backward anyway. False: at the first backward call, as
    # AOTAutograd does by default. None: True for CUDA graphs, whose forward leaves the host's
    # cores to the compile while the GPU runs; False on the CPU, where the compile would take
    # them from the forward.
    early_backward: bool = None
    # The accuracy checker (braze/accuracy.py): every call also runs in eager, in float64 and
    # as traced, and the first node whose value diverges is named. BRAZE_ACCURACY=1 sets it.
    accuracy: bool = False
    # A folder for the compile report (braze/report.py): one HTML page per process, written at
    # exit and by braze.write_report(). BRAZE_REPORT=<dir> sets it.
    report: str = None
    # The autotuner (CUDA; driver/Autotune.h): each graph's loop kernels that take its time are
    # run in other forms (block, threads per row, lanes, column rows, ...) on the device, and
    # the fastest form that writes what the planned one writes is kept. A number: the seconds
    # one graph may spend on it; True: 5; False or 0: off; None: BRAZE_AUTOTUNE (1, 0 or
    # seconds), else off. mode="max-autotune" sets True. The CPU's kernels are not tuned.
    autotune: object = None
    # Graph passes (`braze-opt --help` lists them) this compile skips: a tuple of names, to find
    # which rewrite slows a model down or changes its results. None: BRAZE_DISABLE_PASSES (names
    # separated by commas), else none. A name that is not a graph pass is an error.
    disabled_passes: tuple = None

    def __post_init__(self):
        n = self.cuda_graph_sizes
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
            raise ValueError(f"Options(cuda_graph_sizes=...) is {n!r}; expected a whole number "
                             f"of sizes, at least 0, or None for the default")
        if self.index_checks is not None:
            _index_checks_mode(self.index_checks, "Options(index_checks=...)")
        a = self.autotune
        if a is not None and not isinstance(a, bool) and (
                not isinstance(a, (int, float)) or not a >= 0 or a == float("inf")):
            raise ValueError(f"Options(autotune=...) is {a!r}; expected True, False, the seconds "
                             f"a graph may spend tuning (at least 0), or None for BRAZE_AUTOTUNE")
        d = self.disabled_passes
        if d is not None and (isinstance(d, str) or not all(isinstance(n, str) for n in d)):
            raise ValueError(f"Options(disabled_passes=...) is {d!r}; expected a tuple of graph "
                             f"pass names (braze-opt --help lists them), or None for "
                             f"BRAZE_DISABLE_PASSES")
        if d is not None and not isinstance(d, tuple):  # hashable: compiles are cached by options
            object.__setattr__(self, "disabled_passes", tuple(d))

    def autotune_seconds(self):
        """The autotuner's budget per graph in seconds (0: off), or None where BRAZE_AUTOTUNE
        decides."""
        if self.autotune is None:
            return None
        if isinstance(self.autotune, bool):
            return 5.0 if self.autotune else 0.0
        return float(self.autotune)

    def sync_index_checks(self):
        """Whether CUDA calls wait for their index checks (index_checks, resolved)."""
        mode = self.index_checks
        if mode is None:
            mode = _index_checks_mode(os.environ.get("BRAZE_INDEX_CHECKS", "assert"),
                                      "BRAZE_INDEX_CHECKS")
        return mode == "sync"


# torch.compile's modes (torch passes `mode` to the backend unless it is "default"), as the
# Options fields each one sets where the user's options leave them unset.
MODES = {
    "default": {},
    # CUDA graphs, every graph where it is safe (also those of few launches).
    "reduce-overhead": {"cuda_graphs": True},
    # The autotuner (Options.autotune) on, 5 s a graph.
    "max-autotune": {"autotune": True},
    "max-autotune-no-cudagraphs": {"cuda_graphs": False, "autotune": True},
}


def from_torch_compile(options=None, mode=None):
    """The Options of `torch.compile(..., backend="braze", mode=mode, options=options)`:
    options is None, a dict of Options fields or an Options. An unknown mode or option is a
    ValueError naming the known ones."""
    if isinstance(options, Options):
        opts = options
    elif options is None or isinstance(options, dict):
        fields = {f.name for f in dataclasses.fields(Options)}
        unknown = sorted(set(options or {}) - fields)
        if unknown:
            raise ValueError(f"unknown braze option(s) {', '.join(map(repr, unknown))}; the "
                             f"known ones are {', '.join(sorted(fields))}")
        opts = Options(**(options or {}))
    else:
        raise ValueError(f"braze's options must be a dict or braze.Options, got "
                         f"{type(options).__name__}")
    if mode is None:
        return opts
    if mode not in MODES:
        raise ValueError(f"unknown torch.compile mode {mode!r} for braze; the known ones are "
                         f"{', '.join(map(repr, MODES))}")
    given = options if isinstance(options, dict) else {}
    if isinstance(options, Options):
        given = {f.name: getattr(options, f.name) for f in dataclasses.fields(Options)
                 if getattr(options, f.name) != f.default}
    implied = {k: v for k, v in MODES[mode].items() if k not in given}
    return dataclasses.replace(opts, **implied) if implied else opts


def _index_checks_mode(mode, where):
    if mode not in ("assert", "sync"):
        raise ValueError(f"{where} is {mode!r}; expected 'assert' (a device-side assertion, "
                         f"no waiting) or 'sync' (each call waits and raises braze.RunError)")
    return mode
