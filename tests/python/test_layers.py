"""The layer table of ARCHITECTURE.md, checked over the `#include "braze/..."` lines of src/braze:
each folder includes only itself and the layers it may use. `ir/types` holds what both IRs share
(dtypes, TensorType, the elementwise op list), so that `ir/loop` does not include `ir/graph`;
`runtime` includes no compiler header; the Python module reaches the JIT only through `driver`."""
import os
import re

import pytest

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src", "braze")

IR = {"ir/sym", "ir/types", "ir/graph", "ir/loop"}

# The layers each folder may include besides itself (the table's "may use", with what those
# layers may use in turn; `driver` may use everything, which its users do not inherit).
MAY_USE = {
    "support": set(),
    "ir/sym": {"support"},
    "ir/types": {"ir/sym", "support"},
    "ir/graph": {"ir/types", "ir/sym", "support"},
    "ir/loop": {"ir/types", "ir/sym", "support"},
    "target": {"support"},
    "passes": IR | {"target", "support"},
    "lowering": IR | {"passes", "target", "support"},
    "scheduler": IR | {"target", "support"},
    "codegen": IR | {"scheduler", "target", "support"},
    "runtime": {"support"},
    "jit": IR | {"codegen", "scheduler", "runtime", "target", "support"},
    "driver": IR | {"passes", "lowering", "scheduler", "codegen", "jit", "runtime", "target",
                    "support"},
    # The driver's API takes graphs: the module builds them, and runs what the driver returns.
    "python": {"driver", "runtime", "ir/graph", "ir/types", "ir/sym", "support"},
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"braze/([^"]+)"', re.M)


def _layer(path):
    """The layer of a path under src/braze (or of an included "braze/..." path)."""
    parts = path.replace(os.sep, "/").split("/")
    return "/".join(parts[:2]) if parts[0] == "ir" else parts[0]


def _sources():
    """(path under src/braze, text) of every source file in a layer folder."""
    for root, _, files in os.walk(SRC):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), SRC).replace(os.sep, "/")
            if f.endswith((".h", ".cpp", ".def")) and "/" in rel:
                with open(os.path.join(root, f), encoding="utf-8") as text:
                    yield rel, text.read()


def violations(sources):
    """One line per include of a layer its file's folder may not use."""
    bad = []
    for rel, text in sources:
        own = _layer(rel)
        for included in INCLUDE.findall(text):
            layer = _layer(included)
            if layer != own and layer not in MAY_USE.get(own, set()):
                bad.append(f"{rel} includes braze/{included} ({own} may not use {layer})")
    return bad


def test_every_folder_is_a_known_layer():
    layers = {_layer(rel) for rel, _ in _sources()}
    assert layers <= set(MAY_USE), f"folders missing from the layer table: {layers - set(MAY_USE)}"


def test_includes_follow_the_layer_table():
    bad = violations(_sources())
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path, include", [
    ("ir/loop/LoopIR.h", "ir/graph/Graph.h"),
    ("runtime/CudaModule.cpp", "codegen/cuda/CudaCodegen.h"),
    ("python/Module.cpp", "jit/Nvrtc.h"),
    ("scheduler/Fusion.cpp", "lowering/to_loops/ToLoops.h"),
])
def test_a_forbidden_include_is_reported(path, include):
    bad = violations([(path, f'#include "braze/{include}"\n')])
    assert len(bad) == 1 and include in bad[0]

