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


def calling_convention_fixed(compiled):
    """AOTAutograd's module callable as its calling convention says. For a plain GraphModule it
    is `forward(*args)`, but functools.wraps copies the boxed runtime wrapper's `_boxed_call`
    onto it; Dynamo calls it unboxed regardless, while the minifier's accuracy check
    (run_fwd_maybe_bwd) reads the flag and calls it with one list, which the graph then takes
    as a single argument. The flag is dropped where the callable takes *args."""
    import inspect
    code = getattr(compiled, "__code__", None)
    if (code is not None and code.co_flags & inspect.CO_VARARGS
            and compiled.__dict__.get("_boxed_call")):
        del compiled._boxed_call
    return compiled
