"""The torch.compile backend: AOTAutograd with Core ATen decompositions, then each FX graph is
translated into a braze graph, compiled in C++, and wrapped in a callable. Ops braze cannot take
run in eager PyTorch between compiled partitions; an internal error falls back to eager for the
whole graph with one warning (or raises with Options(strict=True) / BRAZE_STRICT=1)."""
import collections
import contextlib
import contextvars
import dataclasses
import functools
import operator
import os
import sys
import threading
import time
import warnings

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._functorch.partitioners import min_cut_rematerialization_partition

from braze import (_C, accuracy, aot, background, cudagraphs, decompositions, devices, masks,
                   mutations, partition, report, sizes, support)
from braze import cpu as cpu_support
from braze import cuda as cuda_support
from braze.options import Options
from braze.options import from_torch_compile as options_from_torch_compile
from braze.registry import Unsupported
from braze.support import fetch_attr
# Each rule module registers its rules in braze.registry when imported.
from braze import rules_scatter, rules_special, rules_nn, rules_misc, rules_sort  # noqa: F401,E402
from braze import rules_complex, rules_attention  # noqa: F401,E402
from braze.rules_attention import trace_as_math_for_training, unify_lengths
from braze.signature import Computed
from braze.layouts import as_layout, guard_eager_layouts

class _State:
    """What the backend keeps for the process, in one place (counters(), compile_times(),
    fallback_ops_by_op() and run_and_get_code() read it)."""

    def __init__(self):
        # graphs: FX graphs braze received; partitions: braze graphs compiled from them (a whole
        # graph or one partition each); recompiles: variants compiled for inputs laid out
        # otherwise than the graph's example inputs; fallback_ops: FX nodes left to eager;
        # fallback_graphs: graphs, or calls of a compiled graph, that ran in eager PyTorch;
        # accuracy_divergences: partitions the accuracy checker found diverging.
        self.counts = {"graphs": 0, "partitions": 0, "recompiles": 0, "fallback_ops": 0,
                       "fallback_graphs": 0, "accuracy_divergences": 0}
        self.fallback_ops_by_op = collections.Counter()  # op name -> FX nodes left to eager
        # Open run_and_get_code calls: each collects the source of every graph compiled
        # meanwhile. Nothing is kept when none is open.
        self.source_records = []
        # Seconds spent compiling, by stage (compile_times()): support (deciding which FX nodes
        # braze takes), lower (C++ passes and codegen), host_compile, nvrtc, load, autotune
        # (the autotuner, with the compile of its winners), python
        # (translation, partitioning and the rest of braze's Python), total (all of it). Of the
        # total, background is what backward graphs took on a background thread
        # (Options.early_backward); compile_times() adds waited, how long calls waited for
        # those (braze/background.py): what braze added to the calls that compiled is
        # total - background + waited.
        self.compile_times = collections.Counter()
        self.lock = threading.Lock()


_state = _State()


def counters():
    """Cumulative counts for this process."""
    d = dict(_C.counters())
    d.update(_state.counts)
    d.update(cudagraphs.counts)
    d.update(mutations.counts)
    return d


def compile_times():
    """Seconds braze has spent compiling in this process, by stage (BRAZE_LOG=compile_time
    prints each graph's split as it is compiled)."""
    times = dict(_state.compile_times)
    if background.waited():
        times["waited"] = background.waited()
    return times


def fallback_ops_by_op():
    """How many FX nodes of each op braze has left to eager PyTorch in this process."""
    return dict(_state.fallback_ops_by_op)


def run_and_get_code(fn, *args, **kwargs):
    """Runs fn (typically a torch.compile'd function) and returns (result, [generated source
    for each graph compiled during the call])."""
    sources = []
    with _state.lock:
        _state.source_records.append(sources)
    try:
        result = fn(*args, **kwargs)
    finally:
        with _state.lock:  # by identity: two open calls' lists may be equal
            _state.source_records[:] = [r for r in _state.source_records if r is not sources]
    return result, sources


def _record_source(source):
    """Hands `source` to the open run_and_get_code calls (call with _state.lock held)."""
    for sources in _state.source_records:
        sources.append(source)


# The stage times of the graph compile that runs in this context (_compile_fx). Partitions
# compile on pool threads and backward graphs in the background, so one graph's split cannot be
# read off the process's totals.
_graph_times = contextvars.ContextVar("braze_graph_times", default=None)


def _add_times(times):
    """Adds stage seconds to compile_times() and to the split of the graph being compiled
    (call with _state.lock held)."""
    _state.compile_times.update(times)
    own = _graph_times.get()
    if own is not None:
        own.update(times)


def _log_fallback(msg):
    report.note("recompile" if msg.startswith("recompiling") else "fallback", msg)
    if _C.log_fallback_from_environment():
        print(f"===== braze: fallback =====\n{msg}", file=sys.stderr)


def _strict(opts):
    return opts.strict or _C.strict_from_environment()


def _layout_error(e):
    """True for a RunError saying the inputs' sizes or strides are not those the compiled graph
    was compiled for (a variant for them can be compiled)."""
    return "compiled graph expects" in str(e)


def _kernel_error(e):
    """True for a RunError of the computation itself (an index out of range), which eager
    raises too; other RunErrors are braze's own (a module that fails to load, a launch)."""
    text = str(e)
    return "out of bounds" in text or "kernel failed with code" in text or "kernel error code" in text


class _AssertionFailed(Exception):
    """An assertion of the graph (aten._assert_async) that does not hold; its message."""


class _BrazeGraph:
    """A compiled braze graph called with the FX graph's positional arguments.

    Inputs are taken as they come: a call whose inputs are laid out otherwise than the graph was
    compiled for (an eager kernel's output, a view) runs a variant compiled for those layouts,
    kept and counted in counters()["recompiles"]. The returned outputs are made from braze's as
    the graph's signature says (signature.GraphSignature.fill). If braze's own call path fails,
    that call runs the eager graph on inputs laid out as the graph declares them, with one
    warning: never a wrong answer and never a broken program."""

    def __init__(self, compiled, signature, constants, needs_seed, eager, run, device=None, *,
                 recompile=None, strict=False):
        self.compiled = compiled
        self.signature = signature
        self.run = run  # inputs (flat list of tensors) -> outputs
        self.device = device  # where the seed of random ops lives
        self.tensor_positions = signature.tensor_positions
        self.constants = constants  # tensors the graph holds as attributes, passed after the args
        self.needs_seed = needs_seed  # random ops: a fresh seed from torch's generator per call
        self.eager = eager
        self.recompile = recompile  # args -> the run callable of a variant for their layouts
        self.strict = strict
        self.variants = {}  # ((sizes, strides) per input) -> run callable
        self.warned = False
        self.checker = None  # accuracy.Checker when the accuracy checker is on

    def __deepcopy__(self, memo):  # compiled code is immutable (Dynamo's minifier copies)
        return self

    def fast(self):
        """A leaner callable for calls whose inputs Dynamo's guards have already checked (a
        static graph with plain inputs and outputs); self otherwise."""
        run = self.run
        if (not isinstance(run, (cpu_support.CpuGraph, cuda_support.CudaGraph)) or not run.static
                or self.needs_seed
                or run.checks or self.checker is not None or self.signature.assertions
                or any(s.complex or s.layout is not None for s in self.signature.computed)
                or any(c.is_complex() for c in self.constants)):
            return self
        call = run.guarded_call(self.tensor_positions, self.constants)
        if self.signature.direct:
            return call
        fill = self.signature.fill

        def with_slots(*args):
            return fill(args, call(*args))
        return with_slots

    def __call__(self, *args):
        inputs = [args[i] for i in self.tensor_positions] + self.constants
        for k, i in self.signature.carried:
            inputs[k] = sizes.SizeCarrier.of(args[i], self.device)
        where = self.device.type if self.device is not None else "cpu"
        if any(x.device.type != where for x in inputs):
            return self._eager(args, f"an input is not on {self.device or 'cpu'}, where this "
                                     "graph was compiled")
        if self.needs_seed:
            # On the graph's device, never torch's default one (a CPU graph of factory ops run
            # under torch.set_default_device("cuda") would get a CUDA seed).
            inputs.append(torch.randint(0, 2**62, (), dtype=torch.int64,
                                        device=self.device or torch.device("cpu")))
        inputs = [torch.view_as_real(x.resolve_conj()) if x.is_complex() else x for x in inputs]
        try:
            outs = self._run(args, inputs)
            self._check_assertions(outs)
            outs = self.signature.fill(args, outs)
            if self.checker is not None:
                self.checker.check(args, outs)
            return outs
        except _AssertionFailed as e:
            raise RuntimeError(e.args[0]) from None  # as eager's _assert_async
        except _C.RunError as e:
            if _kernel_error(e) or self.strict:
                raise  # a kernel error (e.g. an index out of bounds): eager raises too
            reason = str(e)
        except (Unsupported, _C.CompileError) as e:
            if self.strict:
                raise
            reason = f"braze cannot compile a variant for these inputs: {e}"
        except Exception as e:  # braze's call path must never break the user's program
            if self.strict:
                raise
            reason = f"internal error in braze's call ({type(e).__name__}: {e})"
        return self._eager(args, reason)

    def _check_assertions(self, outs):
        """Drops the assertions' conditions (the last outputs) from outs; raises
        _AssertionFailed with the message of the first that does not hold."""
        messages = self.signature.assertions
        if messages:
            conds = outs[-len(messages):]
            del outs[-len(messages):]
            for cond, msg in zip(conds, messages):
                if not bool(cond):
                    raise _AssertionFailed(msg)

    def _run(self, args, inputs):
        try:
            return self.run(inputs)
        except _C.RunError as e:
            if self.recompile is None or not _layout_error(e):
                raise
        key = tuple((tuple(x.shape), tuple(x.stride())) for x in inputs)
        run = self.variants.get(key)
        if run is None:
            _state.counts["recompiles"] += 1
            _log_fallback(f"recompiling a graph for inputs laid out as {key}")
            run = self.variants[key] = self.recompile(args)
        self.run = run  # the layouts most recently seen are tried first
        return run(inputs)

    def _eager(self, args, reason):
        if not self.warned:
            warnings.warn(f"braze: {reason}; running this call in eager PyTorch")
            self.warned = True
        _state.counts["fallback_graphs"] += 1
        _log_fallback(f"{reason}; running this call in eager PyTorch")
        args = list(args)
        for i in self.signature.inputs:  # eager gets the layouts it was traced with
            if i.layout is not None and isinstance(args[i.position], torch.Tensor):
                args[i.position] = as_layout(args[i.position], *i.layout)
        out = self.eager(*args)
        return list(out) if isinstance(out, (tuple, list)) else [out]


def _compile_whole(gm, opts, device=None, args=None, writes=(), translated=None):
    """Compiles a graph whose every node braze supports, for the CPU or for the CUDA `device`:
    `translated` is its translation (support.translate_whole) when deciding support made it,
    else it is translated here. With `args` (one call's arguments), the graph is compiled for
    exactly their sizes and strides: a variant for inputs laid out otherwise than the example
    inputs."""
    t, sig, handles = translated or support.translate_whole(gm, args)
    if not sig.computes:
        # Every output is None, or an argument or a view of one (a weight or its transpose
        # saved for the backward), made at each call; or there is none (each aliased an input,
        # which AOTAutograd regenerates).
        return (lambda *call_args: sig.fill(call_args, [])), sig.returns_tuple
    if opts.cuda_codegen_only:
        source = cuda_support.check_codegen(t.g)
        with _state.lock:
            _record_source(source)
        return (lambda *args: list(_as_tuple(gm.forward(*args)))), sig.returns_tuple
    specs = [(tuple(v.shape), tuple(v.stride())) for v in _input_values(gm, sig, t.seed, args)]
    dtypes = [c.dtype for c in sig.computed] + [b.dtype for b in sig.bases]
    dtypes += [torch.bool] * len(sig.assertions)
    staged = report.stages(t.g, device is not None)  # printed before compile consumes t.g
    own = accuracy.schedule_of(t, handles, opts, device) if args is None else None
    if device is None:
        compiled = cpu_support.compile_graph(t.g, opts, opts.log)
        run = cpu_support.CpuGraph(compiled, specs, dtypes)
    else:
        compiled = cuda_support.compile_graph(t.g, opts, device, opts.log)
        run = cuda_support.CudaGraph(compiled, device, specs, dtypes,
                                     opts.sync_index_checks())
    report.partition(staged, compiled, sig)
    # Outputs written into the inputs they update (mutations.take): braze output -> input.
    positions = sig.tensor_positions
    run.into = {sig.outputs[w.output].index: positions.index(w.position) for w in writes
                if w.in_place and isinstance(sig.outputs[w.output], Computed)
                and w.position in positions}
    with _state.lock:  # partitions compile on several threads
        _add_times(compiled.times)
        _record_source(compiled.source)
        _state.counts["partitions"] += args is None
    recompile = None
    if args is None:
        def recompile(call_args):
            variant, _ = _compile_whole(gm, opts, device, call_args, writes=writes)
            return variant.run
    constants = [fetch_attr(gm, target) for target in sig.constants]
    graph = _BrazeGraph(compiled, sig, constants, t.seed is not None, gm.forward, run, device,
                        recompile=recompile, strict=_strict(opts))
    if accuracy.enabled(opts) and args is None:
        graph.checker = accuracy.checker(gm, opts, device, own)
    return graph, sig.returns_tuple


def _as_tuple(out):
    return out if isinstance(out, (tuple, list)) else (out,)


def _input_values(gm, sig, seed, args=None):
    """The values of the compiled graph's tensor inputs, in input order (placeholders' tensors,
    carried sizes, attributes, then the `seed` of random ops when there is one), complex ones
    as real pairs: the example values, or those of `args` (one call's arguments) when given."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    vals = []
    for i in sig.tensor_positions:
        v = args[i] if args is not None else placeholders[i].meta["val"]
        vals.append(sizes.SizeCarrier(v) if sig.inputs[i].kind == "carried" else v)
    vals += [fetch_attr(gm, target) for target in sig.constants]
    if seed is not None:
        vals.append(torch.empty((), dtype=torch.int64))
    return [torch.view_as_real(v.resolve_conj()) if v.is_complex() else v for v in vals]


def _compile_fx(gm, example_inputs, opts, direct=None, forward=True, in_background=False):
    """Compiles one AOTAutograd graph (see _compile_graph), timing its stages."""
    with _state.lock:
        _state.counts["graphs"] += 1
        number = _state.counts["graphs"]
    spent = collections.Counter()
    token = _graph_times.set(spent)
    reported = report.graph_started(number, gm, forward, opts)
    start = time.perf_counter()
    try:
        return _compile_graph(gm, example_inputs, opts, direct, forward, number)
    finally:
        total = time.perf_counter() - start
        _graph_times.reset(token)
        report.graph_finished(reported, {**spent, "total": total})
        python = max(0.0, total - sum(spent.values()))
        with _state.lock:
            _state.compile_times["total"] += total
            _state.compile_times["python"] += python
            if in_background:
                _state.compile_times["background"] += total
        if _C.log_compile_time_from_environment():
            # stage times are summed over the threads that compile partitions
            split = ", ".join(f"{k} {spent[k]:.3f}" for k in
                              ("support", "lower", "host_compile", "nvrtc", "load", "autotune"))
            where = ", in the background" if in_background else ""
            print(f"===== braze: compile_time =====\ngraph {number} ({len(gm.graph.nodes)} FX "
                  f"nodes{where}): {total:.3f} s: {split}, python {python:.3f}", file=sys.stderr)


def _compile_early(gm, example_inputs, opts):
    """A backward graph's compile (_compile_fx) started on a background thread: a boxed
    callable that waits for it at its first call (see Options.early_backward)."""
    def compile_without_grad():
        with torch.no_grad():  # as at a backward call, where AOTAutograd compiles it otherwise
            return _compile_fx(gm, example_inputs, opts, forward=False, in_background=True)
    return background.start(compile_without_grad)


def _compile_graph(gm, example_inputs, opts, direct, forward, number):
    """Compiles AOTAutograd graph number `number`. With `direct` (inference graphs), a callable
    that Dynamo may call without AOTAutograd's runtime wrapper is left in direct["fn"] when
    there is one. Static CUDA graphs are replayed as CUDA graphs (cudagraphs.wrap). Writes
    into inputs that AOTAutograd kept in the graph are the graph's own (braze/mutations.py)."""
    returned = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    outputs = len(returned) if isinstance(returned, (tuple, list)) else 1
    writes = mutations.take(gm)
    example_inputs, moving = devices.scalars_to_device(gm, example_inputs,
                                                       {w.position for w in writes})
    if not writes and moving is None:
        return _compile_mutation_free(gm, example_inputs, opts, direct, forward, number)
    fn = _compile_mutation_free(gm, example_inputs, opts, direct if moving is None else None,
                                forward, number, writes)
    if moving is not None:
        fn = moving(fn)
    return mutations.apply(fn, writes, outputs) if writes else fn


def _compile_mutation_free(gm, example_inputs, opts, direct, forward, number, writes=()):
    """_compile_graph of a graph with no copy_ into an input; `writes` (mutations.Mutation)
    name outputs that a graph compiled whole may compute in their inputs' memory; with
    `direct` too (an inference graph, never plain_inference), that graph's lean call runs it."""
    name = f"graph {number} ({'forward' if forward else 'backward'})"

    def replayed(fn, graphs, whole=False):
        """fn as CUDA graphs; after a replay, the braze graphs whose kernels check indices
        wait for them and raise a bad index, as their uncaptured calls do."""
        launches = graphs[0].compiled.num_kernels if whole and graphs else None
        check = cuda_support.check_runs(cuda_support.checking_runs(graphs))
        return cudagraphs.wrap(fn, gm, example_inputs, device, opts.cuda_graphs, name, forward,
                               check, launches,
                               frozenset(w.position for w in writes if w.in_place),
                               opts.cuda_graph_sizes)

    device, why = devices.graph_device(gm, example_inputs)
    if why:
        _count_fallback_graph()
        _log_fallback(why)
        return make_boxed_func(gm.forward)
    if device is not None:
        devices.constants_to_device(gm, device)
    try:  # optimizations: a failure leaves the graph as it was
        unify_lengths(gm)
        masks.fold_constant_masks(gm)
    except Exception as e:
        if _strict(opts):
            raise
        _log_fallback(f"attention lengths or masks left as they are: {type(e).__name__}: {e}")
    host_sizes = sizes.hoist(gm)
    support_start = time.perf_counter()
    # Sizes are host arithmetic: a graph compiled whole reads them from its meta values; a
    # partitioned one, or one that returns a size, computes them in its eager part.
    sized_output = any(u.op == "output" for n in host_sizes for u in n.users)
    # The whole graph's translation, when braze takes it, is what compiles; else the nodes are
    # asked about one by one.
    whole = None if sized_output else support.whole_graph(gm, device, skip=host_sizes)
    unsupported = {} if whole else support.unsupported_nodes(gm, device, skip=set(host_sizes))
    if unsupported or sized_output:
        unsupported.update((n, "a size computed on the host") for n in host_sizes)
    with _state.lock:
        _add_times({"support": time.perf_counter() - support_start})
    try:
        if not unsupported:
            try:
                fn, tuple_out = _compile_whole(gm, opts, device, writes=writes, translated=whole)
            except (Unsupported, _C.CompileError) as e:
                unsupported = support.refused_by_trial(gm, device)
                _log_fallback(f"supported nodes failed to compile together ({e}); the ones that "
                              f"fail alone run in eager PyTorch: "
                              f"{', '.join(n.name for n in unsupported) or 'none'}")
                if not unsupported:
                    raise
        if not unsupported:
            placeholders = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
            if (direct is not None and tuple_out and isinstance(fn, _BrazeGraph)
                    and placeholders == direct["inputs"] and aot.plain_inference()):
                direct["fn"] = replayed(fn.fast(), [fn], whole=True)
            graphs = [fn] if isinstance(fn, _BrazeGraph) else []
            call = fn.fast() if writes and direct is not None and graphs else fn
            return make_boxed_func(replayed(call if tuple_out else lambda *args: call(*args)[0],
                                            graphs, whole=True))
        fused, graphs = _compile_partitioned(gm, unsupported, opts, device, forward)
        forward = cuda_support.checked_once(fused.forward, graphs)

        def unboxed(*args):
            return forward(list(args))
        captured = replayed(unboxed, graphs)
        if captured is not unboxed:
            return make_boxed_func(captured)

        # AOTAutograd's boxed call: its list of arguments is the caller's only reference to
        # them, and fused.forward empties it, so each dies after the partition that last reads
        # it (a backward's saved activations, its incoming gradients).
        def boxed(args):
            return forward(args)
        boxed._boxed_call = True
        return boxed
    except (Unsupported, _C.CompileError, _C.RunError) as e:  # RunError: a library won't load
        if _strict(opts):
            raise
        reason = f"braze cannot compile this graph: {e}"
    except Exception as e:  # an internal error must never break the user's program
        if _strict(opts):
            raise
        reason = f"internal error in braze ({type(e).__name__}: {e})"
    if forward:  # braze_backend runs the graph Dynamo gave (_GraphInEager)
        raise _GraphInEager(reason)
    _count_fallback_graph()
    warnings.warn(f"{reason}; running this graph in eager PyTorch")
    _log_fallback(reason)
    return make_boxed_func(gm.forward)


class _GraphInEager(Exception):
    """A forward graph braze cannot compile: braze_backend runs Dynamo's graph in eager, with
    the user's own ops. AOTAutograd's graph holds the decompositions braze asks for
    (decompositions.table), which are written to be compiled: run in eager, a grouped
    product's broadcasts every row against every expert's weights (88 GiB for a Mixtral-sized
    layer). A backward graph has no such graph to go back to: it runs AOTAutograd's in eager."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


def _count_fallback_op(node):
    """Counts call_function `node` as left to eager PyTorch, in total and by op; False for a
    getitem (one result of an op counted already) and for a size (SymInt arithmetic on the
    host, not a tensor op)."""
    if node.target is operator.getitem or sizes.is_size(node):
        return False
    with _state.lock:  # backward graphs compile in the background
        _state.counts["fallback_ops"] += 1
        _state.fallback_ops_by_op[str(node.target)] += 1
    return True


def _count_fallback_graph():
    with _state.lock:
        _state.counts["fallback_graphs"] += 1


def _compile_partitioned(gm, unsupported, opts, device=None, forward=True):
    """Supported nodes are grouped into partitions (partition.propose); each partition is
    compiled by braze and the rest runs eagerly. Returns the partitioned module, which calls
    each compiled partition as a function, and the braze graphs it calls."""
    for node, why in unsupported.items():
        if _count_fallback_op(node):
            _log_fallback(f"{node.name} ({node.target}): {why}")
    if not forward:
        partition.sink_large_products(gm, unsupported)
    fused = partition.fuse(gm, partition.propose(gm, unsupported))
    compiled = {}
    subs = [(name, sub) for name, sub in fused.named_children() if name.startswith("fused_")]
    for (name, sub), result in zip(subs, _compile_all(subs, opts, device)):
        try:
            if isinstance(result, BaseException):
                raise result
            compiled[name] = result
        except (Unsupported, _C.CompileError) as e:
            if _strict(opts):
                raise
            # This partition's ops run in eager PyTorch; the other partitions stay compiled.
            for node in sub.graph.nodes:
                if node.op == "call_function":
                    _count_fallback_op(node)
            _log_fallback(f"partition {name} runs in eager PyTorch: {e}")
    # Eager results reach eager ops and the caller laid out as their meta values say.
    guard_eager_layouts(fused, set(compiled))
    calls = [n for n in fused.graph.nodes if n.op == "call_module" and n.target in compiled]
    unguarded = {n: partition.unguarded_arguments(n, set(calls), forward) for n in calls}
    graphs = []
    for node in calls:
        name = node.target
        fn, tuple_out = compiled[name]
        if isinstance(fn, _BrazeGraph):
            graphs.append(fn)
            fn = partition.lean_call(fn, unguarded[node])
        node.op, node.target = "call_function", partition.partition_call(fn, tuple_out, name)
    for name in compiled:
        fused.delete_submodule(name)
    fused.graph.set_codegen(partition.ArgumentList())
    fused.recompile()
    return fused, graphs


def _compile_all(subs, opts, device):
    """_compile_whole of each (name, graph module), on several threads (braze's C++ compile
    releases the GIL; identical partitions are built once, through the cache): each result,
    or the exception it raised."""
    def one(item):
        try:
            return _compile_whole(item[1], opts, device)
        except Exception as e:
            return e
    workers = min(len(subs), os.cpu_count() or 1, 8)
    if workers <= 1:
        return [one(item) for item in subs]
    from concurrent.futures import ThreadPoolExecutor
    # Each in a copy of this context, so that its stage times count to this graph's split.
    contexts = [contextvars.copy_context() for _ in subs]
    with ThreadPoolExecutor(workers, thread_name_prefix="braze-compile") as pool:
        return list(pool.map(lambda c, item: c.run(one, item), contexts, subs))


_said_once = set()


def _log_once(key, msg):
    """Says `msg` under BRAZE_LOG (any stage) once per process."""
    if key in _said_once or not os.environ.get("BRAZE_LOG"):
        return
    _said_once.add(key)
    print(f"===== braze =====\n{msg}", file=sys.stderr)


def braze_backend(gm, example_inputs, options=None, mode=None, **others):
    """The `backend="braze"` entry point (registered through torch_dynamo_backends).
    torch.compile passes `options` and `mode` (braze.options.MODES); a keyword a later torch
    passes is ignored, and said once under BRAZE_LOG."""
    opts = options_from_torch_compile(options, mode)
    if accuracy.enabled(opts):  # the checker runs eager work at each call: nothing captured
        opts = dataclasses.replace(opts, cuda_graphs=False)
    for key in sorted(others):
        _log_once(("keyword", key), f"torch.compile passed {key}={others[key]!r}, which braze "
                                    f"does not read; ignored")
    if support.integer_interpolation(gm):
        _count_fallback_graph()
        _log_fallback("integer bilinear/bicubic interpolation: PyTorch's decomposition rounds "
                      "differently from its kernel; running this graph in eager PyTorch")
        return gm.forward
    # Inference (grad mode off, or no input that requires grad: Dynamo guards on both): if the
    # forward graph compiles whole and AOTAutograd's runtime wrapper would do nothing for it,
    # Dynamo calls braze directly.
    plain = all(type(a) in (torch.Tensor, torch.nn.Parameter) or not isinstance(a, torch.Tensor)
                for a in example_inputs)
    inference = not torch.is_grad_enabled() or not any(
        isinstance(a, torch.Tensor) and a.requires_grad for a in example_inputs)
    direct = {"inputs": len(example_inputs)} if plain and inference else None
    trace_as_math_for_training(gm, example_inputs)
    cuda_indices = {a.device.index for a in example_inputs
                    if isinstance(a, torch.Tensor) and a.device.type == "cuda"}
    for index in cuda_indices:
        cuda_support.preload(torch.cuda.current_device() if index is None else index)
    fw = functools.partial(_compile_fx, opts=opts, direct=direct)
    # AOTAutograd hands over a backward graph with its forward only when asked to (where this
    # PyTorch can be asked).
    early = opts.early_backward
    if early is None:
        early = bool(cuda_indices)
    early = (early and not inference
             and hasattr(torch._functorch.config, "force_non_lazy_backward_lowering"))
    if early:
        bw = functools.partial(_compile_early, opts=opts)
        handover = torch._functorch.config.patch(force_non_lazy_backward_lowering=True)
    else:
        bw = functools.partial(_compile_fx, opts=opts, forward=False)
        handover = contextlib.nullcontext()
    # The min-cut partition (TorchInductor's): the backward recomputes what braze fuses cheaply
    # (a log-softmax from its logits, say) rather than the forward storing it for the backward.
    try:
        with handover:
            # Writes into inputs stay in inference graphs (as copy_ at their end), for braze to
            # make into the inputs' memory (braze/mutations.py).
            compiled = aot_autograd(fw_compiler=fw, bw_compiler=bw,
                                    partition_fn=min_cut_rematerialization_partition,
                                    keep_inference_input_mutations=True,
                                    decompositions=decompositions.table(torch.is_grad_enabled()))(
                                        gm, example_inputs)
    except _GraphInEager as e:  # the forward graph does not compile: the user's ops run
        reason = e.reason
        _count_fallback_graph()
        warnings.warn(f"{reason}; running this graph in eager PyTorch")
        _log_fallback(reason)
        return gm.forward
    except Exception as e:  # AOTAutograd's tracing, with braze's decompositions, failed
        if _strict(opts) or isinstance(e, aot.DYNAMO_HANDLES):
            raise
        _count_fallback_graph()
        reason = f"tracing for braze failed ({type(e).__name__}: {str(e)[:300]})"
        warnings.warn(f"braze: {reason}; running this graph in eager PyTorch")
        _log_fallback(reason)
        return gm.forward
    if direct is not None and "fn" in direct:
        return direct["fn"]
    return aot.calling_convention_fixed(compiled)
