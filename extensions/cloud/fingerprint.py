"""Size, sha256 and S3 ETag of a local file, read once per change.

The ETag S3 reports for an object uploaded by this project (SSE-S3 or no encryption) is the md5 of
the bytes, or for a multipart upload md5(concatenated part md5s) + "-N". With the part size fixed by
the config, the ETag of a local file can be computed and compared with a bucket listing: no local
sync-state file to lose or corrupt, and a fresh machine knows at once what is already uploaded.
"""
from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path

_MAX_PARTS = 10_000  # S3's limit; boto3 doubles the part size until a file fits


@dataclass(frozen=True)
class Fingerprint:
    size: int
    mtime_ns: int
    sha256: str
    etag: str


def part_size_for(size: int, chunk: int) -> int:
    """The part size boto3's transfer manager uses for a file of ``size`` bytes."""
    part = max(chunk, 5 * 1024 * 1024)
    while -(-size // part) > _MAX_PARTS:
        part *= 2
    return part


def compute_fingerprint(path: Path, chunk: int, threshold: int) -> Fingerprint:
    stat = os.stat(path)
    sha = hashlib.sha256()
    whole_md5 = hashlib.md5()
    part_md5s: list[bytes] = []
    multipart = stat.st_size >= threshold
    part = part_size_for(stat.st_size, chunk)
    with open(path, "rb") as handle:
        while block := handle.read(part):
            sha.update(block)
            if multipart:
                part_md5s.append(hashlib.md5(block).digest())
            else:
                whole_md5.update(block)
    if multipart:
        etag = f"{hashlib.md5(b''.join(part_md5s)).hexdigest()}-{len(part_md5s)}"
    else:
        etag = whole_md5.hexdigest()
    return Fingerprint(stat.st_size, stat.st_mtime_ns, sha.hexdigest(), etag)


class FingerprintCache:
    """Fingerprints keyed by path, recomputed only when size or mtime changed."""

    def __init__(self, chunk: int, threshold: int):
        self.chunk = chunk
        self.threshold = threshold
        self._known: dict[str, Fingerprint] = {}
        self._lock = threading.Lock()

    def get(self, path: Path) -> Fingerprint:
        stat = os.stat(path)
        key = str(path)
        with self._lock:
            known = self._known.get(key)
        if known and known.size == stat.st_size and known.mtime_ns == stat.st_mtime_ns:
            return known
        fresh = compute_fingerprint(path, self.chunk, self.threshold)
        with self._lock:
            self._known[key] = fresh
        return fresh

    def unchanged_since(self, path: Path, fingerprint: Fingerprint) -> bool:
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            return False
        return stat.st_size == fingerprint.size and stat.st_mtime_ns == fingerprint.mtime_ns
