"""What braze reads from PyTorch's compile stack about the graph it compiles, and which of the
exceptions raised while AOTAutograd traces it are Dynamo's own to act on."""
import torch
import torch._dynamo


def plain_inference():
    """True when AOTAutograd's runtime wrapper has nothing to do for the graph being compiled
    (no input mutation, no output aliasing an input or another output, no effect tokens), so
    an inference call may skip it."""
    from torch._functorch._aot_autograd.schemas import OutputType
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    if meta is None:
        return False
    try:
        return (not any(i.mutates_data or i.mutates_metadata for i in meta.input_info)
                and all(o.output_type == OutputType.non_alias for o in meta.output_info)
                and not meta.num_intermediate_bases and not getattr(meta, "tokens", None))
    except AttributeError:  # another PyTorch's metadata: keep its wrapper
        return False


def _dynamo_handles():
    """The exceptions Dynamo expects from a backend and acts on itself: it restarts its analysis,
    breaks the graph, skips the frame or reports an index error as eager would."""
    exc = torch._dynamo.exc
    handled = [exc.Unsupported, exc.SkipFrame, IndexError,
               *getattr(exc, "exceptions_allowed_to_be_fallback", ())]
    for name in ("TensorifyScalarRestartAnalysis", "ShortenTraceback", "RestartAnalysis"):
        if hasattr(exc, name):
            handled.append(getattr(exc, name))
    return tuple(handled)


DYNAMO_HANDLES = _dynamo_handles()
