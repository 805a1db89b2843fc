"""Compiled CUDA graphs replayed as CUDA graphs: one launch per call instead of one per kernel.

A compiled callable (a whole braze graph, or partitions with eager ops between them) is captured
on its second call; the first runs as usual, so that compilation, library plans and lazy
initialization happen outside the capture. Then each call:
  - copies the small inputs whose address may change into the capture's own input buffers;
    parameters and buffers (which AOTAutograd reports as static, and the backward's views of
    them that its forward saved), large inputs and expanded ones are read where they were when
    captured, and the capture serves only calls that pass them there (a parameter moved, or a
    large input at a new address, takes another capture);
  - replays the graph and returns new tensors on the capture's output memory.

Outputs are never overwritten while anyone still holds them: each capture keeps one reference
to every output storage, and a capture whose outputs are still referenced elsewhere (by the
caller, by a view, by autograd's saved tensors) is busy. A call then uses or makes another
capture (at most three), and when none is free it runs uncaptured. Inputs read in place that
move for good (a KV cache each generate() allocates) retire the least recently replayed capture
for a new one; large inputs that move at most calls before the captures have paid off (a
zero gradient that autograd makes anew for each backward) are copied per call from then on;
one that moved between a callable's first two calls is copied from its first capture on. A
capture that fails (an op that synchronizes, an unsupported stream operation)
is dropped for good and the callable runs uncaptured. So does a graph whose inputs copied per
call would cost more device time than its kernel launches save (an optimizer step would copy
every gradient), unless Options(cuda_graphs=True) asks for captures. Random ops
draw from PyTorch's CUDA generator, which advances per replay as it does per uncaptured call.

A graph with dynamic shapes is captured per concrete size: its sizes (the integers it is called
with, and its tensors' shapes) pick the captures made for them, and a size first seen after the
callable's first call is captured at once. A decode step over a cache that grows by one token
per call sees each size once per generate(); capturing only at a size's second call would
replay nothing in the first generate(), and padding sizes to buckets would change what a
graph computes wherever a size is read (a softmax over padded keys, a shape returned). Each size's
captures have their own memory, so a callable captures at most Options(cuda_graph_sizes) sizes
(64 by default) and stops adding sizes once its captures hold a tenth of the device's memory;
calls at further sizes run uncaptured (counted in `cuda_graph_uncaptured_sizes`).

`BRAZE_LOG=cudagraphs` says which graphs are captured and why others are not.
"""
import os
import sys
import warnings
import weakref

import torch

from braze import _C
from braze import devices, report

# Per compiled callable: one whose outputs the caller holds, one to replay, and room for large
# inputs at a second address (double buffering).
_MAX_CAPTURES = 3
_MIN_LAUNCHES = 4
# A full callable drops a capture for a new one only after this many replays per capture made.
_REPLAYS_PER_CAPTURE = 8
# A graph with dynamic shapes: the sizes captured per callable, unless Options say otherwise, and
# the share of the device's memory its captures may hold before it stops capturing new sizes.
_MAX_SIZES = 64
_SIZES_MEMORY_FRACTION = 0.1
counts = {"cuda_graphs": 0, "cuda_graph_replays": 0, "cuda_graph_busy": 0,
          "cuda_graph_uncaptured_sizes": 0}


def log(msg):
    report.note("cuda graphs", msg)
    if _C.log_cudagraphs_from_environment():
        print(f"===== braze: cudagraphs =====\n{msg}", file=sys.stderr)


def logging():
    """Whether log() is read (BRAZE_LOG=cudagraphs, or a report): costly reasons are computed
    only then."""
    return _C.log_cudagraphs_from_environment() or report.directory() is not None


def enabled(option):
    """Options(cuda_graphs=...) when set, otherwise BRAZE_CUDA_GRAPHS (on unless "0")."""
    if option is not None:
        return bool(option)
    return os.environ.get("BRAZE_CUDA_GRAPHS", "1") != "0"


# Operator namespaces of collectives (functional and in place): graphs with one are not captured.
_COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d", "c10d_functional")


def why_not(gm, example_inputs, device):
    """Why graph `gm` must not be replayed as a CUDA graph, or None."""
    if device is None or device.type != "cuda":
        return "not a CUDA graph"
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor) and x.device.type != "cuda":
            return f"input {i} is on {x.device}"
    for node in gm.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op == "call_function" and schema is not None:
            if schema.is_mutable:
                return f"{node.name} ({node.target}) mutates a tensor in place"
            if schema.name.split("::")[0] in _COLLECTIVE_NAMESPACES:
                # NCCL can run inside a capture, but no capture of one has been tested here.
                return f"{node.name} ({node.target}) is a collective, not captured until tested"
        for d in devices.tensor_devices(node):
            if d.type != "cuda":
                # A replay would not run it: its result would be the captured call's.
                return f"{node.name} makes a tensor on {d}"
    return None


def dynamic(example_inputs):
    """Whether a graph's inputs have symbolic sizes (it is captured per concrete size)."""
    return any(isinstance(x, torch.SymInt) or (isinstance(x, torch.Tensor) and any(
        isinstance(d, torch.SymInt) for d in (*x.shape, *x.stride()))) for x in example_inputs)


def size_key(args):
    """The concrete sizes of a call of a dynamic-shape graph: its integer arguments and its
    tensors' shapes (strides need no key: a copied input takes its capture's strides, and fits()
    compares those of inputs read in place)."""
    return tuple(tuple(a.shape) if isinstance(a, torch.Tensor)
                 else a if a is None or isinstance(a, (int, float))
                 else type(a).__name__ for a in args)


def static_inputs(forward):
    """Positions of a forward graph's inputs that are parameters or buffers (a fixed address);
    none for a backward graph."""
    if not forward:
        return frozenset()
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    return frozenset(getattr(meta, "static_input_indices", None) or ())


# Inputs at least this large, and inputs that overlap themselves (expanded), are not copied: the
# capture reads them where they were, and is replayed only for calls that pass them there.
_COPY_LIMIT_BYTES = 32 << 20


def _dense(t):
    """Whether t's elements fill its memory once each, in some order of its dims (no expanded
    dim, no gaps): a copy of it can be made with the same strides."""
    expect = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride != expect:
            return False
        expect *= size
    return True


# Addresses of the memory that replays write their outputs to, each with the number of live
# captures that write there. An input there (a forward's saved activation, read by the backward)
# is read in place, not copied per call: a replay writes the same memory each time, and a
# capture whose outputs are still in use is not replayed (busy()), so such an input is where the
# capture read it for as long as it is used. Reading an input in place is right whenever it is at
# the captured address; fits() checks that. An address leaves when the last capture writing it is
# released or collected: its memory then goes back to the allocator, and a tensor later placed
# there is an ordinary input (were it read in place, a capture would serve only calls that pass
# that one address, and a KV cache that grows by a new tensor per step would never replay).
_replay_outputs = {}


# Addresses of the parameters and buffers that live forward captures read in place (and hold),
# each with the number of captures reading it. A backward graph's inputs carry no such mark
# (AOTAutograd reports static inputs for the forward only), but the weights the forward saves
# for it are these tensors or views of them: they are read in place too, not copied per call
# (a ResNet-50 training step's backward copied 109 inputs per call, 83 us a step on an H200).
# An address leaves with the last capture reading it, as a replay output's does.
_parameters = {}


def _add(registry, keys):
    for k in keys:
        registry[k] = registry.get(k, 0) + 1


def _remove(registry, keys):
    for k in keys:
        n = registry.pop(k, 0) - 1
        if n > 0:
            registry[k] = n


def _fixed_memory(t):
    """Whether tensor t lies in memory whose address holds for as long as a capture that reads
    it in place lives: an earlier replay's output, or a parameter a live forward capture reads."""
    key = t.untyped_storage().data_ptr()
    return key in _replay_outputs or key in _parameters


def _forget_capture(outputs, parameters):
    _remove(_replay_outputs, outputs)
    _remove(_parameters, parameters)


# PyTorch's comparison of tensors' addresses with recorded ones, in one call (its CUDA-graph
# trees use it); None where this PyTorch lacks it.
_ptrs_equal = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)


def _copied(args, static, written, moving=frozenset()):
    """Positions of the inputs a capture copies per call: tensors that may move, other than
    parameters, inputs the graph writes (a replay writes them where they are), large inputs
    (unless they are among `moving`, seen to move at most calls), expanded inputs and the
    memory of earlier replays' outputs."""
    return [i for i, a in enumerate(args)
            if isinstance(a, torch.Tensor) and i not in static and i not in written
            and (a.untyped_storage().nbytes() < _COPY_LIMIT_BYTES or i in moving) and _dense(a)
            and not _fixed_memory(a)]


# What a replay saves per kernel launch, and how fast the device copies inputs: a graph whose
# copies per call would cost more than its launches (an optimizer step, copying every
# gradient) runs uncaptured, unless Options(cuda_graphs=True) asks for captures.
_LAUNCH_SECONDS = 4e-6
_COPY_BYTES_PER_SECOND = 1.5e12


class _Capture:
    def __init__(self, fn, args, static, name, written=frozenset(), moving=frozenset()):
        self.graph = torch.cuda.CUDAGraph()
        self.static = static
        self.buffers = {}  # position -> this capture's copy of an input that may move
        fixed = []  # (position, address, strides): inputs read where they were captured
        inputs = []
        copy = set(_copied(args, static, written, moving))
        for i, a in enumerate(args):
            if i in copy:
                a = self.buffers[i] = torch.empty_strided(
                    a.shape, a.stride(), dtype=a.dtype, device=a.device).copy_(a)
            elif isinstance(a, torch.Tensor):
                fixed.append((i, a.data_ptr(), a.stride()))
            inputs.append(a)
        # fits() compares the addresses of the inputs read in place in one call; a parameter's
        # strides are Dynamo's to guard, the others' are compared here.
        self.fixed_ptrs = [None] * len(args)
        for i, ptr, _ in fixed:
            self.fixed_ptrs[i] = ptr
        self.fixed_positions = [i for i, _, _ in fixed]
        self.fixed_strides = [(i, stride) for i, _, stride in fixed if i not in static]
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph, pool=torch.cuda.graph_pool_handle()):
            outs = fn(*inputs)
        self.is_list = isinstance(outs, (list, tuple))
        outs = list(outs) if self.is_list else [outs]
        # One private tensor per output (never given out) and one storage reference each: a
        # storage whose use count exceeds what this capture holds is still in use elsewhere.
        self.templates = [o.detach() if isinstance(o, torch.Tensor) else o for o in outs]
        # An output that views an input read in place (a transposed weight saved for the
        # backward) is that view at every replay that fits; its memory is the input's, not the
        # pool's, so it is not counted. One that views a copied input (a training forward
        # returns its input ids for the backward) would change at the next replay: each call
        # returns that view of the caller's own tensor instead, as eager does.
        in_place = {args[i].untyped_storage().data_ptr() for i in self.fixed_positions}
        copied = {b.untyped_storage().data_ptr(): i for i, b in self.buffers.items()}
        self.storages = {}
        self.views = {}  # output position -> (input position, size, stride, offset in the input)
        for j, o in enumerate(self.templates):
            if isinstance(o, torch.Tensor):
                st = o.untyped_storage()
                key = st.data_ptr()
                if key in in_place:
                    continue
                if key in copied:
                    i = copied[key]
                    if o.dtype != self.buffers[i].dtype:
                        raise _Uncapturable("an output views an input copied per call with "
                                            "another dtype")
                    offset = o.storage_offset() - self.buffers[i].storage_offset()
                    self.views[j] = (i, tuple(o.shape), o.stride(), offset)
                    continue
                held, _ = self.storages.get(key, (0, st))
                self.storages[key] = (held + 1, st)
        # The parameters' memory is held as long as this capture: were it freed with its model,
        # a tensor the allocator later placed there would be read in place as a parameter.
        self.parameters = {args[i].untyped_storage().data_ptr(): args[i].untyped_storage()
                           for i in self.fixed_positions if i in static}
        # busy()'s view of storages: each one's use count, and the most it may be while free.
        self._limits = [(st._cdata, held + 1) for held, st in self.storages.values()]
        parameters = list(self.parameters)
        _add(_replay_outputs, self.storages)
        _add(_parameters, parameters)
        self._forget = weakref.finalize(self, _forget_capture, list(self.storages), parameters)
        log(f"captured {name}: {len(outs)} outputs, {len(self.buffers)} inputs copied per "
            f"call, {len(fixed)} read in place, {len(self.views)} outputs viewing a "
            f"caller's input")

    @staticmethod
    def _used_elsewhere(held, st):
        # Each template holds one use of its storage (and the storage object another).
        return torch._C._storage_Use_Count(st._cdata) > held + 1

    def busy(self):
        # Checked before every replay, over every output's storage (a hundred and more for a
        # training backward): one C call each, no method lookups (a third of the host time).
        use = torch._C._storage_Use_Count
        return any(use(cdata) > most for cdata, most in self._limits)

    def release(self):
        """Drops the graph; outputs a caller still holds keep their memory."""
        self._forget()  # once: a collected capture's finalizer then does nothing
        self.graph = self.templates = self.storages = self.buffers = self.parameters = None
        self._limits = []

    def held_outputs(self):
        """The outputs whose memory is still in use elsewhere (why the capture is busy)."""
        held = []
        for j, o in enumerate(self.templates):
            if isinstance(o, torch.Tensor):
                entry = self.storages.get(o.untyped_storage().data_ptr())
                if entry is not None and self._used_elsewhere(*entry):
                    held.append(f"output {j} {o.dtype} {list(o.shape)}")
        return held

    def fits(self, args):
        """Whether every input read in place is where this capture reads it, and every copied
        input that an output views has the strides of its copy."""
        if _ptrs_equal is not None:
            if not _ptrs_equal(list(args), self.fixed_ptrs, self.fixed_positions):
                return False
        elif any(args[i].data_ptr() != self.fixed_ptrs[i] for i in self.fixed_positions):
            return False
        return (all(args[i].stride() == stride for i, stride in self.fixed_strides) and
                all(args[i].stride() == self.buffers[i].stride() for i, _, _, _ in
                    self.views.values()))

    def why_not(self, args):
        """Why this capture does not serve a call with `args` (busy, or an input moved): for
        the log when another capture is made beside it."""
        if self.busy():
            return "its outputs are still in use (" + ", ".join(self.held_outputs()) + ")"
        moved = [i for i in self.fixed_positions if args[i].data_ptr() != self.fixed_ptrs[i]]
        if moved:
            return f"input {moved[0]}, read in place, moved" + (
                f" ({len(moved)} inputs did)" if len(moved) > 1 else "")
        return "an input's strides changed"

    def run(self, args):
        if self.buffers:
            torch._foreach_copy_(list(self.buffers.values()), [args[i] for i in self.buffers])
        self.graph.replay()
        outs = [o.detach() if isinstance(o, torch.Tensor) else o for o in self.templates]
        for j, (i, size, stride, offset) in self.views.items():
            a = args[i].detach()
            outs[j] = a.as_strided(size, stride, a.storage_offset() + offset)
        return outs if self.is_list else outs[0]


class _Uncapturable(Exception):
    pass


def _end_generator_capture():
    """A capture that fails inside the captured code leaves PyTorch's CUDA generators in
    capture mode (CUDAGraph::capture_end raises before it releases them), and every later
    random op would fail. A capture that succeeds releases them."""
    try:
        g = torch.cuda.CUDAGraph()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "The CUDA Graph is empty": it is meant to be
            with torch.cuda.graph(g):
                pass
        del g
    except Exception as e:
        log(f"releasing the CUDA generators after a failed capture failed too: {e}")


class _Captures:
    """The captures of one size of a callable (its only size, for a static graph)."""

    def __init__(self):
        self.captures = []
        self.made = 0  # captures made, and calls replayed, at this size
        self.replays = 0


class Replayed:
    """`fn` (called with the graph's positional arguments) replayed as CUDA graphs; with
    `max_sizes`, a graph with dynamic shapes captured per concrete size (at most that many)."""

    def __init__(self, fn, static, name, after_replay=None, written=frozenset(), max_sizes=None,
                 launches=None):
        self.fn = fn
        # Kernel launches per call, when known and captures are not forced: checked against
        # the inputs' copies at the first capture, then None.
        self.launches = launches
        self.launch_count = launches  # kept: _copy_moving checks its copies against it too
        self.static = static
        self.written = written  # positions of inputs the graph writes
        # Large inputs copied per call all the same: they moved at most calls (_copy_moving).
        self.moving = frozenset()
        self.name = name
        self.after_replay = after_replay
        self.max_sizes = max_sizes
        self.calls = 0
        self.sizes = {}  # size_key -> _Captures (key None for a static graph)
        self.bytes = 0  # device memory the captures reserved
        self.full = False  # no more sizes are captured
        self.failed = False
        # The large inputs of the first (uncaptured) call, position -> (address, shape), until
        # the first capture compares them with its own (_moved_since_first_call).
        self._first_call = None

    @property
    def captures(self):
        return [c for group in self.sizes.values() for c in group.captures]

    def __call__(self, *args):
        self.calls += 1
        if self.calls == 1 and not self.failed:
            self._first_call = self._large_inputs(args)
        if self.failed or self.calls == 1 or torch.cuda.is_current_stream_capturing():
            return self.fn(*args)
        key = size_key(args) if self.max_sizes is not None else None
        group = self.sizes.get(key)
        if group is None:
            if key is not None and (self.full or not self._room()):
                counts["cuda_graph_uncaptured_sizes"] += 1
                return self.fn(*args)
            group = self.sizes[key] = _Captures()
        for k, c in enumerate(group.captures):
            if not c.busy() and c.fits(args):
                c.used = self.calls
                if k:  # the capture replayed last is tried first at the next call
                    group.captures.insert(0, group.captures.pop(k))
                return self._replayed(group, c.run(args))
        if self._first_call is not None:  # the first capture
            self._moved_since_first_call(args)
        if self.launches is not None:  # the first capture: is it worth its copies?
            launches, self.launches = self.launches, None
            copies = sum(args[i].untyped_storage().nbytes()
                         for i in _copied(args, self.static, self.written, self.moving))
            if copies / _COPY_BYTES_PER_SECOND > launches * _LAUNCH_SECONDS:
                self._drop(f"its inputs copied per call ({copies / 2**20:.1f} MiB) would cost "
                           f"more than its {launches} kernel launches save")
                return self.fn(*args)
        if len(group.captures) >= _MAX_CAPTURES and not (
                self._copy_moving(group, args) or self._evict(group)):
            counts["cuda_graph_busy"] += 1
            return self.fn(*args)
        if group.captures and group.made < _MAX_CAPTURES and logging():
            log(f"{self.name} captures again at call {self.calls}: " + "; ".join(
                f"capture {k + 1} cannot replay: {c.why_not(args)}"
                for k, c in enumerate(group.captures)))
        reserved = torch.cuda.memory_reserved()
        try:
            c = _Capture(self.fn, args, self.static, self.name, self.written, self.moving)
        except Exception as e:  # any failure to capture: this callable runs uncaptured
            _end_generator_capture()
            self._drop(f"capture failed: {type(e).__name__}: {e}")
            return self.fn(*args)
        self.bytes += max(torch.cuda.memory_reserved() - reserved, 0)
        counts["cuda_graphs"] += 1
        group.made += 1
        c.used = self.calls
        group.captures.append(c)
        return self._replayed(group, c.run(args))

    def _room(self):
        """Whether a dynamic-shape callable may capture one more size."""
        budget = _SIZES_MEMORY_FRACTION * torch.cuda.get_device_properties(
            torch.cuda.current_device()).total_memory
        if len(self.sizes) < self.max_sizes and self.bytes < budget:
            return True
        self.full = True
        log(f"{self.name} captures no more sizes: {len(self.sizes)} captured (at most "
            f"{self.max_sizes}), holding {self.bytes / 2**20:.1f} MiB (at most "
            f"{budget / 2**20:.0f} MiB); calls at other sizes run uncaptured")
        return False

    def _large_inputs(self, args):
        """The inputs a capture would read in place for their size alone (not parameters, not
        written, dense), with their addresses and shapes."""
        return {i: (a.data_ptr(), tuple(a.shape)) for i, a in enumerate(args)
                if isinstance(a, torch.Tensor) and i not in self.static and
                i not in self.written and a.untyped_storage().nbytes() >= _COPY_LIMIT_BYTES
                and _dense(a)}

    def _moved_since_first_call(self, args):
        """At the first capture: large inputs of the same shape that are at another address than
        at the first call, and are no earlier replay's output, are copied per call from the
        start, where the copies cost less than the launches a replay saves. A zero gradient that
        autograd makes anew for each backward (a language model's logits, which the loss does
        not read) moves at every call; read in place, it would take a capture per call until
        _copy_moving gives up on it, each capture holding its own memory."""
        first, self._first_call = self._first_call, None
        moved = {i for i, (ptr, shape) in self._large_inputs(args).items()
                 if i in first and first[i][1] == shape and first[i][0] != ptr and
                 not _fixed_memory(args[i])}
        if not moved:
            return
        copies = self._copy_from_now_on(args, moved)
        if copies is None:
            return
        log(f"{self.name} copies inputs {sorted(moved)} per call: large, they moved between "
            f"its first two calls ({copies / 2**20:.1f} MiB copied per call)")

    def _copy_from_now_on(self, args, moved):
        """Adds inputs `moved` to those copied per call, unless the copies of a call would then
        cost more than the launches a replay saves: the bytes a call copies, or None."""
        moving = self.moving | moved
        copies = sum(args[i].untyped_storage().nbytes()
                     for i in _copied(args, self.static, self.written, moving))
        if (self.launch_count is not None and
                copies / _COPY_BYTES_PER_SECOND > self.launch_count * _LAUNCH_SECONDS):
            return None
        self.moving = frozenset(moving)
        return copies

    def _copy_moving(self, group, args):
        """Makes room for a capture when the inputs read in place for their size alone (not
        parameters, not written, not earlier replays' output) move at most calls, before the
        captures paid off: a zero gradient that autograd makes anew for each backward, for an
        output the loss does not read (a language model's logits). Those inputs are copied per
        call from now on, as smaller ones are, where the copies cost less than the launches a
        replay saves; the captures that read them in place are dropped. An input that moves
        only now and then (a cache remade per generation) is left to _evict."""
        if group.replays >= _REPLAYS_PER_CAPTURE * group.made:
            return False
        moving = set()
        for c in group.captures:
            for i in c.fixed_positions:
                a = args[i]
                if (a.data_ptr() != c.fixed_ptrs[i] and i not in self.static and
                        i not in self.written and _dense(a) and not _fixed_memory(a)):
                    moving.add(i)
        if not moving:
            return False
        copies = self._copy_from_now_on(args, moving)
        if copies is None:
            return False
        for c in group.captures:
            c.release()
        group.captures = []
        log(f"{self.name} copies inputs {sorted(moving)} per call from now on (read in place, "
            f"they moved within {group.replays} replays of {group.made} captures): "
            f"{copies / 2**20:.1f} MiB copied per call")
        return True

    def _evict(self, group):
        """Makes room for a capture: drops the least recently replayed capture of this size
        whose outputs are free, when captures have paid off so far (an input read in place that
        moves at every call, or outputs held across calls, would otherwise recapture every
        call). Inputs read in place move for good when their owner is remade: a KV cache that
        each generate() allocates anew is written in place, at a new address per generate."""
        free = [c for c in group.captures if not c.busy()]
        if not free or group.replays < _REPLAYS_PER_CAPTURE * group.made:
            if counts["cuda_graph_busy"] < 3:  # why, the first few times
                held = "; ".join(", ".join(c.held_outputs()) for c in group.captures)
                log(f"{self.name} runs uncaptured: " + (
                    f"every capture's outputs are still in use ({held})" if not free else
                    f"its inputs read in place moved after {group.replays} replays of "
                    f"{group.made} captures"))
            return False
        old = min(free, key=lambda c: c.used)
        group.captures.remove(old)
        old.release()
        log(f"{self.name}: dropped the capture last replayed at call {old.used}: inputs it "
            f"reads in place have moved")
        return True

    def _replayed(self, group, out):
        group.replays += 1
        counts["cuda_graph_replays"] += 1
        if self.after_replay is not None:
            self.after_replay()
        return out

    def _drop(self, reason):
        log(f"{self.name} runs without CUDA graphs from now on: {reason}")
        self.failed = True
        for c in self.captures:
            c.release()
        self.sizes = {}


def wrap(fn, gm, example_inputs, device, option, name, forward=True, after_replay=None,
         launches=None, written=frozenset(), max_sizes=None):
    """fn replayed as CUDA graphs when that is enabled and safe for `gm`; fn otherwise.
    `after_replay()` runs after each replay (it may raise the errors of that call). The inputs
    at positions `written`, which fn writes into, are read in place, never copied. By default
    (option None) a graph of fewer than _MIN_LAUNCHES kernel launches per call is not captured:
    copying its inputs and replaying costs more than launching; option True captures it too.
    A graph with dynamic shapes is captured per size, at most `max_sizes` (None: _MAX_SIZES)."""
    if not enabled(option):
        return fn
    reason = why_not(gm, example_inputs, device)
    if reason is None and option is None and launches is not None and launches < _MIN_LAUNCHES:
        reason = f"{launches} kernel launches per call: a replay would cost more than it saves"
    if reason is not None:
        if device is not None and device.type == "cuda":
            log(f"{name} is not captured: {reason}")
        return fn
    sizes = None
    if dynamic(example_inputs):
        sizes = _MAX_SIZES if max_sizes is None else max_sizes
        if sizes < 1:
            log(f"{name} is not captured: dynamic shapes, and Options(cuda_graph_sizes=0)")
            return fn
    return Replayed(fn, static_inputs(forward), name, after_replay, written, sizes,
                    launches if option is None else None)
