"""What of a candidate's text may reach a verdict: fixed categories plus one short, redacted line.

A candidate controls its exception messages, its stderr, the strings in the status files its worker
writes and the names of its own classes. Any of them can carry what the candidate read (a file, an
environment value), so nothing it wrote is returned verbatim:

* ``redact_line`` keeps the first non-empty line, printable ASCII only, at most ``MAX_LINE`` chars,
  with absolute paths, long quoted strings, high-entropy tokens (keys, base64, hex) and every value
  of this process's environment that is long enough to be a secret replaced by placeholders;
* ``safe_name`` accepts identifiers only (flags, op names, exception types), anything else becomes
  ``?``;
* ``sanitize_data`` keeps numbers, booleans and safe names of a nested report, dropping other text.

Verdict errors read ``<stage>: <category>`` or ``<stage>: <category>: <redacted line>``; the
category alone is in ``VerifyResult.error_category``.
"""
from __future__ import annotations

import os
import re
from typing import Any

MAX_LINE = 160

# Why a candidate failed, in words a caller can switch on. The text after it is advisory.
ERROR_CATEGORIES = (
    "exception",      # the candidate raised (message redacted)
    "timeout",        # wall-clock limit reached; the whole process tree was killed
    "memory_limit",   # host memory above verifier.memory_limit_mb; killed
    "crashed",        # the worker died without a verdict (exit status, signal)
    "bad_output",     # forward returned something that cannot be compared (type, size, file)
    "mismatch",       # outputs differ from the reference
    "mutated_inputs",  # forward wrote into its inputs
    "audit",          # the runtime audit saw a cheating signal
    "timing",         # the timing stage failed
    "sandbox",        # the sandbox itself failed (not the candidate's fault)
    "problem",        # the reference could not be built
)

# An absolute path: a slash that starts a word ("NaN/Inf" is not a path).
_PATH = re.compile(r"(?<![\w.])(?:~|[A-Za-z]:)?(?:/[^\s/'\"(),:;]+)+/?")
# A long quoted string (often a file's or a variable's content): an opening quote (not an
# apostrophe inside a word) and 25+ characters, closed, or running to the end of a cut line.
_QUOTED = re.compile(r"(?<!\w)'[^']{25,}(?:'|$)|(?<!\w)\"[^\"]{25,}(?:\"|$)")
# A token long enough to hold a key (see ``_looks_like_key``).
_TOKEN = re.compile(r"[A-Za-z0-9+/=_\-]{20,}")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:\-]{0,63}$")
_MIN_SECRET_LEN = 6


def _looks_like_key(token: str) -> bool:
    """Keys, tokens and encoded blobs: one unbroken run of 32+ characters, or of 16+ mixing letters
    and digits. Identifiers made of short words (``readable_ancestors=0``) are not."""
    longest = max(re.split(r"[_\-=.]", token), key=len)
    if len(longest) >= 32:
        return True
    return len(longest) >= 16 and any(c.isdigit() for c in longest) and any(c.isalpha() for c in longest)


def _environment_values() -> list[str]:
    values = {v for v in os.environ.values() if len(v) >= _MIN_SECRET_LEN}
    return sorted(values, key=len, reverse=True)


def redact_line(text: Any, limit: int = MAX_LINE) -> str:
    """One line safe to return: see the module docstring. Empty when nothing is left."""
    if text is None:
        return ""
    text = str(text)
    # Environment values first, on the whole text, so a value split over lines is still found.
    for value in _environment_values():
        if value in text:
            text = text.replace(value, "<env>")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[0] if lines else ""
    line = "".join(c if 32 <= ord(c) < 127 else "?" for c in line[: 4 * limit])
    line = _QUOTED.sub("'<text>'", line)
    line = _PATH.sub("<path>", line)
    line = _TOKEN.sub(lambda m: "<redacted>" if _looks_like_key(m.group(0)) else m.group(0), line)
    if len(line) > limit:
        line = line[: limit - 3] + "..."
    return line


def safe_name(value: Any, limit: int = 64) -> str:
    """An identifier-like string (flag, op or exception type name) or ``?``."""
    text = str(value)
    if len(text) > limit or not _NAME.match(text) or any(v in text for v in _environment_values()):
        return "?"
    return text


def sanitize_data(value: Any, depth: int = 0) -> Any:
    """A nested report with numbers, booleans, None and safe names kept; other text dropped."""
    if depth > 6:
        return None
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        name = safe_name(value)
        return None if name == "?" else name
    if isinstance(value, (list, tuple)):
        return [sanitize_data(v, depth + 1) for v in list(value)[:64]]
    if isinstance(value, dict):
        kept = {}
        for key, item in list(value.items())[:64]:
            name = safe_name(key)
            if name != "?":
                kept[name] = sanitize_data(item, depth + 1)
        return kept
    return None


def category_error(stage: str, category: str, detail: Any = None) -> str:
    """``<stage>: <category>[: <redacted detail>]``."""
    if category not in ERROR_CATEGORIES:
        raise ValueError(f"unknown error category {category!r}")
    line = redact_line(detail) if detail is not None else ""
    return f"{stage}: {category}: {line}" if line else f"{stage}: {category}"
