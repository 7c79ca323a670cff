"""Where rows come from: the Hugging Face hub, local files, or the project's bundled set.

Every reader yields ``SourceRow``s: either a decoded row (a dict) or the named reason it could not
be decoded, with the line number, so bad lines are counted rather than fatal. A source that is
missing or unreadable as a whole raises ``SourceError`` naming it.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from ..runtime.io import file_sha256
from . import rejections as R

log = logging.getLogger(__name__)

BUNDLED = "bundled"
NONE = "none"
LOCAL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet")
KERNELBENCH_HUB_SPLITS = {level: f"level_{level}" for level in (1, 2, 3, 4)}


class SourceError(RuntimeError):
    """A source that cannot be read at all (missing file, unknown format, hub failure)."""


@dataclass
class SourceRow:
    index: int  # 1-based position in the source (the line number for JSONL)
    row: Optional[dict[str, Any]] = None
    rejected: Optional[str] = None  # a rejection reason when the row could not be decoded
    detail: str = ""


def is_local(spec: str) -> bool:
    """A local file is named by its suffix; anything else is a hub dataset id."""
    return spec.lower().endswith(LOCAL_SUFFIXES)


def _read_jsonl(path: Path) -> Iterator[SourceRow]:
    import gzip

    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                log.warning("%s line %d: undecodable bytes (%s)", path, number, exc.reason)
                yield SourceRow(number, rejected=R.UNDECODABLE_BYTES, detail=str(exc))
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                log.warning("%s line %d: malformed JSON (%s)", path, number, exc.msg)
                yield SourceRow(number, rejected=R.MALFORMED_JSON, detail=exc.msg)
                continue
            if not isinstance(row, dict):
                yield SourceRow(number, rejected=R.NOT_AN_OBJECT, detail=type(row).__name__)
                continue
            yield SourceRow(number, row=row)


def _read_json(path: Path) -> Iterator[SourceRow]:
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SourceError(f"{path}: not a readable JSON file ({exc})") from None
    if isinstance(data, dict):
        # {"column": [values...], ...} as written by pandas' to_json(orient="columns"/"list")
        lists = {k: v for k, v in data.items() if isinstance(v, list)}
        if lists and len(lists) == len(data) and len({len(v) for v in lists.values()}) == 1:
            count = len(next(iter(lists.values())))
            data = [{k: v[i] for k, v in lists.items()} for i in range(count)]
        elif isinstance(data.get("rows"), list):
            data = data["rows"]
    if not isinstance(data, list):
        raise SourceError(f"{path}: expected a JSON array of row objects")
    for number, row in enumerate(data, start=1):
        if isinstance(row, dict):
            yield SourceRow(number, row=row)
        else:
            yield SourceRow(number, rejected=R.NOT_AN_OBJECT, detail=type(row).__name__)


def _read_parquet(path: Path) -> Iterator[SourceRow]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise SourceError(f"{path}: not a readable parquet file ({exc})") from None
    number = 0
    for batch in parquet.iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            number += 1
            yield SourceRow(number, row=row)


def read_local(spec: str) -> Iterator[SourceRow]:
    path = Path(spec).expanduser()
    if not path.is_file():
        raise SourceError(f"data source {spec!r}: file not found")
    suffix = ".jsonl.gz" if path.name.lower().endswith(".jsonl.gz") else path.suffix.lower()
    readers = {".jsonl": _read_jsonl, ".jsonl.gz": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet}
    if suffix not in readers:
        raise SourceError(f"data source {spec!r}: unsupported file type {suffix!r} (use .jsonl, .jsonl.gz, .json or .parquet)")
    return readers[suffix](path)


def _read_hub(dataset_id: str, split: str) -> Iterator[SourceRow]:
    try:
        import datasets

        dataset = datasets.load_dataset(dataset_id, split=split)
    except Exception as exc:  # network, auth, missing split: all mean the source is unusable
        raise SourceError(f"hub dataset {dataset_id!r} split {split!r} could not be loaded: {exc}") from None
    for number, row in enumerate(dataset, start=1):
        yield SourceRow(number, row=dict(row))


def source_specs(spec: str) -> list[str]:
    """The sources a spec names: several are joined by commas (KernelBook from the hub and pairs of
    one's own, say), read in that order as one source."""
    return [part.strip() for part in spec.split(",") if part.strip()] or [spec]


def read_kernelbook(spec: str) -> Iterator[SourceRow]:
    """KernelBook rows from ``bundled``, a local file, or a hub dataset id (split ``train``), or from
    several of these joined by commas; rows are numbered across them in order."""
    specs = source_specs(spec)
    if len(specs) > 1:
        readers = [read_kernelbook(one) for one in specs]  # a missing file fails before any row is read

        def joined() -> Iterator[SourceRow]:
            index = 0
            for rows in readers:
                for item in rows:
                    index += 1
                    yield dataclasses.replace(item, index=index)

        return joined()
    if spec == BUNDLED:
        from .bundled import bundled_pairs

        return (SourceRow(i, row=row) for i, row in enumerate(bundled_pairs(), start=1))
    if is_local(spec):
        return read_local(spec)
    return _read_hub(spec, "train")


def read_kernelbench(spec: str, levels: list[int]) -> Iterator[SourceRow]:
    """KernelBench rows (level, problem_id, name, code) from a local JSONL or the hub."""
    if spec == NONE:
        return iter(())
    if is_local(spec):
        return read_local(spec)

    def hub_rows() -> Iterator[SourceRow]:
        number = 0
        for level in levels:
            if level not in KERNELBENCH_HUB_SPLITS:
                raise SourceError(f"KernelBench has no level {level}")
            for item in _read_hub(spec, KERNELBENCH_HUB_SPLITS[level]):
                number += 1
                yield SourceRow(number, row=item.row)

    return hub_rows()


def source_identity(spec: str) -> dict[str, Any]:
    """What identifies a source's content for the up-to-date check."""
    specs = source_specs(spec)
    if len(specs) > 1:
        return {"specs": [source_identity(one) for one in specs]}
    if spec == NONE:
        return {"spec": spec}
    if spec == BUNDLED:
        from .bundled import bundled_fingerprint

        return {"spec": spec, "sha256": bundled_fingerprint()}
    if is_local(spec):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise SourceError(f"data source {spec!r}: file not found")
        stat = path.stat()
        return {"spec": str(path.resolve()), "size": stat.st_size, "sha256": file_sha256(path)}
    # A hub dataset is identified by its id; pass --force to pick up a new upstream revision.
    return {"spec": spec, "hub": True}
