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
from braze.fx_import import Translator
from braze.options import Options
from braze.options import from_torch_compile as options_from_torch_compile
from braze.registry import Unsupported
from braze.support import fetch_attr
# Each rule module registers its rules in braze.registry when imported.
from braze import rules_scatter, rules_special, rules_nn, rules_misc, rules_sort  # noqa: F401,E402
from braze import rules_complex, rules_attention  # noqa: F401,E402
from braze.rules_attention import trace_as_math_for_training, unify_lengths
from braze.layouts import (as_layout, computed_view, concrete_layout, guard_eager_layouts,
                           input_view, shared_outputs)

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
        # braze takes), lower (C++ passes and codegen), host_compile, nvrtc, load, python
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
    kept and counted in counters()["recompiles"]. Outputs that the FX graph declares with a
    layout braze does not produce directly (strided or expanded) are laid out as declared. If
    braze's own call path fails, that call runs the eager graph on inputs laid out as the graph
    declares them, with one warning: never a wrong answer and never a broken program."""

    def __init__(self, compiled, tensor_positions, constants, needs_seed, eager,
                 complex_outputs=(), none_slots=(), run=None, device=None, *,
                 input_layouts=(), output_layouts=(), recompile=None, strict=False, bases=0,
                 carried=(), assertions=()):
        self.compiled = compiled
        # the message of each assertion, whose condition is one of the last outputs
        self.assertions = list(assertions)
        self.run = run or compiled.run  # inputs (flat list of tensors) -> outputs
        self.device = device  # where the seed of random ops lives
        # (output position, None or (args, bases) -> tensor) of each output the graph does not
        # compute: None (e.g. no gradient for an input), or a view made in eager of an argument
        # or of a base: one of the last `bases` computed outputs, which are not returned
        self.none_slots = none_slots
        self.bases = bases
        self.tensor_positions = tensor_positions
        # (input number, argument position) of each size argument passed as a SizeCarrier
        self.carried = carried
        self.complex_outputs = complex_outputs  # output slots returned as complex views
        self.constants = constants  # tensors the graph holds as attributes, passed after the args
        self.needs_seed = needs_seed  # random ops: a fresh seed from torch's generator per call
        self.eager = eager
        # (argument position, sizes, strides) of each tensor argument with a static layout
        self.input_layouts = input_layouts
        # (output slot, sizes, strides) of each output braze computes row-major but the graph
        # declares with other strides
        self.output_layouts = output_layouts
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
                or (run.into and not isinstance(run, cpu_support.CpuGraph)) or self.needs_seed
                or run.checks
                or self.complex_outputs or self.output_layouts or self.checker is not None
                or self.assertions
                or any(c.is_complex() for c in self.constants)):
            return self
        call = run.guarded_call(self.tensor_positions, self.constants)
        if not self.none_slots:
            return call
        fill = self._fill

        def with_slots(*args):
            return fill(args, call(*args))
        return with_slots

    def _fill(self, args, outs):
        """The outputs the graph returns: the computed ones, with the made ones inserted."""
        bases = []
        if self.bases:
            bases = outs[-self.bases:]
            del outs[-self.bases:]
        for i, make in self.none_slots:
            outs.insert(i, make(args, bases) if make is not None else None)
        return outs

    def __call__(self, *args):
        inputs = [args[i] for i in self.tensor_positions] + self.constants
        for k, i in self.carried:
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
            for i in self.complex_outputs:
                outs[i] = torch.view_as_complex(outs[i])
            for i, shape, stride in self.output_layouts:
                outs[i] = as_layout(outs[i], shape, stride)
            outs = self._fill(args, outs)
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
        if self.assertions:
            conds = outs[-len(self.assertions):]
            del outs[-len(self.assertions):]
            for cond, msg in zip(conds, self.assertions):
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
        for i, shape, stride in self.input_layouts:  # eager gets the layouts it was traced with
            if isinstance(args[i], torch.Tensor):
                args[i] = as_layout(args[i], shape, stride)
        out = self.eager(*args)
        return list(out) if isinstance(out, (tuple, list)) else [out]


def _compile_whole(gm, opts, device=None, args=None, writes=()):
    """Translates and compiles a graph whose every node braze supports, for the CPU or for
    the CUDA `device`. With `args` (one call's arguments), the graph is compiled for exactly
    their sizes and strides: a variant for inputs laid out otherwise than the example inputs."""
    t = Translator(sizes.bindings(gm, args) if args is not None else None)
    positions, input_layouts = [], []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            t.input(node, args[i] if args is not None else val)
            positions.append(i)
            layout = concrete_layout(val)
            if layout is not None:
                input_layouts.append((i, *layout))
        elif not isinstance(val, (torch.SymInt, int)):
            raise Unsupported(f"placeholder {node.name} of type {type(val).__name__}")
    # Sizes are bound from the tensors' shapes; a size argument that is no dim of them comes in
    # as a carrier (SizeCarrier).
    carried = []  # (input number, argument position) of each carrier
    for i in sizes.carried(placeholders):
        t.g.input(placeholders[i].name, "u8", [t.sym(placeholders[i].meta["val"])],
                  [t.g.sym_const(0)])
        carried.append((len(positions), i))
        positions.append(i)
    constants = []
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = fetch_attr(gm, node.target)
            if not isinstance(value, torch.Tensor):
                raise Unsupported(f"attribute {node.target} is not a tensor")
            t.input(node, value)
            constants.append(value)
    outputs = None
    for node in gm.graph.nodes:
        if node.op == "call_function":
            if not sizes.is_size(node):  # sizes come from the meta values
                t.translate(node)
        elif node.op == "output":
            outputs = node.args[0]
    flat = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    if not flat:
        # Every output aliased an input and AOTAutograd regenerates it: nothing to compute.
        return (lambda *args: []), True
    # Outputs that are None, or arguments or views of one (a weight or its transpose saved for
    # the backward): made at each call, never computed into new memory.
    made = [(i, None if o is None else input_view(gm, o)) for i, o in enumerate(flat)]
    none_slots = [(i, make) for (i, make), o in zip(made, flat) if o is None or make is not None]
    if len(none_slots) == len(flat):
        return (lambda *args: [make(args) if make is not None else None
                               for _, make in none_slots]), isinstance(outputs, (tuple, list))
    none_slots = [(i, make if make is None else (lambda args, bases, m=make: m(args)))
                  for i, make in none_slots]
    injected = {i for i, _ in none_slots}
    # Outputs that view a computed value without being dense (a K/V cache sliced from a fused
    # projection): the value is computed as a base output and the view made of it.
    bases = []

    def base_slot(base):
        """base's position among the computed bases (added once)."""
        if base not in bases:
            bases.append(base)
        return bases.index(base)

    for j, o in enumerate(flat):
        found = None if j in injected else computed_view(o)
        if found is None or not isinstance(t.values.get(found[0]), int):
            continue
        base, view = found
        k = base_slot(base)
        none_slots.append((j, lambda args, made, k=k, view=view: view(made[k])))
        injected.add(j)
    # Outputs that share memory in eager (a saved activation and its transpose): the base is
    # computed once and each of them made of it.
    for base, members in shared_outputs(flat, injected):
        k = base_slot(base)
        for j, size, stride, offset in members:
            none_slots.append((j, lambda args, made, k=k, size=size, stride=stride, offset=offset:
                               made[k].as_strided(size, stride, made[k].storage_offset() + offset)))
            injected.add(j)
    none_slots.sort(key=lambda slot: slot[0])
    handles, layouts, complex_outputs, output_layouts = [], [], [], []
    handle_of = {}  # FX output -> the braze output that computes it
    for j, o in enumerate(flat):
        if j in injected:
            continue
        if not isinstance(o, torch.fx.Node) or not isinstance(t.values.get(o), int):
            raise Unsupported(f"output {o!r} is not a tensor")
        handle_of[j] = len(handles)
        handles.append(t.values[o])
        val = o.meta.get("val")
        if isinstance(val, torch.Tensor) and val.is_complex():
            complex_outputs.append(len(handles) - 1)
            declared = concrete_layout(val)
            val = torch.view_as_real(val.resolve_conj())
        else:
            declared = concrete_layout(val)
        dense = _dense_layout(t, val)
        layouts.append(dense)
        if declared is not None and not dense and not val.is_contiguous():
            output_layouts.append((len(handles) - 1, *declared))
    for base in bases:
        handles.append(t.values[base])
        layouts.append(_dense_layout(t, base.meta["val"]))
    for handle, _ in t.assertions:  # checked on the host after each call, then dropped
        handles.append(handle)
        layouts.append([])
    t.g.output(handles, layouts)
    if opts.cuda_codegen_only:
        source = cuda_support.check_codegen(t.g)
        with _state.lock:
            _record_source(source)
        return (lambda *args: list(_as_tuple(gm.forward(*args)))), isinstance(outputs, (tuple, list))
    specs = [(tuple(v.shape), tuple(v.stride())) for v in _input_values(gm, t, args)]
    dtypes = [_real_dtype(o.meta["val"]) for j, o in enumerate(flat) if j not in injected]
    dtypes += [b.meta["val"].dtype for b in bases]
    dtypes += [torch.bool] * len(t.assertions)
    staged = report.stages(t.g, device is not None)  # printed before compile consumes t.g
    own = accuracy.schedule_of(t, handles, opts, device) if args is None else None
    if device is None:
        compiled = cpu_support.compile_graph(t.g, opts, opts.log)
        run = cpu_support.CpuGraph(compiled, specs, dtypes)
    else:
        compiled = cuda_support.compile_graph(t.g, opts, device, opts.log)
        run = cuda_support.CudaGraph(compiled, device, specs, dtypes,
                                     opts.sync_index_checks())
    report.partition(staged, compiled)
    # Outputs written into the inputs they update (mutations.take): braze output -> input.
    run.into = {handle_of[w.output]: positions.index(w.position) for w in writes
                if w.in_place and w.output in handle_of and w.position in positions}
    with _state.lock:  # partitions compile on several threads
        _add_times(compiled.times)
        _record_source(compiled.source)
        _state.counts["partitions"] += args is None
    recompile = None
    if args is None:
        def recompile(call_args):
            variant, _ = _compile_whole(gm, opts, device, call_args, writes=writes)
            return variant.run
    graph = _BrazeGraph(compiled, positions, constants, t.seed is not None, gm.forward,
                        complex_outputs, none_slots, run, device, input_layouts=input_layouts,
                        output_layouts=output_layouts, recompile=recompile,
                        strict=_strict(opts), bases=len(bases), carried=carried,
                        assertions=[msg for _, msg in t.assertions])
    if accuracy.enabled(opts) and args is None:
        graph.checker = accuracy.checker(gm, opts, device, own)
    return graph, isinstance(outputs, (tuple, list))


def _as_tuple(out):
    return out if isinstance(out, (tuple, list)) else (out,)


def _real_dtype(val):
    """The dtype of an output as braze computes it (complex values as real pairs)."""
    return torch.view_as_real(val.resolve_conj()).dtype if val.is_complex() else val.dtype


def _input_values(gm, t, args=None):
    """The values of the compiled graph's tensor inputs, in input order (placeholders, then
    attributes, then the seed of random ops), complex ones as real pairs: the example values,
    or those of `args` (one call's arguments) when given."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    vals = [args[i] if args is not None else n.meta["val"] for i, n in enumerate(placeholders)
            if isinstance(n.meta.get("val"), torch.Tensor)]
    vals += [sizes.SizeCarrier(args[i] if args is not None else placeholders[i].meta["val"])
             for i in sizes.carried(placeholders)]
    vals += [fetch_attr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"]
    if t.seed is not None:
        vals.append(torch.empty((), dtype=torch.int64))
    return [torch.view_as_real(v.resolve_conj()) if v.is_complex() else v for v in vals]


@functools.lru_cache(maxsize=1)
def _dense_layout(t, val):
    """The strides PyTorch expects for an output, when they are a dense permutation (a
    transposed or channels-last result); [] (row-major) otherwise."""
    if not isinstance(val, torch.Tensor):
        return []
    from torch._prims_common import is_non_overlapping_and_dense_or_false
    try:
        dense = bool(is_non_overlapping_and_dense_or_false(val))
    except Exception:  # symbolic strides that cannot be decided: keep row-major
        return []
    if not dense or val.is_contiguous():
        return []
    return t.shape(val.stride())


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
                              ("support", "lower", "host_compile", "nvrtc", "load"))
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
    unsupported = support.unsupported_nodes(gm, device, skip=set(host_sizes))
    # Sizes are host arithmetic: a graph compiled whole reads them from its meta values; a
    # partitioned one, or one that returns a size, computes them in its eager part.
    if unsupported or any(u.op == "output" for n in host_sizes for u in n.users):
        unsupported.update((n, "a size computed on the host") for n in host_sizes)
    with _state.lock:
        _add_times({"support": time.perf_counter() - support_start})
    try:
        if not unsupported:
            try:
                fn, tuple_out = _compile_whole(gm, opts, device, writes=writes)
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
    _count_fallback_graph()
    warnings.warn(f"{reason}; running this graph in eager PyTorch")
    _log_fallback(reason)
    return make_boxed_func(gm.forward)


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
    if mode in ("max-autotune", "max-autotune-no-cudagraphs"):
        _log_once(("mode", mode), f"mode={mode!r}: braze has no autotuner yet; compiling with "
                                  f"its default schedules")
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
    except Exception as e:  # AOTAutograd's tracing, with braze's decompositions, failed
        if _strict(opts) or isinstance(e, aot.DYNAMO_HANDLES):
            raise
        _count_fallback_graph()
        reason = f"tracing for braze failed ({type(e).__name__}: {str(e)[:300]})"
        warnings.warn(f"braze: {reason}; running this graph in eager PyTorch")
        _log_fallback(reason)
        return gm.forward
    return direct["fn"] if direct is not None and "fn" in direct else compiled
