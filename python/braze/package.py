"""braze.export: a model compiled ahead of time into a package that runs without Python; and
braze.load, which runs such a package from Python.

    braze.export(model, (x,), "model.braze", dynamic_shapes={"x": {0: Dim("batch", max=64)}})
    run = braze.load("model.braze")
    y = run(x)

C++ loads the same directory with braze::runtime::Package::load (Package.h documents the
format). An export traces the model with torch.export, decomposes it for inference with
braze's decompositions and compiles the whole graph with braze for the device of its inputs
and weights: the CPU, or one CUDA GPU (the package then holds the kernels compiled for that
GPU's architecture, and runs on device tensors). Export has no eager fallback: an op braze
cannot compile is an error that lists every such op with its source line."""
import os
import platform
import shutil
import struct
import tempfile

import torch

from braze import _C
from braze import cpu as cpu_support
from braze import cuda as cuda_support
from braze import decompositions, signature, sizes, support
from braze.fx_import import Translator
from braze.options import Options
from braze.registry import Unsupported

FORMAT_VERSION = _C.package_format_version()
CPU_FORMAT_VERSION = 1  # CPU packages stay readable by runtimes that predate CUDA packages

# torch dtype -> (package dtype, safetensors dtype)
_DTYPES = {
    torch.bool: ("bool", "BOOL"), torch.uint8: ("u8", "U8"), torch.int8: ("i8", "I8"),
    torch.int16: ("i16", "I16"), torch.int32: ("i32", "I32"), torch.int64: ("i64", "I64"),
    torch.float16: ("f16", "F16"), torch.bfloat16: ("bf16", "BF16"),
    torch.float32: ("f32", "F32"), torch.float64: ("f64", "F64"),
}
_LARGE = 2**62  # the range's upper end of a size exported without one


class ExportError(ValueError):
    """What braze.export cannot export, and why."""


def _dtype(t, what):
    if t not in _DTYPES:
        raise ExportError(f"{what} has dtype {t}, which a package cannot hold")
    return _DTYPES[t][0]


def _dim(d):
    """A dim as package text: an int, or a symbol or expression without spaces."""
    if isinstance(d, torch.SymInt):
        expr = d.node.expr
        return str(int(expr)) if expr.is_number else str(expr).replace(" ", "")
    return str(int(d))


def _where(node):
    """The source line of an FX node, from its stack trace: the innermost frame outside
    PyTorch's own modules (the user's call of a torch.nn layer, not the layer's code)."""
    trace = node.meta.get("stack_trace") or ""
    lines = [line.strip() for line in trace.strip().splitlines() if line.strip()]
    frames = [(i, line) for i, line in enumerate(lines) if line.startswith("File ")]
    if not frames:
        return "(no source line recorded)"
    torch_dir = os.path.dirname(torch.__file__)
    own = [(i, line) for i, line in frames if torch_dir not in line]
    i, frame = (own or frames)[-1]
    code = lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith("File ") else ""
    return frame.replace('File "', "").replace('", line ', ":") + (f": {code}" if code else "")


def _trace(model, example_inputs, dynamic_shapes):
    if isinstance(model, torch.export.ExportedProgram):
        return model
    if not isinstance(model, torch.nn.Module):
        raise TypeError("braze.export takes a torch.nn.Module or a torch.export.ExportedProgram, "
                        f"not {type(model).__name__}")
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    return torch.export.export(model, tuple(example_inputs), dynamic_shapes=dynamic_shapes)


def _inputs(ep):
    """(placeholder node, kind, name, value or None) of each graph input, in order: kind is
    'user' or 'weight' (a parameter, buffer or constant, whose value the package stores)."""
    from torch.export.graph_signature import InputKind
    placeholders = [n for n in ep.graph_module.graph.nodes if n.op == "placeholder"]
    out = []
    for node, spec in zip(placeholders, ep.graph_signature.input_specs):
        if spec.kind == InputKind.USER_INPUT:
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor):
                raise ExportError(f"input {node.name} is a {type(val).__name__}; a package takes "
                                  "tensors only")
            out.append((node, "user", node.name, None))
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            value = ep.state_dict.get(spec.target)
            if value is None:
                value = ep.constants.get(spec.target)
            if not isinstance(value, torch.Tensor):
                raise ExportError(f"{spec.target} is not a tensor")
            # Stored dense, in their own order (a channels-last weight stays channels-last, as
            # the code is compiled for it); anything else row-major.
            value = value.detach()
            if not _dense(value):
                value = value.contiguous()
            out.append((node, "weight", spec.target, value))
        else:
            raise ExportError(f"input {node.name} is a {spec.kind.name.lower()}, which a package "
                              "cannot hold")
    return out


def _check_outputs(ep):
    from torch.export.graph_signature import OutputKind
    for spec in ep.graph_signature.output_specs:
        if spec.kind != OutputKind.USER_OUTPUT:
            raise ExportError(f"the model writes {spec.target or spec.arg.name} "
                              f"({spec.kind.name.lower()}); export a model that does not mutate "
                              "its inputs or buffers (BatchNorm in eval mode, say)")


def _drop_asserts(gm):
    """Removes torch.export's run-time assertions (of tensor metadata and of sizes): the
    package checks its inputs' dtypes, ranks and sizes itself."""
    aten = torch.ops.aten
    asserts = {getattr(aten, name).default for name in
               ("_assert_tensor_metadata", "_assert_scalar", "_assert_async",
                "sym_constrain_range_for_size", "sym_constrain_range")
               if hasattr(aten, name)}
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in asserts and not node.users:
            gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    gm.recompile()


def _unsupported(gm):
    """{node: reason} of every op braze cannot compile in gm (a getitem of one is left out: the
    op itself is listed)."""
    import operator
    found = support.unsupported_nodes(gm, None,
                                      skip={n for n in gm.graph.nodes if sizes.is_size(n)})
    return {n: why for n, why in found.items() if n.target is not operator.getitem}


def _bound(value, default):
    """A range's end as an int (`default` where it is infinite or missing)."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return default


_ALIGN = 64  # every weight starts this aligned (cuDNN's and cuBLASLt's fast kernels need 16)


def _write_safetensors(path, tensors, metadata=None):
    """tensors: [(name, tensor)], written in that order: returns (data start, {name: (begin,
    end)}). The header is padded with spaces so that the data starts 64-byte aligned, and each
    tensor starts 64-byte aligned too: a gap before one is a zero-filled U8 entry of its own
    (named __braze_pad_<n>), since safetensors' data has no holes."""
    import json
    header, offsets, at, layout = {}, {}, 0, []
    for name, t in tensors:
        if at % _ALIGN:
            gap = _ALIGN - at % _ALIGN
            pad = f"__braze_pad_{len(layout)}"
            header[pad] = {"dtype": "U8", "shape": [gap], "data_offsets": [at, at + gap]}
            layout.append((pad, torch.zeros(gap, dtype=torch.uint8, device="cpu")))
            at += gap
        n = t.numel() * t.element_size()
        header[name] = {"dtype": _DTYPES[t.dtype][1], "shape": list(t.shape),
                        "data_offsets": [at, at + n]}
        offsets[name] = (at, at + n)
        layout.append((name, t))
        at += n
    header["__metadata__"] = {"format": "pt", "writer": "braze", **(metadata or {})}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-(8 + len(text))) % 64)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, t in layout:
            f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                    if t.numel() else b"")
    return 8 + len(text), offsets


def _memory_order(t):
    """t's dims from largest stride to smallest: for a dense tensor, t.permute(order) is
    contiguous, and its bytes are t's memory."""
    return sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))


def _dense(t):
    """Whether t's elements fill its memory exactly, in some order of its dims."""
    span = 1
    for d in reversed(_memory_order(t)):
        if t.shape[d] != 1 and t.stride(d) != span:
            return False
        span *= t.shape[d]
    return True


def _sha256(path):
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def export(model, example_inputs, path, dynamic_shapes=None, *, options=None,
           bundle_libraries=True):
    """Compiles `model` (an nn.Module called on `example_inputs`, or a
    torch.export.ExportedProgram) and writes a package to the directory `path` (replacing a
    package there), or, for a `path` ending in .zip, the same package as one zip archive.
    `dynamic_shapes` is torch.export's: the sizes it makes dynamic stay symbolic, and the
    package checks each call's sizes against their ranges. With
    `bundle_libraries` (the default), the BLAS and oneDNN libraries the code links are copied
    into the package; otherwise it names them where they are installed. Returns `path`."""
    opts = options if isinstance(options, Options) else Options(**(options or {}))
    ep = _trace(model, example_inputs, dynamic_shapes)
    table = torch.export.default_decompositions()  # core ATen, composite ops included
    table.update(decompositions.table(False))
    for op in decompositions.kept_whole():
        table.pop(op, None)
    ep = ep.run_decompositions(table)
    gm = ep.graph_module
    _drop_asserts(gm)
    _check_outputs(ep)
    inputs = _inputs(ep)
    device = _device(inputs)
    bad = _unsupported(gm)
    if bad:
        lines = [f"  {node.target} at {_where(node)}: {why}" for node, why in bad.items()]
        raise ExportError(f"{len(bad)} op{'s' if len(bad) > 1 else ''} braze cannot compile "
                          "(an exported model has no eager fallback):\n" + "\n".join(lines))

    t = Translator()
    for node, kind, name, value in inputs:
        t.input(node, node.meta["val"] if value is None else value)
    for node in gm.graph.nodes:
        if node.op == "call_function" and not sizes.is_size(node):
            try:
                t.translate(node)
            except (Unsupported, _C.CompileError) as e:
                raise ExportError(f"{node.target} at {_where(node)}: {e}") from e
    flat = _outputs(gm, signature.graph_signature(gm, t.values, views=False))
    t.g.output([t.values[o] for o in flat], [[] for _ in flat])
    if t.seed is not None:
        raise ExportError("the model draws random numbers, which a package cannot do yet")
    try:
        if device.type == "cuda":
            compiled = cuda_support.compile_graph(t.g, opts, device, opts.log)
            target = _cuda_target(compiled, device)
        else:
            compiled = cpu_support.compile_graph(t.g, opts, opts.log, portable=True)
            target = _cpu_target(opts)
    except _C.CompileError as e:
        raise ExportError(f"braze cannot compile the model: {e}") from e
    if str(path).endswith(".zip"):
        _write_archive(path, lambda d: _write_package(d, compiled, inputs, flat, ep, target,
                                                      bundle_libraries))
    else:
        _write_package(path, compiled, inputs, flat, ep, target, bundle_libraries)
    return path


def _outputs(gm, sig):
    """The FX nodes of a package's outputs, in order, from gm's signature `sig`: each one braze
    computes, as a real tensor."""
    for j, slot in enumerate(sig.outputs):
        if isinstance(slot, (signature.NoOutput, signature.NotTensor)):
            text = slot.text if isinstance(slot, signature.NotTensor) else "None"
            raise ExportError(f"output {j} ({text}) is not a tensor the graph computes")
        if isinstance(slot, signature.InputView):
            raise ExportError(f"output {j} is input {slot.name} itself; a package computes its "
                              "outputs")
        if slot.complex:
            raise ExportError(f"output {j} is complex, which a package cannot hold")
    nodes = {n.name: n for n in gm.graph.nodes}
    return [nodes[slot.name] for slot in sig.outputs]


def _device(inputs):
    """The one device of the model's inputs and weights: the CPU or one CUDA device."""
    devices = {}
    for node, kind, name, value in inputs:
        val = node.meta.get("val") if value is None else value
        devices.setdefault(val.device, name)
    if len(devices) > 1:
        named = ", ".join(f"{name} on {d}" for d, name in devices.items())
        raise ExportError(f"the model's inputs and weights are on {len(devices)} devices "
                          f"({named}); a package runs on one")
    device = next(iter(devices), torch.device("cpu"))
    if device.type == "cuda":
        device = torch.device("cuda", device.index if device.index is not None
                              else torch.cuda.current_device())
        why = cuda_support.unavailable_reason(device)
        if why:
            raise ExportError(f"braze cannot compile for {device}: {why}")
    elif device.type != "cpu":
        raise ExportError(f"{next(iter(devices.values()))} is on {device}: braze.export "
                          "writes CPU and CUDA packages")
    return device


def _cpu_target(opts):
    """What a CPU package's manifest says of its target, and the vendor libraries it may link."""
    return {"lines": ["device cpu", f"target cpu-{platform.machine()}-{os.cpu_count()}cores",
                      "isa " + " ".join(_C.cpu_features())],
            "vendors": [cpu_support.blas_library() if opts.blas else None,
                        cpu_support.dnnl_library() if opts.dnnl else None],
            "format": CPU_FORMAT_VERSION}


def _cuda_target(compiled, device):
    """A CUDA package's manifest records for `compiled` (on `device`): its architecture, its
    cubins (the kernels deferred to their first launch compiled now), its kernels, and the
    libraries it calls; and the cubins to copy."""
    files = compiled.cuda_package_files()
    props = torch.cuda.get_device_properties(device)
    cc = props.major * 10 + props.minor
    lines = [f"device cuda {cc}", f"target cuda-sm{cc}-{props.multi_processor_count}sms"]
    lines += [f"kernel {k}" for k in files["kernels"]]
    for lib in ("cublaslt", "cudnn"):
        if files[lib]:
            path = files[lib]  # a bare file name stays one: the loader's path finds it
            lines.append(f"cuda-library {lib} "
                         f"{os.path.realpath(path) if os.path.isabs(path) else path}")
    if files["checks_indices"]:
        lines.append("checks-indices")
    return {"lines": lines, "vendors": [], "cubins": files["cubins"], "format": FORMAT_VERSION}


def _write_archive(path, write):
    """The package as one file: `write` makes the package directory, which goes into a zip
    archive of stored (uncompressed) entries at `path`, so that the runtime reads it with no
    compression library (runtime/PackageArchive.h)."""
    import zipfile
    path = os.path.abspath(path)
    if os.path.isdir(path):
        raise ExportError(f"{path} is a directory; a package archive is a file")
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".braze-export-", dir=parent)
    try:
        pkg = os.path.join(work, "package")
        write(pkg)
        archive = os.path.join(work, "package.zip")
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as z:
            for root, dirs, files in os.walk(pkg):
                dirs.sort()
                for name in sorted(files):
                    full = os.path.join(root, name)
                    z.write(full, os.path.relpath(full, pkg))
        os.replace(archive, path)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _write_package(path, compiled, inputs, outputs, ep, target, bundle):
    """Writes the package into a fresh directory beside `path`, then puts it in place."""
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isfile(os.path.join(path, "package.txt")):
        if not os.path.isdir(path) or os.listdir(path):
            raise ExportError(f"{path} exists and is not a braze package; choose another path")
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".braze-export-", dir=parent)
    os.chmod(work, 0o755)
    try:
        lines = ["braze braze-0.1.0"] + target["lines"]
        library = compiled.library_path
        shutil.copyfile(library, os.path.join(work, "model.so"))
        lines.append(f"library model.so {_sha256(os.path.join(work, 'model.so'))}")
        lines.append(f"module-symbols {compiled.num_symbols}")
        with open(library, "rb") as f:
            linked = f.read()
        for i, cubin in enumerate(target.get("cubins", [])):
            os.makedirs(os.path.join(work, "kernels"), exist_ok=True)
            rel = os.path.join("kernels", f"{i}.cubin")
            shutil.copyfile(cubin, os.path.join(work, rel))
            lines.append(f"cubin {rel} {_sha256(os.path.join(work, rel))}")
        for lib in target["vendors"]:
            if not lib or os.path.basename(lib).encode() not in linked:
                continue  # not one the library links
            if bundle:
                os.makedirs(os.path.join(work, "lib"), exist_ok=True)
                rel = os.path.join("lib", os.path.basename(lib))
                shutil.copyfile(lib, os.path.join(work, rel))
                lines.append(f"vendor {rel} {_sha256(os.path.join(work, rel))}")
            else:
                lines.append(f"vendor-path {os.path.realpath(lib)}")
        # Weights: largest elements first, so that each starts aligned to its element size.
        weights = [(name, value) for _, kind, name, value in inputs if kind == "weight"]
        for name, value in weights:
            _dtype(value.dtype, name)
            if value.is_complex():
                raise ExportError(f"{name} is complex, which a package cannot hold")
        ordered = sorted(weights, key=lambda w: -w[1].element_size())
        start, offsets = _write_safetensors(
            os.path.join(work, "weights.safetensors"),
            [(n, v.permute(_memory_order(v)).cpu()) for n, v in ordered])
        lines.append(f"weights weights.safetensors "
                     f"{_sha256(os.path.join(work, 'weights.safetensors'))} {start}")
        used = set()
        for node, kind, name, value in inputs:
            val = node.meta["val"]
            for d in val.shape:
                if isinstance(d, torch.SymInt) and not d.node.expr.is_number:
                    used |= {s for s in d.node.expr.free_symbols}
        for sym in sorted(used, key=str):
            r = ep.range_constraints.get(sym)
            lo, hi = _bound(r.lower if r is not None else None, 0), \
                _bound(r.upper if r is not None else None, _LARGE)
            lines.append(f"symbol {sym} {lo} {min(hi, _LARGE)}")
        strided = False
        for node, kind, name, value in inputs:
            val = node.meta["val"] if value is None else value
            dims = [_dim(d) for d in val.shape]
            record = f"input {name} {_dtype(val.dtype, name)} {len(dims)} {' '.join(dims)}".rstrip()
            if kind == "user":
                # One exported in another layout (channels-last), with static sizes, is taken
                # in it: say so, so that a call in another layout is an error naming it.
                strides = ""
                if not val.is_contiguous() and all(isinstance(st, int) for st in val.stride()):
                    strides = " strides " + " ".join(str(st) for st in val.stride())
                    strided = True
                lines.append(f"{record} user{strides}")
            else:
                begin, end = offsets[name]
                strides = ""
                if not val.is_contiguous():
                    strides = " strides " + " ".join(str(st) for st in val.stride())
                    strided = True
                lines.append(f"{record} weight {begin} {end}{strides}")
        for j, o in enumerate(outputs):
            val = o.meta["val"]
            dims = [_dim(d) for d in val.shape]
            lines.append(f"output {o.name} {_dtype(val.dtype, f'output {j}')} {len(dims)} "
                         f"{' '.join(dims)}".rstrip())
        import hashlib
        # Strides records came with format 2, as CUDA packages did.
        version = FORMAT_VERSION if strided else target["format"]
        body = "\n".join([f"braze-package {version}"] + lines) + "\n"
        body += f"checksum {hashlib.sha256(body.encode()).hexdigest()}\n"
        with open(os.path.join(work, "package.txt"), "w") as f:
            f.write(body)
        old = None
        if os.path.exists(path):
            old = path + f".old-{os.getpid()}"
            os.rename(path, old)
        os.rename(work, path)
        work = None
        if old:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if work:
            shutil.rmtree(work, ignore_errors=True)


class Loaded:
    """A package loaded from Python: called with tensors on the package's device (read in place
    through DLPack), it returns its outputs (one tensor, or a tuple of them). A CPU package's
    outputs are tensors over the runtime's memory; a CUDA package's are allocated by PyTorch and
    written on the current stream, by a CUDA graph from an input layout's second call on
    (`cuda_graphs`: None follows BRAZE_CUDA_GRAPHS; see `cuda_graph_stats`)."""

    def __init__(self, path, device=None, cuda_graphs=None):
        self.path = path
        index = torch.device(device).index if isinstance(device, (str, torch.device)) else device
        self.package = _C.Package.load(os.path.abspath(path), index or 0,
                                       True if cuda_graphs is None else bool(cuda_graphs))
        self.signature = self.package.signature
        kind, index = self.package.device
        self.device = torch.device(kind, index) if kind == "cuda" else torch.device("cpu")
        names = {package: t for t, (package, _) in _DTYPES.items()}
        self._out_dtypes = [names[o["dtype"]] for o in self.signature["outputs"]]
        self._layouts = {}

    def __call__(self, *inputs):
        for i, x in enumerate(inputs):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"input {i} is a {type(x).__name__}, not a tensor")
        xs = [x.detach() for x in inputs]
        if self.device.type == "cuda":
            # The outputs' layouts follow from the inputs' sizes and strides: bound once per
            # such key (run_into checks every call's inputs again).
            key = tuple((tuple(x.shape), x.stride()) for x in xs)
            layouts = self._layouts.get(key)
            if layouts is None:
                layouts = self._layouts[key] = self.package.output_layouts(xs)
            outs = [torch.empty_strided(shape, strides, dtype=dtype, device=self.device)
                    for (shape, strides), dtype in zip(layouts, self._out_dtypes)]
            self.package.run_into(xs, outs, torch.cuda.current_stream(self.device).cuda_stream)
        else:
            outs = self.package.run(xs)
            outs = [torch.from_dlpack(o) if not isinstance(o, torch.Tensor) else o for o in outs]
        return outs[0] if len(outs) == 1 else tuple(outs)

    @property
    def cuda_graph_stats(self):
        """{captures, replays, uncaptured, off}: the CUDA graphs this package made and ran, and
        why it makes none (off), if so."""
        return self.package.cuda_graph_stats


def load(path, device=None, cuda_graphs=None):
    """The package braze.export wrote to `path` (a directory or a .zip archive), as a callable
    on tensors of its device: the CPU, or for a CUDA package CUDA device `device` (default 0).
    A CUDA package replays CUDA graphs unless `cuda_graphs` is False or BRAZE_CUDA_GRAPHS=0."""
    return Loaded(path, device, cuda_graphs)
