"""What a fetched model file is checked with: its sha256, and the error a mismatch raises.

Kept apart from the fetching code in the package's ``__init__`` so that ``convert.py``, which
checks converted directories the same way, needs nothing from the package that calls it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from ..runtime import io as run_io

# Larger blocks than the default: these files are several gigabytes.
HASH_CHUNK = 8 << 20


class ModelIntegrityError(RuntimeError):
    """An assembled or cached model file does not match its recorded size or sha256."""


def file_sha256(path: Path, progress: Optional[Callable[[int], None]] = None) -> str:
    return run_io.file_sha256(path, chunk=HASH_CHUNK, progress=progress)
