"""The small file helpers every part of a run shares: atomic writes, a file's sha256, JSONL rows.

An atomic write goes to a hidden temporary file beside the target (``.<name>.tmp-<pid>``), is
flushed to disk, and replaces the target by a rename, so a reader (or a restore after a crash) sees
the old file or the new one, never half of one. JSONL readers differ in what a bad line means to
them (a count, a message, a silent skip), so ``read_jsonl`` reports each bad line to the caller
instead of deciding.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

_HASH_CHUNK = 1 << 20


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, obj: Any, *, indent: int = 2, sort_keys: bool = True,
                      default: Optional[Callable[[Any], Any]] = str) -> None:
    """``obj`` as indented JSON and a final newline. ``default=str`` writes what JSON cannot hold
    (paths, enums) as text; ``default=None`` refuses it instead."""
    atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys, default=default) + "\n")


def atomic_write_jsonl(path: Path, rows: Iterable[dict], *, ensure_ascii: bool = False) -> int:
    """One JSON object per line; returns the number of rows written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    count = 0
    with open(tmp, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=ensure_ascii) + "\n")
            count += 1
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return count


def file_sha256(path: Path, *, chunk: int = _HASH_CHUNK, progress: Optional[Callable[[int], None]] = None) -> str:
    """The file's sha256 (hex), read in ``chunk``-byte blocks; ``progress`` is told each block's size."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
            if progress:
                progress(len(block))
    return digest.hexdigest()


@dataclass(frozen=True)
class BadLine:
    """A non-blank JSONL line that is not a JSON object."""

    number: int  # 1-based
    json_error: Optional[str]  # the decoder's message when the line is not JSON at all
    value_type: Optional[str] = None  # the type of the JSON value when it is JSON but not an object


def read_jsonl(path: Path, on_bad_line: Optional[Callable[[BadLine], None]] = None, *,
               errors: str = "replace") -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for each JSON object line of ``path``; blank lines are skipped and
    every other line that is not an object goes to ``on_bad_line`` (skipped silently without one).
    ``errors``: how undecodable bytes are read ("replace"; "strict" raises UnicodeDecodeError)."""
    with open(path, encoding="utf-8", errors=errors) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                if on_bad_line is not None:
                    on_bad_line(BadLine(number, exc.msg))
                continue
            if not isinstance(row, dict):
                if on_bad_line is not None:
                    on_bad_line(BadLine(number, None, type(row).__name__))
                continue
            yield number, row
