"""The verifier: is a candidate a correct Triton implementation of a KernelBench-style problem?

    from extensions.verify import VerifyRequest, verify_candidate, verify_batch, summarize_results
    from extensions.verify import VerifierSession   # submit candidates as they come, judged meanwhile

Importing the package is light (no torch); the API loads what it needs when called. The command
line is ``python -m extensions.verify`` (see ``docs/verifier.md``).
"""
from __future__ import annotations

from typing import Any

__all__ = ["VerifyRequest", "VerifierSession", "verify_candidate", "verify_batch", "summarize_results",
           "VerifierError"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'extensions.verify' has no attribute {name!r}")
