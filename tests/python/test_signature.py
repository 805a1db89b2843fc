"""The graph signature (braze/signature.py): how each output of a compiled graph is made, as
data and as printed, and a compiled call made through it equal to eager, views sharing storage
as eager's do."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import braze
from braze import signature, support
from braze.signature import (Base, BaseView, Computed, InputView, NoOutput, SharedStorage,
                             ViewStep)

aten = torch.ops.aten


def _views(x, w):
    qkv = x @ w  # a fused projection: its slices are K and V
    y = torch.relu(x)
    return x, x.t().unsqueeze(0), None, qkv[:, :4] * 2, qkv[:, 4:8], qkv[:, 8:], y, y.t()


def _computed(x, img):
    return (torch.complex(x, x * 2), (img * 2).contiguous(memory_format=torch.channels_last),
            (x + 1).t(), torch.as_strided(x + 2, (3, 2), (4, 2)))


def _signature(f, *args, mode="fake"):
    gm = make_fx(f, tracing_mode=mode)(*args)
    return gm, support.translate_whole(gm)[1]


def _compiled(gm, device):
    fn, _ = braze.backend._compile_whole(
        gm, braze.backend.Options(),
        device=torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else None)
    return fn


@pytest.mark.cpu_only("the signature is device-independent data")
def test_outputs_made_as_views_are_classified_and_printed():
    _, sig = _signature(_views, torch.randn(3, 4), torch.randn(4, 12))
    transposed = InputView(0, "x_1", (ViewStep(aten.t.default, ()),
                                      ViewStep(aten.unsqueeze.default, (0,))))
    assert sig.outputs == (
        InputView(0, "x_1"), transposed, NoOutput(),
        Computed(0, "mul", torch.float32),
        BaseView(0, ((3, 4), (12, 1), 4)), BaseView(0, ((3, 4), (12, 1), 8)),
        SharedStorage(1, (3, 4), (4, 1), 0), SharedStorage(1, (4, 3), (1, 4), 0))
    assert sig.bases == (Base(1, "mm", torch.float32), Base(2, "relu", torch.float32))
    assert sig.tensor_positions == [0, 1] and sig.carried == [] and not sig.direct
    assert str(sig) == """\
inputs:
  0 x_1: tensor [3, 4] strides [4, 1]
  1 w_1: tensor [4, 12] strides [12, 1]
outputs:
  0: input 0 (x_1)
  1: input 0 (x_1).t.default().unsqueeze.default(0)
  2: None
  3: #0 mul float32
  4: base 0 as [3, 4] strides [12, 1] offset 4
  5: base 0 as [3, 4] strides [12, 1] offset 8
  6: base 1 shared as [3, 4] strides [4, 1] offset 0
  7: base 1 shared as [4, 3] strides [1, 4] offset 0
bases:
  0: #1 mm float32
  1: #2 relu float32"""


@pytest.mark.cpu_only("the signature is device-independent data")
def test_computed_outputs_record_their_dtype_and_layout():
    _, sig = _signature(_computed, torch.randn(3, 4), torch.randn(2, 3, 4, 5))
    assert sig.outputs == (
        Computed(0, "complex_1", torch.float32, complex=True),
        Computed(1, "clone", torch.float32, strides=(60, 1, 15, 3)),
        Computed(2, "t", torch.float32, strides=(1, 4)),
        Computed(3, "as_strided", torch.float32, layout=((3, 2), (4, 2))))
    assert sig.bases == () and not sig.direct
    assert str(sig) == """\
inputs:
  0 x_1: tensor [3, 4] strides [4, 1]
  1 img_1: tensor [2, 3, 4, 5] strides [60, 20, 5, 1]
outputs:
  0: #0 complex_1 float32 pairs, returned complex
  1: #1 clone float32, computed with strides [60, 1, 15, 3]
  2: #2 t float32, computed with strides [1, 4]
  3: #3 as_strided float32, laid out as [3, 2] strides [4, 2]"""


def test_a_compiled_call_makes_views_as_eager_does(device):
    x, w = torch.randn(3, 4), torch.randn(4, 12)
    gm, _ = _signature(_views, x, w)
    got, want = _compiled(gm, device)(x, w), _views(x, w)
    for a, e in zip(got, want):
        assert (a is None) == (e is None)
        if e is not None:
            assert a.shape == e.shape and a.stride() == e.stride()
            torch.testing.assert_close(a, e)

    def storage(t):
        return t.untyped_storage().data_ptr()
    assert got[0] is x and storage(got[1]) == storage(x)
    assert storage(got[4]) == storage(got[5]) != storage(got[3])
    assert storage(got[6]) == storage(got[7]) not in (storage(x), storage(got[4]))


def test_a_compiled_call_returns_complex_and_declared_layouts(device):
    x, img = torch.randn(3, 4), torch.randn(2, 3, 4, 5)
    gm, _ = _signature(_computed, x, img)
    for a, e in zip(_compiled(gm, device)(x, img), _computed(x, img)):
        assert a.dtype == e.dtype and a.shape == e.shape and a.stride() == e.stride()
        torch.testing.assert_close(a, e)


@pytest.mark.cpu_only("the signature is device-independent data")
def test_a_view_of_an_argument_the_graph_writes_is_computed():
    """A view of an argument is made of the argument at each call, unless the graph writes
    into that argument (a copy_ into it): then the view's value is the one before the write,
    which braze computes."""
    def f(x, w):
        return x @ w.t(), w.t()

    gm = make_fx(f)(torch.randn(3, 4), torch.randn(5, 4))
    values = {n: k for k, n in enumerate(gm.graph.nodes)}  # every node a braze tensor
    assert isinstance(signature.graph_signature(gm, values).outputs[1], InputView)
    w, mm = [n for n in gm.graph.nodes if n.name in ("w_1", "mm")]
    with gm.graph.inserting_before(next(iter(reversed(gm.graph.nodes)))):
        gm.graph.call_function(aten.copy_.default, (w, mm))
    written = signature.graph_signature(gm, values)
    assert written.outputs[1] == Computed(1, "t_1", torch.float32, strides=(1, 4))


@pytest.mark.cpu_only("the signature is device-independent data")
def test_a_view_step_reads_sizes_at_each_call():
    """A view of an argument by a symbolic size (an expand to another input's length) reads
    that size from each call's arguments, by position."""
    def f(x, y):
        return x.expand(y.shape[0], -1), y * 2

    _, sig = _signature(f, torch.randn(1, 4), torch.randn(5), mode="symbolic")
    assert str(sig.outputs[0]) == "input 0 (x_1).expand.default([sym_size.int(arg1, 0), -1])"
    x, y = torch.randn(1, 4), torch.randn(7)
    made = sig.outputs[0].make((x, y), [], [])
    assert made.shape == (7, 4) and made.untyped_storage().data_ptr() == x.data_ptr()
    assert torch.equal(made, x.expand(7, -1))


@pytest.mark.cpu_only("a package's signature is device-independent data")
def test_a_package_signature_makes_no_views():
    """For a package every output is computed (a package returns no views): a transpose of an
    input or a slice of a computed value is computed, and the input itself is named as such."""
    gm = make_fx(_views, tracing_mode="fake")(torch.randn(3, 4), torch.randn(4, 12))
    values = {n: k for k, n in enumerate(gm.graph.nodes)}
    sig = signature.graph_signature(gm, values, views=False)
    kinds = [type(s).__name__ for s in sig.outputs]
    assert kinds == ["InputView", "Computed", "NoOutput"] + ["Computed"] * 5
    assert sig.outputs[0] == InputView(0, "x_1") and sig.bases == ()
