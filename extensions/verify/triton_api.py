"""Import path kept for callers outside the verifier (data canonicalisation); the code lives in
``static/triton_api.py``, with the rest of the static policy."""
from __future__ import annotations

from .static.triton_api import TRITON_LANGUAGE_API, triton_name_allowed

__all__ = ["TRITON_LANGUAGE_API", "triton_name_allowed"]
