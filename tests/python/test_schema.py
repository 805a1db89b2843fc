"""The op schema of Ops.def, as Python sees it."""
import braze


def test_op_kinds_and_schemas_reach_python():
    """Ops.def's op kinds are a Python enum, each with its schema."""
    kinds = list(braze._C.OpKind.__members__.values())
    assert len(kinds) > 100
    assert braze._C.op_name(braze._C.OpKind.AttentionGrad) == "attention_grad"
    lo, hi, attrs = braze._C.op_schema(braze._C.OpKind.Concat)
    assert (lo, hi, attrs) == (1, -1, [("dim", "an integer", False)])
    lo, hi, attrs = braze._C.op_schema(braze._C.OpKind.Scatter)
    assert (lo, hi) == (3, 3) and ("max_hits", "an integer", True) in attrs
