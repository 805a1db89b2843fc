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

    def __post_init__(self):
        if self.index_checks is not None:
            _index_checks_mode(self.index_checks, "Options(index_checks=...)")

    def sync_index_checks(self):
        """Whether CUDA calls wait for their index checks (index_checks, resolved)."""
        mode = self.index_checks
        if mode is None:
            mode = _index_checks_mode(os.environ.get("BRAZE_INDEX_CHECKS", "assert"),
                                      "BRAZE_INDEX_CHECKS")
        return mode == "sync"


def _index_checks_mode(mode, where):
    if mode not in ("assert", "sync"):
        raise ValueError(f"{where} is {mode!r}; expected 'assert' (a device-side assertion, "
                         f"no waiting) or 'sync' (each call waits and raises braze.RunError)")
    return mode
