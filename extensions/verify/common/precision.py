"""The backend numerics the verifier fixes in its own processes.

An fp32 problem is judged at fp32's tolerances, so its reference must be fp32 too: cuDNN's
convolutions default to TF32 (operands rounded to 10 bits), which put a convolution's reference
five times the tolerance off its fp64 run on an H100 and rejected every correct fp32 kernel. The
reference process turns TF32 off for GEMMs and convolutions alike.

The timed baseline runs in the candidate's process, where the candidate's module may assign
these switches at import (``policy.ASSIGNABLE_TORCH_SETTINGS``): cuDNN's TF32 off or its
deterministic algorithms made the baseline convolution twice as slow and the speedup twice as
large. The worker takes the settings before the candidate is imported and puts them back before
timing.
"""
from __future__ import annotations

import ast

# (namespace under torch.backends, attribute): every switch a candidate may assign.
SWITCHES = (
    ("cuda.matmul", "allow_tf32"),
    ("cudnn", "allow_tf32"),
    ("cuda.matmul", "allow_fp16_reduced_precision_reduction"),
    ("cuda.matmul", "allow_bf16_reduced_precision_reduction"),
    ("cudnn", "benchmark"),
    ("cudnn", "deterministic"),
)


def _namespace(path: str):
    import torch

    namespace = torch.backends
    for part in path.split("."):
        namespace = getattr(namespace, part)
    return namespace


def pin_ieee_fp32() -> dict[str, bool]:
    """TF32 off for GEMMs and convolutions (through the switches a candidate would use, so that
    the two APIs torch keeps never disagree); returns every switch's value afterwards."""
    _namespace("cuda.matmul").allow_tf32 = False
    _namespace("cudnn").allow_tf32 = False
    return backend_settings()


def backend_settings() -> dict[str, bool]:
    return {f"{path}.{name}": bool(getattr(_namespace(path), name)) for path, name in SWITCHES}


def restore(settings: dict[str, bool]) -> list[str]:
    """Put ``settings`` back; the names of the switches that had changed since they were taken."""
    changed = []
    for path, name in SWITCHES:
        key = f"{path}.{name}"
        if key not in settings:
            continue
        try:
            current = bool(getattr(_namespace(path), name))
        except RuntimeError:  # torch's two TF32 APIs set to disagree: reading raises
            current = None
        if current != settings[key]:
            setattr(_namespace(path), name, settings[key])
            changed.append(key)
    return changed


# Put before a value mismatch of an fp32 output when the candidate multiplies at TF32 (first: an
# error line is cut at ``redact.MAX_LINE`` characters).
TF32_HINT = 'tl.dot at TF32, its fp32 default (pass input_precision="ieee"): '


def dots_at_tf32(code: str) -> bool:
    """Whether ``code`` calls ``tl.dot`` at TF32 for sure: a ``.dot(a, b, ...)`` call without
    ``input_precision`` (or with "tf32") and without ``allow_tf32=False``. A precision passed as a
    variable cannot be told and does not count."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "dot" and len(node.args) >= 2):
            continue
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        precision = keywords.get("input_precision")
        allow = keywords.get("allow_tf32")
        if precision is not None:
            if isinstance(precision, ast.Constant) and precision.value == "tf32":
                return True
            continue
        if allow is None or (isinstance(allow, ast.Constant) and allow.value is True):
            return True
    return False
