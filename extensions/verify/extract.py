"""Import path kept for callers outside the verifier (data preparation, evaluation); the code lives
in ``static/extract.py``, with the rest of the static policy."""
from __future__ import annotations

from .static.extract import METHODS, Extraction, drop_docstrings, extract_code, normalize_code

__all__ = ["METHODS", "Extraction", "drop_docstrings", "extract_code", "normalize_code"]
