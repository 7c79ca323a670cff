"""What a worker reported, written into the verdict: the first failure, the flags it raised (by
known name only), the redacted last line of its stderr and its status files, read with a size cap.

Everything here reads data the candidate's process wrote, so nothing passes through verbatim.
"""
from __future__ import annotations

import json
import os

from ..common.tensor_io import TensorIOError
from ..result import VerifyResult
from ..reward import ADVISORY_FLAGS, CHEATING_FLAGS, is_cheating
from .redact import category_error, redact_line, safe_name

_MAX_STATUS_BYTES = 1 << 20
# Words in a worker's error that mean an allocation was refused by the memory cap.
_MEMORY_ERRORS = ("MemoryError", "not enough memory", "can't allocate memory", "Cannot allocate memory",
                  "std::bad_alloc")
# The C++ profiler the audit runs logs each start/stop on stderr; those lines never explain a failure.
_PROFILER_LOG_PREFIXES = ("USDT:", "STAGE:")


def tail_line(text: str) -> str:
    """The last non-empty line of a worker's stderr that is not the profiler's own log, redacted
    (the candidate wrote it)."""
    lines = [line.strip() for line in text.strip().splitlines()
             if line.strip() and not line.startswith(_PROFILER_LOG_PREFIXES)]
    return redact_line(lines[-1]) if lines else ""


def fail(result: VerifyResult, stage: str, category: str, detail=None) -> None:
    """Record the first failure: ``<stage>: <category>[: <redacted detail>]``."""
    if result.error is None:
        result.error = category_error(stage, category, detail)
        result.error_category = category


def _exception_category(message) -> str:
    text = str(message)
    return "memory_limit" if any(word in text for word in _MEMORY_ERRORS) else "exception"


def status_failure(result: VerifyResult, label: str, status: dict) -> None:
    """A worker's failed status: a file the parent wrote was altered (the sandbox failed, never
    the candidate's doing), the audit's verdict (its flags are already in ``result``), or the
    candidate's exception."""
    if status.get("sandbox_error"):
        fail(result, label, "sandbox", status.get("error"))
    elif is_cheating(result.flags):
        fail(result, label, "audit", status.get("error"))
    else:
        fail(result, label, _exception_category(status.get("error")), status.get("error"))


def read_status(path: str) -> dict:
    if os.path.getsize(path) > _MAX_STATUS_BYTES:
        raise TensorIOError("worker status file too large")
    with open(path) as fh:
        data = json.load(fh)
    if not isinstance(data, dict):
        raise TensorIOError("worker status is not an object")
    return data


_KNOWN_FLAGS = CHEATING_FLAGS | ADVISORY_FLAGS


def add_flags(result: VerifyResult, flags) -> None:
    """Flags from a worker's status: only names the verifier knows pass (a status file is written
    in the candidate's process, so an unknown string could carry anything out)."""
    for flag in flags if isinstance(flags, list) else []:
        flag = flag if isinstance(flag, str) and flag in _KNOWN_FLAGS else "unrecognised_flag"
        if flag not in result.flags:
            result.flags.append(flag)


def audit_summary(flags: list[str], status: dict) -> str:
    cheating = [f for f in flags if f in CHEATING_FLAGS]
    ops = status.get("disallowed_ops")
    ops = ops if isinstance(ops, list) else []
    text = ", ".join(cheating)
    if ops:
        text += f" (ops: {', '.join(safe_name(o) for o in ops[:4])})"
    return text
