"""The one exception of canonicalisation: a row it cannot rewrite, with the reason it is counted under."""
from __future__ import annotations


class CanonicalizeError(Exception):
    """``reason`` is a short name (``unsupported_grid:SplitScanGrid``) counted in prepare_report."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
