"""Import path kept for callers outside the verifier (data preparation); the code lives in
``common/problem_constants.py``, shared by the reference builder and the sandboxed worker."""
from __future__ import annotations

from .common.problem_constants import (SizeConstant, find_scalar_constants, find_size_constants,
                                       rewrite_constants, varied_scalar)

__all__ = ["SizeConstant", "find_scalar_constants", "find_size_constants", "rewrite_constants", "varied_scalar"]
