"""braze: a deep-learning compiler in C++.

    import torch
    fast = torch.compile(model, backend="braze")

The backend name is registered through the `torch_dynamo_backends` entry point, so importing
braze is not needed for `backend="braze"`; importing it does not register the name again.
"""
from braze._C import CompileError, InternalError, RunError
from braze.backend import (Options, braze_backend, compile_times, counters,
                           fallback_ops_by_op, run_and_get_code)
from braze.package import ExportError, export, load
from braze.accuracy import reports as accuracy_reports
from braze.report import write as write_report

__all__ = [
    "accuracy_reports",
    "CompileError",
    "ExportError",
    "InternalError",
    "RunError",
    "Options",
    "braze_backend",
    "compile_times",
    "counters",
    "export",
    "fallback_ops_by_op",
    "load",
    "run_and_get_code",
    "write_report",
]
